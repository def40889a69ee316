package relay

import (
	"context"
	"log/slog"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/stream"
)

// reclaimLoop is the message-level backstop of
// docs/delivery.md#from-entry-to-acknowledgement: every reclaim interval it
// takes over entries idle beyond MinPendingIdle, whoever owned them.
// While passes fail (Redis gone) it backs off: it skips 1, 3, 7, then 15
// intervals between passes, as the read loop paces its reads.
func (e *Engine) reclaimLoop(ctx context.Context, r *run) {
	var fails, skip int
	ctxtime.Every(ctx, e.cfg.ReclaimInterval, func() {
		if skip > 0 {
			skip--
			return
		}
		e.reclaimPass(ctx, r, &fails)
		if fails > 0 {
			skip = 1<<min(fails, 4) - 1
		}
	})
}

// loopFailed logs a failure of the read or the reclaim loop: at ERROR once
// per repeatWindow for the same error, at DEBUG in between, the next ERROR
// line counting those (docs/operations.md#logs).
func (e *Engine) loopFailed(ctx context.Context, msg string, fails int, err error) {
	level, n := e.loopFailures.level(slog.LevelError, msg, cause(err), time.Now())
	e.log.LogAttrs(ctx, level, msg, repeatedAttr([]slog.Attr{slog.Int("failures", fails), slog.Any("error", err)}, n)...)
}

// loopRecovered says that the read or the reclaim loop works again after
// fails failures in a row, so an outage's end is in the log as well as its
// start.
func (e *Engine) loopRecovered(ctx context.Context, msg string, fails int) {
	if fails > 0 {
		e.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.Int("failures", fails))
	}
}

// dispatchWaiting dispatches reclaimed messages as message slots free up.
// While they wait they count as owned, so the heartbeat keeps them from
// looking idle to other workers. It returns false when ctx ended the wait.
func (e *Engine) dispatchWaiting(ctx context.Context, r *run, batch []stream.Message) bool {
	e.setWaiting(batch, true)
	defer e.setWaiting(batch, false)
	for i, msg := range batch {
		select {
		case e.msgSlots <- struct{}{}:
			e.dispatch(ctx, r, job{msg: msg})
			e.setWaiting(batch[i:i+1], false)
		case <-ctx.Done():
			// The rest stay pending for the next reclaim, by any worker.
			e.log.LogAttrs(ctx, slog.LevelDebug, "shutdown: reclaimed messages left pending", slog.Int("count", len(batch)-i))
			return false
		}
	}
	return true
}

// reclaimPass is one reclaim pass that claims no more entries than the
// worker has free message slots, plus one, again and again until the pass
// has gone around the PEL. Claiming every idle entry at once would let a
// worker with 8 slots take all 10,000 entries of a dead consumer
// (bench/memory), holding them in memory and keeping them from every other
// worker while it works through them. Here what this worker cannot start
// stays idle in the PEL for whichever worker has room. The one entry beyond
// the free slots keeps the backstop moving while new messages fill every
// slot: it waits for a slot owned (and heartbeated) like a reclaimed batch,
// and the pass goes on once it is dispatched. A call that returns fewer
// entries than asked without finishing the pass reached the source's bound
// of calls: the next tick goes on.
func (e *Engine) reclaimPass(ctx context.Context, r *run, fails *int) {
	for ctx.Err() == nil {
		n := e.freeSlots()
		want := n + 1
		batch, deleted, done, err := e.c.Source.Reclaim(ctx, e.cfg.MinPendingIdle, want)
		for _, id := range deleted {
			e.missingPayload(ctx, id)
		}
		short := len(batch) < want
		i := 0
		for ; i < len(batch) && n > 0; i++ {
			n--
			e.dispatch(ctx, r, job{msg: batch[i]})
		}
		for ; n > 0; n-- {
			<-e.msgSlots
		}
		if !e.dispatchWaiting(ctx, r, batch[i:]) {
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				*fails++
				e.loopFailed(ctx, "reclaim failed; retrying", *fails, err)
			}
			return
		}
		e.loopRecovered(ctx, "reclaim works again", *fails)
		*fails = 0
		if done || short {
			return
		}
	}
}

// missingPayload handles a PEL reference whose stream entry is gone: data
// loss, counted and logged, never a fabricated payload or DLQ entry
// (docs/delivery.md#missing-payloads). The source already cleared the
// reference; the message's state, if any, is retained.
func (e *Engine) missingPayload(ctx context.Context, id string) {
	e.m.missingPayload.Inc()
	e.log.LogAttrs(ctx, slog.LevelError, "pending entry has no payload; it was deleted or trimmed while unacknowledged",
		slog.String(telemetry.MessageID, id))
	if err := e.retain(ctx, e.key(id)); err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "switching invocation state to retention failed; the state is leaked, not expired",
			slog.String(telemetry.MessageID, id), slog.Any("error", err))
	}
}
