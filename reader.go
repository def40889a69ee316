package relay

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
)

// reader is the Engine's read loop: it reads new entries whenever a
// message slot is free. Taking the slot before reading is the
// back-pressure: a worker holds at most twice MAX_CONCURRENCY messages;
// one whose app has no free slot waits for it (bounded by the concurrency
// wait) while other apps' messages proceed.
type reader struct {
	src  StreamSource
	ds   *dispatcher
	p    *pipeline
	fail *loopLog
	// consuming is set while the loop runs and its last read succeeded
	// (Engine.Ping, readiness).
	consuming *atomic.Bool
}

func (r *reader) run(ctx context.Context) {
	// The group exists (Run ensured it): consuming until a read fails.
	r.consuming.Store(true)
	defer r.consuming.Store(false)
	var fails int
	idle := true // until a read finds entries
	for {
		// While claims fail (Redis out of memory refuses them, say), each
		// entry read would only move into the PEL and stay there, which
		// costs Redis memory: read at a pace that backs off, until a claim
		// succeeds (docs/delivery.md#claim-errors-fail-closed).
		if k := r.p.claimFails.Load(); k > 0 && !ctxtime.Sleep(ctx, retryDelay(int(k))) {
			return
		}
		n, ok := r.takeSlots(ctx, !idle)
		if !ok {
			return
		}
		batch, err := r.src.Read(ctx, n)
		// A read that finds nothing blocks for seconds holding its slots.
		// While the stream is idle (at start, and after a read found
		// nothing) read one entry at a time: as it blocks, the other slots
		// stay free for reclaimed messages, which otherwise waited for
		// every block to end (bench/pipeline -modes reclaim). The first
		// entry of a burst then comes alone and the rest with the next
		// read, right after.
		idle = err == nil && len(batch) == 0
		r.consuming.Store(err == nil && ctx.Err() == nil)
		if err != nil && ctx.Err() == nil {
			fails++
			r.fail.failed(ctx, "stream read failed; retrying", fails, err)
		} else {
			if err == nil {
				r.fail.recovered(ctx, "stream read works again", fails)
			}
			fails = 0
		}
		r.ds.dispatch(ctx, batch...)
		for n -= len(batch); n > 0; n-- {
			<-r.ds.slots
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
func (r *reader) takeSlots(ctx context.Context, all bool) (int, bool) {
	slots := r.ds.slots
	select {
	case slots <- struct{}{}:
	case <-ctx.Done():
		return 0, false
	}
	if !all {
		return 1, true
	}
	n := 1 + freeSlots(slots)
	want := cap(slots) / 2
	if n >= want {
		return n, true
	}
	linger := time.NewTimer(readLinger)
	defer linger.Stop()
	for n < want {
		select {
		case slots <- struct{}{}:
			n += 1 + freeSlots(slots)
		case <-linger.C:
			return n, true
		case <-ctx.Done():
			for ; n > 0; n-- {
				<-slots
			}
			return 0, false
		}
	}
	return n, true
}

// readLinger is how long a busy worker waits for message slots to free
// before it reads fewer entries than half of them.
const readLinger = time.Millisecond

// freeSlots takes every message slot of slots free at this moment,
// without waiting, and returns how many it took.
func freeSlots(slots chan struct{}) int {
	for n := 0; ; n++ {
		select {
		case slots <- struct{}{}:
		default:
			return n
		}
	}
}
