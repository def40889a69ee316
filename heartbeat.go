package relay

import (
	"context"
	"log/slog"
)

// heartbeatLoop keeps the PEL idle time of in-flight messages low so other
// consumers' XAUTOCLAIM does not take live work.
func (e *Engine) heartbeatLoop(ctx context.Context) {
	every(ctx, e.cfg.HeartbeatInterval, func() {
		ids := e.heldIDs()
		if len(ids) == 0 {
			return
		}
		if err := e.c.Source.Heartbeat(ctx, ids...); err != nil && ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "heartbeat failed; other workers may reclaim running messages",
				slog.Int("messages", len(ids)), slog.Any("error", err))
		}
	})
}

// pendingLoop samples the PEL every reclaim interval. The gauges describe
// the whole consumer group, so every worker reports the same cluster-wide
// values.
func (e *Engine) pendingLoop(ctx context.Context) {
	pr, ok := e.c.Source.(PendingReporter)
	if !ok {
		return
	}
	sample := func() {
		n, age, err := pr.Pending(ctx)
		switch {
		case err == nil:
			e.m.pending.Set(float64(n))
			e.m.pendingAge.Set(age.Seconds())
		case ctx.Err() == nil:
			e.log.LogAttrs(ctx, slog.LevelDebug, "sampling pending entries failed", slog.Any("error", err))
		}
	}
	sample()
	every(ctx, e.cfg.ReclaimInterval, sample)
}

// statsLoop flushes the counts every stats interval until ctx is done; Run
// flushes once more after the last message finished. A failure is logged on
// its first occurrence and every 30th after that, never returned.
func (e *Engine) statsLoop(ctx context.Context) {
	if e.cfg.Stats == nil {
		return
	}
	var fails int
	every(ctx, e.cfg.StatsInterval, func() {
		// Not under ctx: a stop cancelling a flush whose HINCRBYs Redis
		// already applied would put the counts back, and the final flush
		// would add them twice.
		octx, cancel := e.detached(ctx)
		err := e.cfg.Stats.Flush(octx)
		cancel()
		switch {
		case err == nil:
			fails = 0
		case ctx.Err() != nil:
		default:
			if fails%30 == 0 {
				e.log.LogAttrs(ctx, slog.LevelWarn, "writing stats failed; the counts are kept and written later",
					slog.Int("failures", fails+1), slog.Any("error", err))
			}
			fails++
		}
	})
}

// flushStats writes what is left at shutdown, under a detached context.
func (e *Engine) flushStats(ctx context.Context) {
	if e.cfg.Stats == nil {
		return
	}
	octx, cancel := e.detached(ctx)
	defer cancel()
	if err := e.cfg.Stats.Flush(octx); err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "writing stats at shutdown failed; these counts are lost", slog.Any("error", err))
	}
}
