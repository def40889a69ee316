package worker

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream"
)

// statusPublisher writes, every interval, the status of each stream's
// Engine to the stream's status hash, which relay health, relay stats and
// the console read (docs/delivery.md#worker-status): why it holds messages
// pending (relay.Engine.Holds), the attempts it runs (relay.Engine.Running)
// with those whose message Redis no longer has pending marked lost, the
// worker's concurrency slots (relay.Limiter.InUse) and whether its source
// created the consumer group again (redisstream.Source.GroupRecreations). It
// removes this worker's status when it stops. A failed write is logged on
// its first occurrence and every 30th.
type statusPublisher struct {
	redis    rueidis.Client
	group    string
	consumer string
	interval time.Duration
	streams  []*streamParts
	limiter  *relay.Limiter
	log      *slog.Logger
}

// Run publishes at once, then every interval until ctx ends.
func (p *statusPublisher) Run(ctx context.Context) {
	var fails ctxtime.Failures
	publish := func() {
		err := p.publish(ctx)
		if n, report := fails.Note(err); report && ctx.Err() == nil {
			p.log.LogAttrs(ctx, slog.LevelWarn, "publishing the worker's status failed; relay health and the console may miss held messages",
				slog.Int("failures", n), slog.Any("error", err))
		}
	}
	publish()
	ctxtime.Every(ctx, p.interval, publish)
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for _, s := range p.streams {
		if err := redisstats.ClearStatus(cctx, p.redis, s.name, p.group, p.consumer); err != nil {
			p.log.LogAttrs(cctx, slog.LevelWarn, "removing the worker's status failed; readers ignore it once it is stale",
				slog.String("stream", s.name), slog.Any("error", err))
		}
	}
}

// publish writes the status of every stream.
func (p *statusPublisher) publish(ctx context.Context) error {
	now := time.Now()
	slots := p.slots()
	for _, s := range p.streams {
		st := stats.WorkerStatus{Consumer: p.consumer, UpdatedAt: now, Holds: s.engine.Holds(), Slots: slots}
		for _, w := range s.engine.Waiting() {
			st.Waiting = append(st.Waiting, stats.Waiting{App: w.App, Handler: w.Handler, Limit: w.Limit, Count: w.Count, Oldest: w.Oldest})
		}
		st.GroupRecreations, st.GroupRecreatedAt = s.source.GroupRecreations()
		var err error
		if st.Running, err = runs(ctx, s); err != nil {
			return err
		}
		if err := redisstats.WriteStatus(ctx, p.redis, s.name, p.group, st); err != nil {
			return err
		}
	}
	return nil
}

// slots are the worker's concurrency slots now; nil without a Limiter.
func (p *statusPublisher) slots() *stats.Slots {
	if p.limiter == nil {
		return nil
	}
	global, apps := p.limiter.InUse()
	out := &stats.Slots{InUse: global, Max: p.limiter.Max()}
	for _, a := range apps {
		out.Apps = append(out.Apps, stats.AppSlots{App: a.App, InUse: a.InUse, Limit: a.Limit})
	}
	return out
}

// runs lists the attempts the Engine of s runs, oldest first, marking
// lost those whose message is no longer pending for this worker
// (redisstream.Source.Owned). The list is taken before and after that check,
// and only an attempt in both can be lost: it ran throughout the check,
// and a message is acknowledged only after its attempts end, so a message
// missing then was not acknowledged but lost (Redis lost its data, the
// entry was deleted, or another worker took it over). A missing group
// means no message is pending. An attempt the Engine's heartbeat found
// orphaned (relay.Running.Orphaned) is lost whatever the check says.
func runs(ctx context.Context, s *streamParts) ([]stats.Run, error) {
	before := s.engine.Running()
	if len(before) == 0 {
		return nil, nil
	}
	ids := make([]string, 0, len(before))
	for _, r := range before {
		if !slices.Contains(ids, r.MessageID) {
			ids = append(ids, r.MessageID)
		}
	}
	owned, err := s.source.Owned(ctx, ids)
	if err != nil && !errors.Is(err, stream.ErrNoGroup) {
		return nil, err
	}
	after := s.engine.Running()
	out := make([]stats.Run, len(after))
	for i, r := range after {
		out[i] = stats.Run{App: r.App, Handler: r.Handler, MessageID: r.MessageID, Attempt: r.Attempt, MaxAttempts: r.MaxAttempts,
			Started: r.Started, TimeoutMS: r.Timeout.Milliseconds(), LeaseUntil: r.LeaseUntil,
			Lost: r.Orphaned || !owned[r.MessageID] && slices.ContainsFunc(before, func(b relay.Running) bool { b.Orphaned = r.Orphaned; return b == r })}
	}
	return out, nil
}

// statusInterval is how often the status is published: with the stats.
func statusInterval(cfg Config) time.Duration {
	return cmp.Or(cfg.Engine.StatsInterval, relay.DefaultStatsInterval)
}
