package relay

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/relaydev/relay/invocation"
)

// The one batching layer (docs/delivery.md#batched-transitions): the
// claims of concurrent deliveries go to the StateStore together, in one
// Claim call, and so do their settlements, in one Settle call. The stores
// do not batch again; they only cut a long batch into script calls of
// their size, sent together.
//
// When a call finds no batch of its kind in flight, it leads the next
// one: it waits until no other delivery is about to join (activity), at
// most SettleLinger, then takes every call queued meanwhile, up to
// maxBatch. Calls that arrive while a batch is in flight queue for the
// next. A claim waits for the deliveries still deciding what to claim; a
// settlement also waits for those whose claims are in flight, whose
// handlers may end at once, but never for a handler that runs or a
// delivery that waits for a slot. So the messages of one read go to Redis
// together, a lone event never waits for company, and a slow handler
// holds no other message's acknowledgement.

// maxBatch bounds the claims, or settlements, of one call.
const maxBatch = 64

// activity counts what the deliveries of an Engine are doing, for the
// leaders of batches to tell whether more calls are coming (batcher.wait).
// Safe for concurrent use.
type activity struct {
	mu sync.Mutex
	// running counts the deliveries on a processor: deciding, matching,
	// building what to write. claiming counts those waiting for a claim,
	// handling those running a handler, the latest of which started at
	// lastRun.
	running, claiming, handling int
	lastRun                     time.Time
	// changed, made when a leader waits, is closed when a count falls.
	changed chan struct{}
}

func newActivity() *activity { return &activity{} }

// add changes the running and claiming counts by dr and dc.
func (a *activity) add(dr, dc int) {
	a.mu.Lock()
	a.running += dr
	a.claiming += dc
	if (dr < 0 || dc < 0) && a.changed != nil {
		close(a.changed)
		a.changed = nil
	}
	a.mu.Unlock()
}

// block marks a running delivery as waiting for something that takes time
// (a handler, a slot, a read of Redis) and returns what marks it running
// again.
func (a *activity) block() (unblock func()) {
	a.add(-1, 0)
	return func() { a.add(1, 0) }
}

// handle marks a running delivery as running a handler, until handled
// marks it running again.
func (a *activity) handle() {
	a.mu.Lock()
	a.running--
	a.handling++
	a.lastRun = time.Now()
	if a.changed != nil {
		close(a.changed)
		a.changed = nil
	}
	a.mu.Unlock()
}

func (a *activity) handled() {
	a.mu.Lock()
	a.running++
	a.handling--
	a.mu.Unlock()
}

// runGrace is how long a handler that just started still counts as about
// to settle: a Go function often returns within microseconds, and its
// settlement then joins the batch of the deliveries read with it.
const runGrace = 2 * time.Millisecond

// quiet reports whether no delivery is about to join a batch of claims
// (claims) or of settlements, and returns what is closed when that may
// have changed, and, when only a handler that just started holds the
// batch, how long until it no longer does.
func (a *activity) quiet(claims bool) (bool, <-chan struct{}, time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var grace time.Duration
	if !claims && a.handling > 0 {
		grace = runGrace - time.Since(a.lastRun)
	}
	if a.running == 0 && (claims || a.claiming == 0) && grace <= 0 {
		return true, nil, 0
	}
	if a.changed == nil {
		a.changed = make(chan struct{})
	}
	return false, a.changed, max(grace, 0)
}

// batcher gathers the calls of concurrent deliveries into batches of one
// operation (claims or settlements) run by run. Safe for concurrent use.
type batcher[T, R any] struct {
	claims bool // gathers claims; else settlements
	act    *activity
	linger time.Duration
	run    func(ctx context.Context, items []T) []batchResult[R]

	// calls recycles the calls answered, so a call allocates nothing.
	calls sync.Pool

	mu       sync.Mutex
	queue    []*batchCall[T, R]
	inFlight bool
	// timer bounds the leader's wait; there is one leader at a time.
	timer *time.Timer
}

