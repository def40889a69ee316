package relay

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/invocation"
)

// writeCtx returns a context for one write that records what a delivery
// did: it has ctx's values, survives the worker's stop (a stopping worker
// still records what its handlers did) and ends after the write timeout,
// or up to maxDeadlineSlack later (sharedDeadlines). Its timer is shared:
// there is nothing to cancel.
func (p *pipeline) writeCtx(ctx context.Context) context.Context {
	return p.writeEnds.with(ctx, context.Background(), time.Now().Add(p.cfg.WriteTimeout), deadlineSlack(p.cfg.WriteTimeout))
}

// persist runs an idempotent or fenced write until it succeeds, fails with
// a contract error (invocation.ErrStale, ErrTerminal), or the write timeout
// passes, backing off between tries: a Redis blip as a handler finishes
// must not turn its recorded outcome into a lost one. A fenced write whose
// earlier try applied but whose reply was lost comes back ErrStale; the
// message then stays pending and the next delivery's Claim reads the truth.
func (p *pipeline) persist(ctx context.Context, op func(context.Context) error) error {
	return retryWrite(p.writeCtx(ctx), op, p.pause)
}

// persistSuccess is persist for the record of a handler's success, which
// is worth waiting longer for: a success that is not recorded makes the
// lease expire and count as a failed attempt, so the handler runs again or
// is dead-lettered. While this delivery retries, its message stays owned
// and heartbeated, so no other delivery claims the invocation, and the
// fenced write still applies when Redis is back. It retries until the
// lease's deadline plus MinPendingIdle (at least the write timeout), or
// until the worker abandons running work (handlerCtx).
func (p *pipeline) persistSuccess(ctx, handlerCtx context.Context, l invocation.Lease, op func(context.Context) error) error {
	patience := max(p.cfg.WriteTimeout, time.Until(l.Deadline)+p.cfg.MinPendingIdle)
	return retryWrite(p.successEnds.with(ctx, handlerCtx, time.Now().Add(patience), deadlineSlack(patience)), op, p.pause)
}

// maxDeadlineSlack is how much later than asked a write's context may end
// (sharedDeadlines).
const maxDeadlineSlack = 10 * time.Millisecond

// deadlineSlack is the slack of a write bounded by d: maxDeadlineSlack, or
// 1/64 of a shorter d.
func deadlineSlack(d time.Duration) time.Duration { return min(d/64, maxDeadlineSlack) }

// sharedDeadlines gives the writes of many deliveries one timer: a context
// with its own deadline per write (context.WithTimeout) cost a timer, a
// channel and four allocations each, several times per delivery
// (bench/RESULTS.md). A write's context instead carries the values of its
// delivery's context and the end of a shared one, which ends when its
// parent does or at a deadline up to the slack after the write's own; a new
// shared context is made when the last one ends too early or too late for
// the write. A shared context is never cancelled before its deadline, as
// writes still use it; its timer then releases it. Safe for concurrent use.
type sharedDeadlines struct {
	cur atomic.Pointer[sharedEnd]
}

type sharedEnd struct {
	parent context.Context
	ctx    context.Context
	end    time.Time
}

// with returns a context with the values of ctx that ends when parent does,
// or between end and end+slack.
func (s *sharedDeadlines) with(ctx, parent context.Context, end time.Time, slack time.Duration) context.Context {
	cur := s.cur.Load()
	if cur == nil || cur.parent != parent || cur.end.Before(end) || cur.end.After(end.Add(slack)) {
		dctx, cancel := context.WithDeadline(parent, end.Add(slack))
		_ = cancel // released by its timer: writes may still hold it
		cur = &sharedEnd{parent: parent, ctx: dctx, end: end.Add(slack)}
		s.cur.Store(cur)
	}
	return endsWith{values: context.WithoutCancel(ctx), ends: cur.ctx}
}

// endsWith is a context with the values of one context and the deadline,
// cancellation and error of another.
type endsWith struct {
	// values never reports a cancellation of its own: it is a
	// context.WithoutCancel, so context.Cause finds no cancelCtx in it and
	// falls back to Err.
	values context.Context
	ends   context.Context
}

func (c endsWith) Deadline() (time.Time, bool) { return c.ends.Deadline() }
func (c endsWith) Done() <-chan struct{}       { return c.ends.Done() }
func (c endsWith) Err() error                  { return c.ends.Err() }
func (c endsWith) Value(key any) any           { return c.values.Value(key) }

// AfterFunc lets context.AfterFunc, and the contexts derived from c, wait for
// its end without a goroutine of their own.
func (c endsWith) AfterFunc(f func()) (stop func() bool) { return context.AfterFunc(c.ends, f) }

// pause waits d before a write is tried again, the delivery counting as
// waiting meanwhile (batch.go); false when ctx ended first.
func (p *pipeline) pause(ctx context.Context, d time.Duration) bool {
	defer p.act.block()()
	return ctxtime.Sleep(ctx, d)
}

// retryWrite runs op until it succeeds, fails with a contract error, or
// octx ends, waiting with pause between tries.
func retryWrite(octx context.Context, op func(context.Context) error, pause func(context.Context, time.Duration) bool) error {
	for tries := 1; ; tries++ {
		err := op(octx)
		if errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
			if tries > 1 {
				return retriedWrite{err}
			}
			return err
		}
		if err == nil {
			return nil
		}
		if !pause(octx, retryDelay(tries)) {
			return err
		}
	}
}

// retriedWrite is ErrStale or ErrTerminal met by a write that was tried
// again after an error: the earlier try, whose reply was lost (Redis
// stalled, the connection dropped), may itself have applied the write, so
// the refusal need not mean that another delivery took over.
type retriedWrite struct{ error }

func (e retriedWrite) Unwrap() error { return e.error }

// retryDelay is a jittered exponential backoff for infrastructure errors:
// 100ms doubling to 5s.
func retryDelay(fails int) time.Duration {
	d := 100 * time.Millisecond << min(fails-1, 6)
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}
