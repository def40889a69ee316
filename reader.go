package relay

import (
	"context"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
)

// readLoop reads new entries whenever a message slot is free. Taking the
// slot before reading is the back-pressure: a worker holds at most twice
// MAX_CONCURRENCY messages; one whose app has no free slot waits for it
// (bounded by the concurrency wait) while other apps' messages proceed.
func (e *Engine) readLoop(ctx context.Context, r *run) {
	// The group exists (Run ensured it): consuming until a read fails.
	e.consuming.Store(true)
	defer e.consuming.Store(false)
	var fails int
	idle := true // until a read finds entries
	for {
		// While claims fail (Redis out of memory refuses them, say), each
		// entry read would only move into the PEL and stay there, which
		// costs Redis memory: read at a pace that backs off, until a claim
		// succeeds (docs/delivery.md#claim-errors-fail-closed).
		if k := e.claimFails.Load(); k > 0 && !ctxtime.Sleep(ctx, retryDelay(int(k))) {
			return
		}
		n, ok := e.takeSlots(ctx, !idle)
		if !ok {
			return
		}
		batch, err := e.c.Source.Read(ctx, n)
		// A read that finds nothing blocks for seconds holding its slots.
		// While the stream is idle (at start, and after a read found
		// nothing) read one entry at a time: as it blocks, the other slots
		// stay free for reclaimed messages, which otherwise waited for
		// every block to end (bench/pipeline -modes reclaim). The first
		// entry of a burst then comes alone and the rest with the next
		// read, right after.
		idle = err == nil && len(batch) == 0
		e.consuming.Store(err == nil && ctx.Err() == nil)
		if err != nil && ctx.Err() == nil {
			fails++
			e.loopFailed(ctx, "stream read failed; retrying", fails, err)
		} else {
			if err == nil {
				e.loopRecovered(ctx, "stream read works again", fails)
			}
			fails = 0
		}
		settles := e.newReadSettles(len(batch))
		for _, msg := range batch {
			n--
			e.dispatch(ctx, r, job{msg: msg, settles: settles})
		}
		for ; n > 0; n-- {
			<-e.msgSlots
		}
		if fails > 0 && !ctxtime.Sleep(ctx, retryDelay(fails)) {
			return
		}
	}
}

// takeSlots waits for a free message slot and, when all is set, takes
// every other one free at that moment, then waits up to readLinger for
// more until it holds half of them; it returns how many it holds, and
// false once ctx is done.
//
// A busy worker frees slots one at a time, and reading as soon as one is
// free made reads of 2 to 3 entries whose deliveries reached Redis a few
// at a time (bench/pipeline). Reading half the slots at once lets the
// claims and settlements of a read share script calls
// (docs/delivery.md#batched-transitions); the linger bounds the wait when
// slots free slowly, since a handler may run for minutes.
func (e *Engine) takeSlots(ctx context.Context, all bool) (int, bool) {
	select {
	case e.msgSlots <- struct{}{}:
	case <-ctx.Done():
		return 0, false
	}
	if !all {
		return 1, true
	}
	n := 1 + e.freeSlots()
	want := cap(e.msgSlots) / 2
	if n >= want {
		return n, true
	}
	linger := time.NewTimer(readLinger)
	defer linger.Stop()
	for n < want {
		select {
		case e.msgSlots <- struct{}{}:
			n += 1 + e.freeSlots()
		case <-linger.C:
			return n, true
		case <-ctx.Done():
			for ; n > 0; n-- {
				<-e.msgSlots
			}
			return 0, false
		}
	}
	return n, true
}

// readLinger is how long a busy worker waits for message slots to free
// before it reads fewer entries than half of them.
const readLinger = time.Millisecond

// freeSlots takes every message slot free at this moment, without waiting,
// and returns how many it took.
func (e *Engine) freeSlots() int {
	for n := 0; ; n++ {
		select {
		case e.msgSlots <- struct{}{}:
		default:
			return n
		}
	}
}

// dispatch starts the goroutine of one message; the caller holds its slot.
func (e *Engine) dispatch(ctx context.Context, r *run, j job) {
	if !e.track(j.msg.ID) {
		<-e.msgSlots
		if j.settles != nil {
			j.settles.leave()
		}
		return
	}
	select {
	case e.handoff <- j: // a handler goroutine was idle and took it
	default:
		r.msgs.Go(func() { e.handleLoop(ctx, r, j) })
	}
}

// handle delivers j's message, then frees its message slot.
func (e *Engine) handle(ctx context.Context, r *run, j job) {
	defer func() { <-e.msgSlots }()
	defer e.untrack(j.msg.ID)
	e.deliver(ctx, r.handlerCtx, j)
}

// handlerIdle is how long a message goroutine waits for another message
// before it exits.
const handlerIdle = time.Second

// handleLoop handles msg and then every message handed to it while it is
// idle, until it has waited handlerIdle or Run has stopped dispatching. A
// goroutine per message spent 14-19% of a worker's CPU growing its stack
// (bench/pipeline profiles: claim, handler and acknowledgement go deep);
// one that handles message after message keeps the stack it grew. A new
// one starts only when none is idle, so there are about as many as
// messages were in flight in the last handlerIdle, which the message slots
// bound.
func (e *Engine) handleLoop(ctx context.Context, r *run, j job) {
	idle := time.NewTimer(handlerIdle)
	defer idle.Stop()
	for {
		e.handle(ctx, r, j)
		idle.Reset(handlerIdle)
		select {
		case j = <-e.handoff:
		case <-idle.C:
			return
		case <-e.dispatchDone:
			return
		}
	}
}
