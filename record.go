package relay

import (
	"context"
	"errors"
	"fmt"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// attempt is one invocation after the invoke stage: its outcome so far
// and, when a handler ran, the transition that records how it ended.
type attempt struct {
	o     Outcome
	c     call
	lease invocation.Lease
	// next is the transition to record; 0 when nothing ran, and o is
	// final.
	next transition
}

// transition is what recording one attempt does to its invocation's state
// (docs/delivery.md#attempts-retries-backoff), decided by nextTransition
// from how the run ended alone.
type transition int

const (
	// finish: the handler succeeded; record ok (State.Finish, or
	// Settler.FinishSettle when it settles the message).
	finish transition = iota + 1
	// retryAt: it failed with attempts left; record the failure and the
	// next attempt's due time, now plus the backoff (State.ScheduleRetry).
	retryAt
	// exhaust: it failed its last attempt, or failed permanently; record
	// exhaustion, then write and mark its dead-letter entry.
	exhaust
	// giveBack: the runtime could not run it, or the shutdown timeout
	// stopped it; give the attempt back uncharged (State.Release).
	giveBack
	// keepLease: its outcome is unknown (runtime.ErrOutcomeUnknown); keep
	// the claim, whose lease expiry charges the attempt, rather than start
	// it again uncharged.
	keepLease
)

// nextTransition is the transition an attempt that ran with outcome o and
// runner error err calls for.
func nextTransition(o Outcome, err error) transition {
	switch o.Result {
	case ResultSuccess:
		return finish
	case ResultFailure, ResultTimeout, ResultOOM:
		if o.Attempt >= o.MaxAttempts || permanent(err) {
			return exhaust
		}
		return retryAt
	}
	if errors.Is(err, runtime.ErrOutcomeUnknown) {
		return keepLease
	}
	return giveBack
}

// permanent reports whether the handler said its failure is permanent
// (runtime.ExitPermanent, runtime.Permanent): the invocation is exhausted
// at this attempt, never retried (docs/delivery.md#permanent-failures).
func permanent(err error) bool {
	exit, ok := errors.AsType[*runtime.ExitError](err)
	return ok && exit.IsPermanent()
}

// record is the fourth stage: it writes a's transition and returns the
// invocation's outcome. A success goes through finishWith; the settle
// stage records the success of a message's last attempt itself, to fuse it
// with the acknowledgement.
func (e *Engine) record(ctx context.Context, d *delivery, a *attempt) Outcome {
	o, l := a.o, a.lease
	switch a.next {
	case finish:
		return e.finishWith(ctx, d, a, func(octx context.Context) error { return e.c.State.Finish(octx, l) })
	case exhaust:
		if err := e.persist(ctx, func(octx context.Context) error { return e.c.State.Exhaust(octx, l) }); err != nil {
			o.failed(OpExhaust, err)
			return o
		}
		e.deadLetter(ctx, d, l, e.entry(d, a.c.app, a.c.handler, l.Attempt, o.Err.Error(), dlqTrace(o.span)), &o)
	case retryAt:
		err := e.persist(ctx, func(octx context.Context) (err error) {
			o.Next, err = e.c.State.ScheduleRetry(octx, l, invocation.Backoff(e.cfg.Backoff, l.Attempt))
			return err
		})
		if err != nil {
			o.failed(OpRetry, err)
			return o
		}
		o.Kind = Retrying
	case keepLease:
		o.Kind = OutcomeUnknown
	case giveBack:
		// Not the handler's fault: no attempt is charged and the message
		// stays pending.
		o.Kind = NotRun
		if d.handlerCtx.Err() != nil {
			o.Kind = Stopping
		}
		if err := e.release(ctx, l); err != nil {
			// Given back later, once the store answers (unsettled.go).
			o.WriteErr = &WriteError{Op: OpRelease, Err: err}
		}
	}
	return o
}

// finishWith records a's success through write, with the patience of
// persistSuccess.
func (e *Engine) finishWith(ctx context.Context, d *delivery, a *attempt, write func(context.Context) error) Outcome {
	o := a.o
	if err := e.persistSuccess(ctx, d.handlerCtx, a.lease, write); err != nil {
		// The handler ran; without the record its lease expires and
		// counts as a failed attempt.
		o.failed(OpFinish, err)
		return o
	}
	o.Kind = Succeeded
	return o
}

// release gives attempt l back uncharged. When that fails for another
// reason than a contract error, l is given back later, once the store
// answers (unsettled.go), rather than left to expire into a charged
// attempt; the error then says so.
func (e *Engine) release(ctx context.Context, l invocation.Lease) error {
	err := e.persist(ctx, func(octx context.Context) error { return e.c.State.Release(octx, l) })
	if err != nil && !errors.Is(err, invocation.ErrStale) && !errors.Is(err, invocation.ErrTerminal) && e.unsettle(l) {
		err = fmt.Errorf("%w (the attempt is given back once the store answers)", err)
	}
	return err
}
