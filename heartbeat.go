package relay

import (
	"context"
	"log/slog"

	"github.com/relaydev/relay/internal/ctxtime"
)

// heartbeatLoop keeps the PEL idle time of in-flight messages low so other
// consumers' XAUTOCLAIM does not take live work.
func (e *Engine) heartbeatLoop(ctx context.Context) {
	ctxtime.Every(ctx, e.cfg.HeartbeatInterval, func() {
		ids := e.ownedIDs()
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
	ctxtime.Every(ctx, e.cfg.ReclaimInterval, sample)
}
