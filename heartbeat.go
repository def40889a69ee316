package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
)

// heartbeat keeps the PEL idle time of the messages this consumer works on
// low, so other consumers' XAUTOCLAIM does not take live work, and ends
// the handlers of those that are no longer pending: another consumer
// acknowledged them, or Redis lost them (a restart without its data).
// Their outcomes cannot be recorded, and the slots they hold are better
// given to live work (docs/delivery.md#concurrency-and-heartbeat).
type heartbeat struct {
	src      StreamSource
	ds       *dispatcher
	p        *pipeline
	interval time.Duration
}

func (h *heartbeat) run(ctx context.Context) {
	ctxtime.Every(ctx, h.interval, func() {
		ids := h.ds.owned()
		if len(ids) == 0 {
			return
		}
		gone, err := h.src.Heartbeat(ctx, ids...)
		if err != nil {
			if ctx.Err() == nil {
				h.p.log.LogAttrs(ctx, slog.LevelWarn, "heartbeat failed; other workers may reclaim running messages",
					slog.Int("messages", len(ids)), slog.Any("error", err))
			}
			return
		}
		if len(gone) == 0 {
			return
		}
		h.p.runs.orphan(gone)
		if n := h.ds.gone(gone); n > 0 {
			h.p.log.LogAttrs(ctx, slog.LevelWarn, "messages this worker was delivering are no longer pending in the consumer group (another consumer acknowledged them, or Redis lost its data); their handlers are stopped and their outcomes not recorded",
				slog.Int("messages", n), slog.Any("message_ids", gone[:min(len(gone), 10)]))
		}
	})
}

// pendingSampler samples the PEL every reclaim interval. The gauges
// describe the whole consumer group, so every worker reports the same
// cluster-wide values. It also forgets held messages this consumer no
// longer owns (forgetTakenOver).
type pendingSampler struct {
	src      StreamSource
	ds       *dispatcher
	p        *pipeline
	interval time.Duration
}

func (s *pendingSampler) run(ctx context.Context) {
	pr, reports := s.src.(PendingReporter)
	oc, checks := s.src.(OwnerChecker)
	if !reports && !checks {
		return
	}
	sample := func() {
		if checks {
			s.forgetTakenOver(ctx, oc)
		}
		if !reports {
			return
		}
		n, age, err := pr.Pending(ctx)
		switch {
		case err == nil:
			s.p.m.pending.Set(float64(n))
			s.p.m.pendingAge.Set(age.Seconds())
		case ctx.Err() == nil:
			s.p.log.LogAttrs(ctx, slog.LevelDebug, "sampling pending entries failed", slog.Any("error", err))
		}
	}
	sample()
	ctxtime.Every(ctx, s.interval, sample)
}

// forgetTakenOver drops from the held counts the messages that are no
// longer pending for this consumer: another worker reclaimed them (and
// holds them, or acknowledged them), or they were acknowledged. A message
// that is in flight or waiting here, or that a delivery held again since
// the ids were read, is left to its delivery.
func (s *pendingSampler) forgetTakenOver(ctx context.Context, oc OwnerChecker) {
	held := s.p.held
	ids, asOf := held.all()
	if len(ids) == 0 {
		return
	}
	owned, err := oc.Owned(ctx, ids)
	if err != nil {
		if ctx.Err() == nil {
			s.p.log.LogAttrs(ctx, slog.LevelDebug, "checking held messages' owner failed", slog.Any("error", err))
		}
		return
	}
	here := map[string]bool{}
	for _, id := range s.ds.owned() {
		here[id] = true
	}
	var gone []string
	for _, id := range ids {
		if !owned[id] && !here[id] {
			gone = append(gone, id)
		}
	}
	held.forget(gone, asOf)
}