// batchResult is one item's result in a batch.
type batchResult[R any] struct {
	value R
	err   error
}

// batchCall is one delivery's call, queued or in flight.
type batchCall[T, R any] struct {
	ctx  context.Context
	item T
	res  batchResult[R]
	// done receives false when res is set, true when this call must lead
	// the next batch.
	done chan bool
	// left is set when the caller returned before its result, ctx ended.
	left bool
}

// do runs item in a batch and returns its result. The caller is a running
// delivery: it counts as waiting until the batch answers. When ctx ends
// while the item waits for a batch, do returns ctx's error and the item
// does not run; when it ends while the item's batch is in flight, do
// returns ctx's error and the item may or may not have been applied, as
// with any call cut short.
func (b *batcher[T, R]) do(ctx context.Context, item T) (R, error) {
	c, _ := b.calls.Get().(*batchCall[T, R])
	if c == nil {
		c = &batchCall[T, R]{done: make(chan bool, 1)}
	}
	c.ctx, c.item = ctx, item
	if b.claims {
		b.act.add(-1, 1)
	} else {
		b.act.add(-1, 0)
	}
	b.mu.Lock()
	b.queue = append(b.queue, c)
	lead := !b.inFlight && len(b.queue) == 1
	if lead {
		b.inFlight = true // led by c, from its wait on
	}
	b.mu.Unlock()
	if !lead {
		select {
		case lead = <-c.done:
			if !lead {
				return b.answer(c)
			}
		case <-ctx.Done():
			return b.leave(c)
		}
	}
	b.wait()
	b.flush()
	<-c.done
	return b.answer(c)
}

// answer returns c's result and recycles c: once its done channel said
// so, no batch refers to it any more.
func (b *batcher[T, R]) answer(c *batchCall[T, R]) (R, error) {
	v, err := c.res.value, c.res.err
	*c = batchCall[T, R]{done: c.done}
	b.calls.Put(c)
	return v, err
}

// leave takes c, whose context ended, out of its queue or batch, and
// returns ctx's error, unless it was answered or made leader meanwhile.
func (b *batcher[T, R]) leave(c *batchCall[T, R]) (R, error) {
	b.mu.Lock()
	select {
	case lead := <-c.done:
		b.mu.Unlock()
		if !lead {
			return c.res.value, c.res.err
		}
		// Made leader as ctx ended: lead the calls behind.
		b.wait()
		b.flush()
		<-c.done
		return c.res.value, c.res.err
	default:
	}
	c.left = true
	if i := slices.Index(b.queue, c); i >= 0 {
		b.queue = slices.Delete(b.queue, i, i+1)
	}
	b.mu.Unlock()
	b.running(1)
	var zero R
	return zero, c.ctx.Err()
}

// running marks n callers running again.
func (b *batcher[T, R]) running(n int) {
	if b.claims {
		b.act.add(n, -n)
	} else {
		b.act.add(n, 0)
	}
}

// wait is the leader's wait for the calls about to join: until no
// delivery is about to, SettleLinger at most.
func (b *batcher[T, R]) wait() {
	end := time.Now().Add(b.linger)
	for {
		quiet, changed, grace := b.act.quiet(b.claims)
		if quiet {
			return
		}
		wait := time.Until(end)
		if wait <= 0 {
			return
		}
		if grace > 0 && grace < wait {
			wait = grace
		}
		if b.timer == nil {
			b.timer = time.NewTimer(wait)
		} else {
			b.timer.Reset(wait)
		}
		select {
		case <-changed:
			b.timer.Stop()
		case <-b.timer.C:
		}
	}
}

