// Package combine runs concurrent calls of one operation as batches (group
// commit): while a batch of a group is in flight, calls of that group queue,
// and the next batch takes them all at once, up to a limit. A call that finds
// its group idle yields the processor once and then runs with whatever
// queued meanwhile, so batching adds no timed wait.
//
// redisstate.Store uses it to run the claims and settlements of concurrent
// deliveries in one script call (docs/delivery.md#batched-transitions).
package combine

import (
	"context"
	"runtime"
	"slices"
	"sync"
	"time"
)

// Result is the result of one item of a batch.
type Result[R any] struct {
	Value R
	Err   error
}

// RunFunc runs one batch of items of one group and returns one Result per
// item, in order. ctx is detached from the callers' cancellation and
// carries the latest deadline among the calls, when all have one.
type RunFunc[K comparable, T, R any] func(ctx context.Context, group K, items []T) []Result[R]

// Combiner batches the calls of Do by group, a K. Safe for concurrent use.
type Combiner[K comparable, T, R any] struct {
	max int
	run RunFunc[K, T, R]

	mu     sync.Mutex
	groups map[K]*queue[T, R]
}

type queue[T, R any] struct {
	ops      []*op[T, R] // waiting, oldest first
	inFlight int         // items of the batch running
}

type op[T, R any] struct {
	ctx  context.Context
	item T
	res  Result[R]
	// done receives false when res is set, true when this call must run
	// the next batch of its group.
	done chan bool
}

// New returns a Combiner that runs batches of at most limit items (at least
// 1; 1 runs every call alone) with run.
func New[K comparable, T, R any](limit int, run RunFunc[K, T, R]) *Combiner[K, T, R] {
	return &Combiner[K, T, R]{max: max(limit, 1), run: run, groups: map[K]*queue[T, R]{}}
}

// Do runs item in a batch of its group and returns its result. When ctx
// ends while the item waits for a batch, Do returns ctx's error and the
// item does not run; when it ends while the item's batch is in flight, Do
// returns ctx's error and the item may or may not have been applied, as
// with any call cut short.
func (c *Combiner[K, T, R]) Do(ctx context.Context, group K, item T) (R, error) {
	o := &op[T, R]{ctx: ctx, item: item, done: make(chan bool, 1)}
	c.mu.Lock()
	q, busy := c.groups[group]
	if !busy {
		q = &queue[T, R]{}
		c.groups[group] = q
	}
	q.ops = append(q.ops, o)
	c.mu.Unlock()
	if busy {
		select {
		case lead := <-o.done:
			if !lead {
				return o.res.Value, o.res.Err
			}
		case <-ctx.Done():
			c.mu.Lock()
			select {
			case lead := <-o.done:
				c.mu.Unlock()
				if !lead {
					return o.res.Value, o.res.Err
				}
				// Made the leader: run the batch for the calls behind.
			default:
				// Holding mu, no hand-over can reach this call now.
				i := slices.Index(q.ops, o)
				if i >= 0 {
					q.ops = slices.Delete(q.ops, i, i+1)
				}
				c.mu.Unlock()
				var zero R
				return zero, ctx.Err() // not run, or in a batch in flight
			}
		}
	} else {
		// Calls made ready together (the deliveries of one read) reach
		// this point microseconds apart: yielding lets them queue behind
		// this one instead of each running alone. It yields again while
		// calls keep coming, a few times at most.
		c.gather(q)
	}
	c.lead(group, q)
	<-o.done
	return o.res.Value, o.res.Err
}

// maxYields bounds how often a leader yields for calls to queue behind it.
const maxYields = 4

// gather yields the processor until no call joined q during a yield,
// maxYields times at most, or q holds a full batch.
func (c *Combiner[K, T, R]) gather(q *queue[T, R]) {
	c.mu.Lock()
	n := len(q.ops)
	c.mu.Unlock()
	for range maxYields {
		runtime.Gosched()
		c.mu.Lock()
		m := len(q.ops)
		c.mu.Unlock()
		if m == n || m >= c.max {
			return
		}
		n = m
	}
}

// lead runs the next batch of q, which holds the leader's own item first,
// and hands the group on to the oldest waiting call, or frees it.
func (c *Combiner[K, T, R]) lead(group K, q *queue[T, R]) {
	c.mu.Lock()
	n := min(len(q.ops), c.max)
	batch := slices.Clone(q.ops[:n])
	q.ops = slices.Delete(q.ops, 0, n)
	q.inFlight = n
	c.mu.Unlock()

	items := make([]T, n)
	for i, o := range batch {
		items[i] = o.item
	}
	ctx, cancel := batchContext(batch)
	res := c.run(ctx, group, items)
	cancel()
	for i, o := range batch {
		if i < len(res) {
			o.res = res[i]
		} else {
			o.res.Err = errShortRun
		}
		o.done <- false
	}

	c.mu.Lock()
	q.inFlight = 0
	if len(q.ops) == 0 {
		delete(c.groups, group)
	} else {
		next := q.ops[0]
		next.done <- true
	}
	c.mu.Unlock()
}

// batchContext is the context a batch runs under (Detached of its calls').
func batchContext[T, R any](batch []*op[T, R]) (context.Context, context.CancelFunc) {
	ctxs := make([]context.Context, len(batch))
	for i, o := range batch {
		ctxs[i] = o.ctx
	}
	return Detached(ctxs)
}

// Detached is the context one call made on behalf of several callers runs
// under: the values of the first of ctxs, no cancellation (one caller
// giving up must not fail the others), and the latest deadline of ctxs
// when every one has a deadline. ctxs must not be empty.
func Detached(ctxs []context.Context) (context.Context, context.CancelFunc) {
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

type shortRunError struct{}

func (shortRunError) Error() string { return "combine: batch returned fewer results than items" }

var errShortRun error = shortRunError{}

// Pending returns how many calls of group are unanswered: the items of the
// batch in flight plus the calls waiting behind it.
func (c *Combiner[K, T, R]) Pending(group K) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if q := c.groups[group]; q != nil {
		return q.inFlight + len(q.ops)
	}
	return 0
}
