package relay

import (
	"context"
	"log/slog"
	"time"
)

// PendingReporter is an optional StreamSource capability: the size of the
// consumer group's PEL and the age of its oldest entry (XPENDING), for the
// relay_pending_entries and relay_pending_oldest_age_seconds gauges.
type PendingReporter interface {
	Pending(ctx context.Context) (count int64, oldestAge time.Duration, err error)
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
	every(ctx, e.o.reclaimInterval, sample)
}