// flush runs the next batch, whose leader is queued, answers its calls,
// and hands the lead to the oldest call queued since, or frees it.
func (b *batcher[T, R]) flush() {
	b.mu.Lock()
	n := min(len(b.queue), maxBatch)
	batch := slices.Clone(b.queue[:n])
	b.queue = slices.Delete(b.queue, 0, n)
	b.mu.Unlock()

	items := make([]T, n)
	ctxs := make([]context.Context, n)
	for i, c := range batch {
		items[i], ctxs[i] = c.item, c.ctx
	}
	var res []batchResult[R]
	if n > 0 {
		ctx, cancel := detached(ctxs)
		res = b.run(ctx, items)
		cancel()
	}

	b.mu.Lock()
	waiting := 0
	for i, c := range batch {
		if i < len(res) {
			c.res = res[i]
		} else {
			c.res.err = errShortReply
		}
		if !c.left {
			waiting++
		}
	}
	// Every caller runs again before any is told: a leader of the other
	// kind must not find the Engine quiet in between.
	b.running(waiting)
	for _, c := range batch {
		c.done <- false
	}
	if len(b.queue) > 0 {
		b.queue[0].done <- true
	} else {
		b.inFlight = false
	}
	b.mu.Unlock()
}

// detached is the context one call made on behalf of several callers runs
// under: the values of the first of ctxs, no cancellation (one caller
// giving up must not fail the others), and the latest deadline of ctxs
// when every one has a deadline. ctxs must not be empty.
func detached(ctxs []context.Context) (context.Context, context.CancelFunc) {
	if shared(ctxs) {
		// They end together (the writes of a moment share one deadline,
		// persist.go): none gives up before the others.
		return ctxs[0], func() {}
	}
	var latest time.Time
	for _, c := range ctxs {
		d, ok := c.Deadline()
		if !ok {
			return context.WithoutCancel(ctxs[0]), func() {}
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(ctxs[0]), latest)
}

// shared reports whether every one of ctxs ends when the first does and
// only then: one Done channel and one deadline.
func shared(ctxs []context.Context) bool {
	done := ctxs[0].Done()
	d, _ := ctxs[0].Deadline()
	for _, c := range ctxs[1:] {
		if e, _ := c.Deadline(); c.Done() != done || !e.Equal(d) {
			return false
		}
	}
	return done != nil
}

// newClaims batches the claims of state.
func newClaims(state StateStore, act *activity, linger time.Duration) *batcher[invocation.ClaimRequest, invocation.Claim] {
	return &batcher[invocation.ClaimRequest, invocation.Claim]{claims: true, act: act, linger: linger,
		run: func(ctx context.Context, reqs []invocation.ClaimRequest) []batchResult[invocation.Claim] {
			res := state.Claim(ctx, reqs)
			out := make([]batchResult[invocation.Claim], min(len(res), len(reqs)))
			for i := range out {
				out[i] = batchResult[invocation.Claim]{value: res[i].Claim, err: res[i].Err}
			}
			return out
		}}
}

// newSettles batches the settlements of state.
func newSettles(state StateStore, act *activity, linger time.Duration) *batcher[invocation.Settlement, []invocation.TransitionResult] {
	return &batcher[invocation.Settlement, []invocation.TransitionResult]{act: act, linger: linger,
		run: func(ctx context.Context, ss []invocation.Settlement) []batchResult[[]invocation.TransitionResult] {
			res := state.Settle(ctx, ss)
			out := make([]batchResult[[]invocation.TransitionResult], min(len(res), len(ss)))
			for i := range out {
				out[i] = batchResult[[]invocation.TransitionResult]{value: res[i].Transitions, err: res[i].Err}
				if res[i].Err == nil && len(res[i].Transitions) != len(ss[i].Transitions) {
					out[i].err = errShortReply
				}
			}
			return out
		}}
}

// errShortReply is the error of a claim or settlement the StateStore
// returned no result for: a broken implementation.
var errShortReply = shortReplyError{}

type shortReplyError struct{}

func (shortReplyError) Error() string {
	return "relay: the StateStore returned fewer results than it was given claims or settlements, or fewer than a settlement's transitions"
}
