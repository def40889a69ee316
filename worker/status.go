package worker

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/stats"
)

// statusPublisher writes, every interval, why each stream's Engine holds
// messages pending (relay.Engine.Holds) to the stream's status hash, which
// relay health, relay stats and the console read
// (docs/delivery.md#held-messages); it removes this worker's status when it
// stops. A failed write is logged on its first occurrence and every 30th.
type statusPublisher struct {
	redis    rueidis.Client
	group    string
	consumer string
	interval time.Duration
	streams  []*streamParts
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
		if err := stats.ClearStatus(cctx, p.redis, s.name, p.group, p.consumer); err != nil {
			p.log.LogAttrs(cctx, slog.LevelWarn, "removing the worker's status failed; readers ignore it once it is stale",
				slog.String("stream", s.name), slog.Any("error", err))
		}
	}
}

// publish writes the status of every stream.
func (p *statusPublisher) publish(ctx context.Context) error {
	now := time.Now()
	for _, s := range p.streams {
		st := stats.WorkerStatus{Consumer: p.consumer, UpdatedAt: now, Holds: s.engine.Holds()}
		if err := stats.WriteStatus(ctx, p.redis, s.name, p.group, st); err != nil {
			return err
		}
	}
	return nil
}

// statusInterval is how often the status is published: with the stats.
func statusInterval(cfg Config) time.Duration {
	return cmp.Or(cfg.Engine.StatsInterval, relay.DefaultStatsInterval)
}
