package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// reclaimer is the message-level backstop of
// docs/delivery.md#from-entry-to-acknowledgement: every reclaim interval it
// takes over entries idle beyond MinPendingIdle, whoever owned them.
// While passes fail (Redis gone) it backs off: it skips 1, 3, 7, then 15
// intervals between passes, as the read loop paces its reads.
type reclaimer struct {
	src      StreamSource
	ds       *dispatcher
	p        *pipeline
	fail     *loopLog
	interval time.Duration
	minIdle  time.Duration
}

func (r *reclaimer) run(ctx context.Context) {
	var fails, skip int
	ctxtime.Every(ctx, r.interval, func() {
		if skip > 0 {
			skip--
			return
		}
		r.pass(ctx, &fails)
		if fails > 0 {
			skip = 1<<min(fails, 4) - 1
		}
	})
}

// pass is one reclaim pass that claims no more entries than the worker
// has free message slots, plus one, again and again until the pass has
// gone around the PEL. Claiming every idle entry at once would let a
// worker with 8 slots take all 10,000 entries of a dead consumer
// (bench/memory), holding them in memory and keeping them from every other
// worker while it works through them. Here what this worker cannot start
// stays idle in the PEL for whichever worker has room. The one entry beyond
// the free slots keeps the backstop moving while new messages fill every
// slot: it waits for a slot owned (and heartbeated) like a reclaimed batch,
// and the pass goes on once it is dispatched. A call that returns fewer
// entries than asked without finishing the pass reached the source's bound
// of calls: the next tick goes on.
func (r *reclaimer) pass(ctx context.Context, fails *int) {
	for ctx.Err() == nil {
		n := freeSlots(r.ds.slots)
		want := n + 1
		batch, deleted, done, err := r.src.Reclaim(ctx, r.minIdle, want)
		for _, id := range deleted {
			r.missingPayload(ctx, id)
		}
		short := len(batch) < want
		i := min(len(batch), n)
		r.ds.dispatch(ctx, batch[:i]...)
		for n -= i; n > 0; n-- {
			<-r.ds.slots
		}
		if !r.dispatchWaiting(ctx, batch[i:]) {
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				*fails++
				r.fail.failed(ctx, "reclaim failed; retrying", *fails, err)
			}
			return
		}
		r.fail.recovered(ctx, "reclaim works again", *fails)
		*fails = 0
		if done || short {
			return
		}
	}
}

// dispatchWaiting dispatches reclaimed messages as message slots free up.
// While they wait they count as owned, so the heartbeat keeps them from
// looking idle to other workers. It returns false when ctx ended the wait.
func (r *reclaimer) dispatchWaiting(ctx context.Context, batch []stream.Message) bool {
	r.ds.setWaiting(batch, true)
	defer r.ds.setWaiting(batch, false)
	for i, msg := range batch {
		select {
		case r.ds.slots <- struct{}{}:
			r.ds.dispatch(ctx, msg)
			r.ds.setWaiting(batch[i:i+1], false)
		case <-ctx.Done():
			// The rest stay pending for the next reclaim, by any worker.
			r.p.log.LogAttrs(ctx, slog.LevelDebug, "shutdown: reclaimed messages left pending", slog.Int("count", len(batch)-i))
			return false
		}
	}
	return true
}

// missingPayload handles a PEL reference whose stream entry is gone: data
// loss, counted and logged, never a fabricated payload or DLQ entry
// (docs/delivery.md#missing-payloads). The source already cleared the
// reference; the message's state, if any, is retained.
func (r *reclaimer) missingPayload(ctx context.Context, id string) {
	p := r.p
	p.m.missingPayload.Inc()
	p.log.LogAttrs(ctx, slog.LevelError, "pending entry has no payload; it was deleted or trimmed while unacknowledged",
		slog.String(telemetry.MessageID, id))
	// Not a delivery: it counts as one while it writes (batch.go).
	p.act.add(1, 0)
	err := p.persist(ctx, func(octx context.Context) error {
		_, err := p.settles.do(octx, invocation.Settlement{Key: p.id.key(id), Cleared: true, Retention: p.cfg.Retention})
		return err
	})
	p.act.add(-1, 0)
	if err != nil {
		p.log.LogAttrs(ctx, slog.LevelWarn, "switching invocation state to retention failed; the state is leaked, not expired",
			slog.String(telemetry.MessageID, id), slog.Any("error", err))
	}
}
