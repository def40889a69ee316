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
// values. It also forgets held messages this consumer no longer owns
// (forgetTakenOver).
func (e *Engine) pendingLoop(ctx context.Context) {
	pr, reports := e.c.Source.(PendingReporter)
	oc, checks := e.c.Source.(OwnerChecker)
	if !reports && !checks {
		return
	}
	sample := func() {
		if checks {
			e.forgetTakenOver(ctx, oc)
		}
		if !reports {
			return
		}
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

// forgetTakenOver drops from the held counts the messages that are no
// longer pending for this consumer: another worker reclaimed them (and
// holds them, or acknowledged them), or they were acknowledged. A message
// that is in flight or waiting here, or that a delivery held again since
// the ids were read, is left to its delivery.
func (e *Engine) forgetTakenOver(ctx context.Context, oc OwnerChecker) {
	ids, asOf := e.held.all()
	if len(ids) == 0 {
		return
	}
	owned, err := oc.Owned(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelDebug, "checking held messages' owner failed", slog.Any("error", err))
		}
		return
	}
	here := map[string]bool{}
	for _, id := range e.ownedIDs() {
		here[id] = true
	}
	var gone []string
	for _, id := range ids {
		if !owned[id] && !here[id] {
			gone = append(gone, id)
		}
	}
	e.held.forget(gone, asOf)
}
