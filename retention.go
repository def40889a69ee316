package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/redisinfo"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// Retention defaults (docs/operations.md#retention).
const (
	// DefaultStreamRetention is how long an entry stays in the source
	// stream once no consumer group needs it (REDIS_STREAM_RETENTION).
	DefaultStreamRetention = stream.DefaultRetention
	// DefaultDLQRetention is how long a dead-letter entry is kept
	// (REDIS_DLQ_RETENTION).
	DefaultDLQRetention = dlq.DefaultRetention
	// DefaultRetentionInterval is how often a worker trims each stream and
	// its dead-letter stream.
	DefaultRetentionInterval = time.Minute
	// DefaultJanitorInterval is how often a worker takes one step of its
	// scan for invocation state left without a TTL; steps are sized so a
	// pass takes at most an hour.
	DefaultJanitorInterval = 10 * time.Second
	// DefaultConsumerIdle is how long a consumer of the group stays idle
	// with nothing pending before a worker removes it.
	DefaultConsumerIdle = stream.DefaultConsumerIdle
	// Disabled turns a retention off: WorkerConfig.StreamRetention,
	// DLQRetention or ConsumerIdle set to it keep entries (consumers)
	// forever.
	Disabled time.Duration = -1
)

// janitorPass is how long one pass of the janitor over a node's keys may
// take: a hash leaked in the ack-to-retain window gets its retention within
// about this long.
const janitorPass = time.Hour

// maxTrimCalls bounds the Trim calls of one retention round; a stream with
// more due than that many limits' worth goes on next round.
const maxTrimCalls = 10

// streamParts are what the maintenance loops of one stream use.
type streamParts struct {
	engine *Engine
	source *stream.Source
	dlq    *dlq.Writer
	state  *invocation.Store
}

// retainLoop trims one stream and its dead-letter stream, and removes the
// group's long-idle consumers, now and every retention interval
// (docs/operations.md#retention).
func (w *Worker) retainLoop(ctx context.Context, p streamParts) {
	if w.cfg.StreamRetention < 0 && w.cfg.DLQRetention < 0 && w.cfg.ConsumerIdle < 0 {
		return
	}
	var held heldBack
	round := func() {
		if w.cfg.StreamRetention > 0 {
			w.trimStream(ctx, p, &held)
		}
		if w.cfg.DLQRetention > 0 {
			w.trimDLQ(ctx, p)
		}
		if w.cfg.ConsumerIdle > 0 {
			w.pruneConsumers(ctx, p)
		}
	}
	round()
	every(ctx, w.cfg.RetentionInterval, round)
}

// heldBack remembers how long a consumer group has held a stream's
// retention back, so the warning about it is repeated, not constant.
type heldBack struct {
	group  string
	since  time.Time
	warned time.Time
}

func (w *Worker) trimStream(ctx context.Context, p streamParts, held *heldBack) {
	log := p.engine.log
	for range maxTrimCalls {
		res, err := p.source.Trim(ctx, w.cfg.StreamRetention)
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, stream.ErrNoStream) && !errors.Is(err, stream.ErrNoGroup) {
				log.LogAttrs(ctx, slog.LevelWarn, "trimming the stream failed; retrying next round", slog.Any("error", err))
			}
			return
		}
		p.engine.m.streamTrimmed.Add(float64(res.Trimmed))
		w.noteHeldBack(ctx, log, res, held)
		if !res.More {
			return
		}
	}
}

// noteHeldBack warns when one consumer group has kept entries older than
// the retention for a while (the retention, at most an hour, and at least
// five rounds): a stuck or abandoned group is for an operator to see, since
// the stream then grows without bound. A group that is only catching up,
// or one that has not read yet at start, is not worth a warning. The
// warning repeats every such period while it lasts.
func (w *Worker) noteHeldBack(ctx context.Context, log *slog.Logger, res stream.TrimResult, held *heldBack) {
	now := time.Now()
	if !res.HeldBack {
		if held.group != "" && !held.warned.IsZero() {
			log.LogAttrs(ctx, slog.LevelInfo, "stream retention no longer held back", slog.String("group", held.group))
		}
		*held = heldBack{}
		return
	}
	if held.group != res.FloorGroup {
		*held = heldBack{group: res.FloorGroup, since: now}
	}
	patience := max(5*w.cfg.RetentionInterval, min(w.cfg.StreamRetention, time.Hour))
	if now.Sub(held.since) < patience || (!held.warned.IsZero() && now.Sub(held.warned) < patience) {
		return
	}
	behind := res.Cutoff.Sub(res.FloorTime)
	held.warned = now
	what := "its last delivered entry"
	if res.FloorPending {
		what = "an entry still pending"
	}
	log.LogAttrs(ctx, slog.LevelWarn, "a consumer group holds stream retention back; the stream grows until it reads and acknowledges",
		slog.String("group", res.FloorGroup), slog.String("floor", res.Floor), slog.String("floor_is", what),
		slog.Duration("behind_retention", behind))
}

