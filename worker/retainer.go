package worker

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// maxTrimCalls bounds the Trim calls of one retention round; a stream with
// more due than that many limits' worth goes on next round.
const maxTrimCalls = 10

// retainerConfig is what a retainer keeps and how often it trims.
type retainerConfig struct {
	streamRetention, dlqRetention, consumerIdle time.Duration // < 0: off
	interval                                    time.Duration
}

func retainerConfigOf(c Config) retainerConfig {
	return retainerConfig{streamRetention: c.StreamRetention, dlqRetention: c.DLQRetention,
		consumerIdle: c.ConsumerIdle, interval: c.RetentionInterval}
}

// retainer trims one stream and its dead-letter stream, and removes the
// group's long-idle consumers (docs/operations.md#retention).
type retainer struct {
	cfg    retainerConfig
	source *redisstream.Source
	dlq    *redisdlq.Writer
	log    *slog.Logger
	m      *streamMetrics
	// floor is confined to Run's goroutine.
	floor floorWatch
}

// Run does a round now and every interval until ctx ends.
func (r *retainer) Run(ctx context.Context) {
	if r.cfg.streamRetention < 0 && r.cfg.dlqRetention < 0 && r.cfg.consumerIdle < 0 {
		return
	}
	round := func() {
		if r.cfg.streamRetention > 0 {
			r.trimStream(ctx)
		}
		if r.cfg.dlqRetention > 0 {
			r.trimDLQ(ctx)
		}
		if r.cfg.consumerIdle > 0 {
			r.pruneConsumers(ctx)
		}
	}
	round()
	ctxtime.Every(ctx, r.cfg.interval, round)
}

func (r *retainer) trimStream(ctx context.Context) {
	for range maxTrimCalls {
		res, err := r.source.Trim(ctx, r.cfg.streamRetention)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, stream.ErrNoStream) && !errors.Is(err, stream.ErrNoGroup) {
				r.log.LogAttrs(ctx, slog.LevelWarn, "trimming the stream failed; retrying next round", slog.Any("error", err))
			}
			return
		}
		r.m.streamTrimmed.Add(float64(res.Trimmed))
		r.noteFloor(ctx, res)
		if !res.More {
			return
		}
	}
}

// floorWatch remembers how long one consumer group has kept the stream's
// retention from trimming, so the warning about it is repeated, not
// constant.
type floorWatch struct {
	group  string
	since  time.Time
	warned time.Time
}

// noteFloor warns when one consumer group has kept entries older than the
// retention for a while (the retention, at most an hour, and at least five
// rounds): a stuck or abandoned group is for an operator to see, since the
// stream then grows without bound. A group that is only catching up, or
// one that has not read yet at start, is not worth a warning. The warning
// repeats every such period while it lasts.
func (r *retainer) noteFloor(ctx context.Context, res stream.TrimResult) {
	now, f := time.Now(), &r.floor
	if !res.HeldBack {
		if f.group != "" && !f.warned.IsZero() {
			r.log.LogAttrs(ctx, slog.LevelInfo, "stream retention no longer held back", slog.String("group", f.group))
		}
		*f = floorWatch{}
		return
	}
	if f.group != res.FloorGroup {
		*f = floorWatch{group: res.FloorGroup, since: now}
	}
	patience := max(5*r.cfg.interval, min(r.cfg.streamRetention, time.Hour))
	if now.Sub(f.since) < patience || (!f.warned.IsZero() && now.Sub(f.warned) < patience) {
		return
	}
	f.warned = now
	what := "its last delivered entry"
	if res.FloorPending {
		what = "an entry still pending"
	}
	r.log.LogAttrs(ctx, slog.LevelWarn, "a consumer group holds stream retention back; the stream grows until it reads and acknowledges",
		slog.String("group", res.FloorGroup), slog.String("floor", res.Floor), slog.String("floor_is", what),
		slog.Duration("behind_retention", res.Cutoff.Sub(res.FloorTime)))
}

// pruneConsumers removes the group's consumers that have nothing pending
// and have been idle for consumerIdle (redisstream.Source.PruneConsumers).
func (r *retainer) pruneConsumers(ctx context.Context) {
	removed, err := r.source.PruneConsumers(ctx, r.cfg.consumerIdle)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, stream.ErrNoGroup) {
			r.log.LogAttrs(ctx, slog.LevelWarn, "removing idle consumers failed; retrying next round", slog.Any("error", err))
		}
		return
	}
	if len(removed) > 0 {
		r.log.LogAttrs(ctx, slog.LevelInfo, "removed idle consumers with nothing pending from the group",
			slog.Any("consumers", removed), slog.Duration("idle_for", r.cfg.consumerIdle))
	}
}

func (r *retainer) trimDLQ(ctx context.Context) {
	for range maxTrimCalls {
		res, err := r.dlq.Trim(ctx, r.cfg.dlqRetention)
		if err != nil {
			if ctx.Err() == nil {
				r.log.LogAttrs(ctx, slog.LevelWarn, "trimming the dead-letter stream failed; retrying next round", slog.Any("error", err))
			}
			return
		}
		r.m.dlqTrimmed.Add(float64(res.Trimmed))
		if !res.More {
			return
		}
	}
}
