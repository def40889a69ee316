package worker

import (
	"context"
	"log/slog"
	"math"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/stats"
)

// memoryWatch measures one stream's Redis memory and its projection at
// the worker's retentions every interval (stats.MeasureMemory), exports
// them as gauges, and warns when the projection is over stats.BudgetShare
// of maxmemory: once, and again only when the verdict changes (back under
// budget, or another part is to blame).
type memoryWatch struct {
	interval      time.Duration
	redis         rueidis.Client
	stream, group string
	retentions    stats.Retentions
	log           *slog.Logger
	projected     prometheus.Gauge
	maxmemory     prometheus.Gauge
	used          prometheus.Gauge
	// over is the part the last measurement blamed, "" when under budget,
	// and overNow whether it was for the memory in use now rather than
	// the projection. Confined to Run's goroutine.
	over    string
	overNow bool
	// failing counts the measurements in a row that failed.
	failing int
}

// memoryRetentions are c's retentions as a projection reads them: a
// disabled stream retention keeps every entry (0 in stats.Retentions).
func memoryRetentions(c Config) stats.Retentions {
	return stats.Retentions{Stream: max(c.StreamRetention, 0), DLQ: max(c.DLQRetention, 0), Invocation: c.stateRetention()}
}

// Run measures now and every interval until ctx ends.
func (m *memoryWatch) Run(ctx context.Context) {
	m.check(ctx)
	ctxtime.Every(ctx, m.interval, func() { m.check(ctx) })
}

// check measures once, sets the gauges and logs a change of verdict. The
// first of failed measurements in a row (a user without +memory or +info,
// Redis down) is logged at warn level, the others at debug: nothing else
// says that a user without +memory is never measured, and the gauges then
// stay as if there were no maxmemory. The first success after them is
// logged at info.
func (m *memoryWatch) check(ctx context.Context) {
	mem, err := stats.MeasureMemory(ctx, m.redis, m.stream, m.group, m.retentions, stats.Budget{})
	if err != nil {
		if ctx.Err() == nil {
			level := slog.LevelDebug
			if m.failing == 0 {
				level = slog.LevelWarn
			}
			m.failing++
			m.log.LogAttrs(ctx, level, "cannot measure Redis memory; relay_redis_memory_projected_bytes and relay_redis_maxmemory_bytes are not updated (the user needs +memory and +info, docs/operations.md#memory-budget)",
				slog.Any("error", err))
		}
		return
	}
	if m.failing > 0 {
		m.log.LogAttrs(ctx, slog.LevelInfo, "measures Redis memory again", slog.Int("failures", m.failing))
		m.failing = 0
	}
	projected := float64(mem.Projected)
	if mem.Projected < 0 {
		projected = math.Inf(1)
	}
	m.projected.Set(projected)
	m.maxmemory.Set(float64(mem.Max))
	m.used.Set(float64(mem.Used))

	over, now := "", false
	if mem.Pressure(stats.BudgetShare) {
		over, now = overBudgetPart(mem), !projectedOver(mem)
	}
	if over == m.over && now == m.overNow {
		return
	}
	was := m.over
	m.over, m.overNow = over, now
	if over == "" {
		m.log.LogAttrs(ctx, slog.LevelInfo, "projected Redis memory is back under budget",
			slog.Int64("projected_bytes", mem.Projected), slog.Int64("maxmemory_bytes", mem.Max), slog.String("was", was))
		return
	}
	attrs := []slog.Attr{
		slog.String("part", over), slog.String("change", overBudgetFix(over)),
		slog.Int64("projected_bytes", mem.Projected), slog.Int64("maxmemory_bytes", mem.Max),
		slog.Int64("used_bytes", mem.Used), slog.Float64("events_per_second", mem.Rate),
	}
	msg := "projected Redis memory is over 90% of maxmemory; at maxmemory Relay stops (docs/operations.md#memory-budget)"
	if now {
		msg = "Redis memory in use is over 90% of maxmemory now; at maxmemory Relay stops (docs/operations.md#memory-budget)"
	}
	m.log.LogAttrs(ctx, slog.LevelWarn, msg, attrs...)
}

// projectedOver reports whether the projection, not only the memory in
// use now, is over budget.
func projectedOver(m stats.Memory) bool {
	return m.Max > 0 && (m.Projected < 0 || float64(m.Projected) > stats.BudgetShare*float64(m.Max))
}

// Parts a warning can blame.
const (
	partStream      = "source stream"
	partDLQ         = "dead-letter stream"
	partInvocations = "invocation state"
	partOther       = "other relay keys"
	partNotRelay    = "memory not Relay's"
)

// overBudgetPart names the part that grows the projection most: the one
// that grows without bound, else the largest projected part, else what is
// not Relay's when that is larger than every part. When only the memory in
// use now is over budget (the projection is not), it names the part that
// takes the most now.
func overBudgetPart(m stats.Memory) string {
	switch {
	case m.Projected >= 0:
	case m.Stream.Projected < 0:
		return partStream
	default:
		return partDLQ
	}
	parts := []struct {
		name  string
		bytes int64
	}{
		{partStream, m.Stream.Projected}, {partDLQ, m.DLQ.Projected},
		{partInvocations, m.Invocations.Projected}, {partOther, m.Other.Projected},
	}
	if m.Max > 0 && !projectedOver(m) {
		parts[0].bytes, parts[1].bytes, parts[2].bytes, parts[3].bytes = m.Stream.Bytes, m.DLQ.Bytes, m.Invocations.Bytes, m.Other.Bytes
	}
	name, top := partNotRelay, max(m.Used-(m.Stream.Bytes+m.DLQ.Bytes+m.Invocations.Bytes+m.Other.Bytes), 0)
	for _, p := range parts {
		if p.bytes > top {
			name, top = p.name, p.bytes
		}
	}
	return name
}

// overBudgetFix says what to change for part.
func overBudgetFix(part string) string {
	switch part {
	case partStream:
		return "lower REDIS_STREAM_RETENTION (0 keeps every entry) or raise maxmemory"
	case partDLQ:
		return "lower REDIS_DLQ_RETENTION (0 keeps every entry), replay or remove dead letters, or raise maxmemory"
	case partInvocations:
		return "lower REDIS_INVOCATION_RETENTION (0 deletes the state with the acknowledgement) or raise maxmemory"
	case partOther:
		return "look for other keys under relay: (relay stats) or raise maxmemory"
	}
	return "other data on this Redis takes the memory: move it or raise maxmemory"
}