// pruneConsumers removes the group's consumers that have nothing pending
// and have been idle for ConsumerIdle (stream.Source.PruneConsumers).
func (w *Worker) pruneConsumers(ctx context.Context, p streamParts) {
	removed, err := p.source.PruneConsumers(ctx, w.cfg.ConsumerIdle)
	if err != nil {
		if ctx.Err() == nil && !errors.Is(err, stream.ErrNoGroup) {
			p.engine.log.LogAttrs(ctx, slog.LevelWarn, "removing idle consumers failed; retrying next round", slog.Any("error", err))
		}
		return
	}
	if len(removed) > 0 {
		p.engine.log.LogAttrs(ctx, slog.LevelInfo, "removed idle consumers with nothing pending from the group",
			slog.Any("consumers", removed), slog.Duration("idle_for", w.cfg.ConsumerIdle))
	}
}

func (w *Worker) trimDLQ(ctx context.Context, p streamParts) {
	for range maxTrimCalls {
		res, err := p.dlq.Trim(ctx, w.cfg.DLQRetention)
		if err != nil {
			if ctx.Err() == nil {
				p.engine.log.LogAttrs(ctx, slog.LevelWarn, "trimming the dead-letter stream failed; retrying next round", slog.Any("error", err))
			}
			return
		}
		p.engine.m.dlqTrimmed.Add(float64(res.Trimmed))
		if !res.More {
			return
		}
	}
}

// janitorLoop gives terminal retention to invocation state left without a
// TTL after its message was acknowledged (a worker that died between the
// XACK and the switch to retention), one bounded SCAN step every janitor
// interval (docs/delivery.md#invocation-state). A step is sized from the
// node's key count so that a pass over it takes about an hour.
func (w *Worker) janitorLoop(ctx context.Context, p streamParts) {
	var cursor uint64
	count := invocation.DefaultLeakScanCount
	every(ctx, w.cfg.JanitorInterval, func() {
		res, err := p.state.RetainLeaked(ctx, p.engine.c.Stream, p.engine.c.Group, cursor, count, p.engine.cfg.Retention)
		if err != nil {
			if ctx.Err() == nil {
				p.engine.log.LogAttrs(ctx, slog.LevelWarn, "scanning for leaked invocation state failed; retrying", slog.Any("error", err))
			}
			return
		}
		cursor = res.Cursor
		p.engine.m.leaksRetained.Add(float64(res.Retained))
		if res.Retained > 0 {
			p.engine.log.LogAttrs(ctx, slog.LevelInfo, "retained invocation state left without a TTL after its message was acknowledged",
				slog.Int("hashes", res.Retained))
		}
		steps := int64(janitorPass / w.cfg.JanitorInterval)
		count = max(invocation.DefaultLeakScanCount, int(res.Keys/max(steps, 1))+1)
	})
}

// DefaultPolicyCheckInterval is how often a Worker reads Redis's
// maxmemory-policy again after start (docs/operations.md#redis-memory).
const DefaultPolicyCheckInterval = 10 * time.Minute

// warnEviction logs when a Redis server of the worker may evict keys: an
// evicted invocation hash, dedup key or stream loses work
// (docs/operations.md#redis-memory).
func warnEviction(ctx context.Context, log *slog.Logger, p redisinfo.Memory) {
	log.LogAttrs(ctx, slog.LevelWarn, "Redis may evict keys (maxmemory-policy is not noeviction); set maxmemory-policy noeviction",
		slog.String("redis", p.Addr), slog.String("maxmemory_policy", p.Policy), slog.String("may_evict", p.MayEvict()))
}
