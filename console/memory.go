package console

import (
	"context"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// memoryMaxAge is how long the overview shows a stream's memory
// measurement before measuring again: a measurement takes up to a few
// hundred Redis commands (redisstats.MeasureMemory), too many for every page
// load.
const memoryMaxAge = time.Minute

// memoryView is the overview's Redis memory section of one stream
// (docs/operations.md#memory-budget).
type memoryView struct {
	// Problem says why there is no measurement (no +memory or +info, Redis
	// down); the rest is then empty.
	Problem  string
	M        stats.Memory
	R        stats.Retentions
	Parts    []memoryPart
	Over     bool
	Verdict  string
	Measured time.Time
}

// memoryPart is one row of the section.
type memoryPart struct {
	Name      string
	P         stats.Part
	Kept      string
	Estimated bool // Items is scaled from a partial scan
}

// memoryCache keeps each stream's last measurement for memoryMaxAge.
type memoryCache struct {
	mu sync.Mutex
	by map[string]memoryView
}

// streamMemory returns stream's memory view, measuring when the last
// measurement is older than memoryMaxAge, failed, or disagrees with now,
// what the overview read of the stream just before: a stream or a
// dead-letter queue holding less than half of what was measured was
// reset (Redis lost its data), trimmed or emptied, and the measurement
// would show what is gone.
func (s *Server) streamMemory(ctx context.Context, rc rueidis.Client, stream string, now streamView) memoryView {
	s.memory.mu.Lock()
	defer s.memory.mu.Unlock() // one measurement at a time
	if v, ok := s.memory.by[stream]; ok && v.Problem == "" && time.Since(v.Measured) < memoryMaxAge && !v.shrunk(now) {
		return v
	}
	delete(s.memory.by, stream)
	r := s.cfg.retentions()
	m, err := redisstats.MeasureMemory(ctx, rc, stream, s.cfg.Group, r, stats.Budget{})
	if err != nil {
		return memoryView{Problem: "measuring Redis memory failed: " + err.Error()}
	}
	kept := func(d time.Duration, zero string) string {
		if d > 0 {
			return d.String()
		}
		return zero
	}
	v := memoryView{M: m, R: r, Over: m.Pressure(stats.BudgetShare), Verdict: m.Verdict(stats.BudgetShare), Measured: time.Now(),
		Parts: []memoryPart{
			{Name: "source stream", P: m.Stream, Kept: kept(r.Stream, "forever")},
			{Name: "dead-letter stream", P: m.DLQ, Kept: kept(r.DLQ, "forever")},
			{Name: "invocation state", P: m.Invocations, Kept: kept(r.Invocation, "0 (deleted at ack)"), Estimated: m.Sampled},
			{Name: "other relay keys", P: m.Other, Kept: "-", Estimated: m.Sampled},
		}}
	if s.memory.by == nil {
		s.memory.by = map[string]memoryView{}
	}
	s.memory.by[stream] = v
	return v
}

// shrunk reports whether the stream or its dead-letter queue, as the
// overview read them now, hold less than half the items v measured.
func (v memoryView) shrunk(now streamView) bool {
	less := func(read bool, n, measured int64) bool { return read && n < measured/2 }
	return less(now.Read.Length, now.Length, v.M.Stream.Items) || less(now.Read.DLQ, now.DLQ, v.M.DLQ.Items)
}

// forgetMemory drops stream's measurement: Redis could not be read, so
// what comes back may be another Redis, or one that lost its data.
func (s *Server) forgetMemory(stream string) {
	s.memory.mu.Lock()
	defer s.memory.mu.Unlock()
	delete(s.memory.by, stream)
}

// retentions are the workers' retentions as the projection reads them.
func (c Config) retentions() stats.Retentions {
	return stats.Retentions{Stream: c.StreamRetention, DLQ: c.DLQRetention, Invocation: c.InvocationRetention,
		TrimInterval: c.RetentionInterval}
}
