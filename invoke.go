package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// invoke is the third stage: it takes one invocation through one step of
// its lifecycle (docs/delivery.md#attempts-retries-backoff) and returns
// what happened. When the invocation is due it claims the next attempt,
// runs the handler in a concurrency slot and records the result: success,
// a retry, or exhaustion and its dead-letter entry. Otherwise it returns why
// it did not run: the invocation is finished, leased elsewhere, not due, or
// cannot start now (app unavailable, no slot, shutting down), in which case
// it stays recorded uncharged for its redelivery.
// With settle set, the invocation is the last of its message still to
// finish, after terminal ones: its success also acknowledges the message
// (Settler.FinishSettle) when the Engine has a Settler.
func (e *Engine) invoke(ctx, runCtx context.Context, d *delivery, c call, settle bool) Outcome {
	o := Outcome{App: c.app, Handler: c.handler, MaxAttempts: c.retries + 1}
	a := d.gen.apps.Get(c.app)
	switch {
	case !a.Available():
		o.Kind, o.Err = Unavailable, a.Errors.Err()
		return e.notStarted(ctx, d, c, o)
	case ctx.Err() != nil:
		o.Kind = Stopping // start nothing new
		return e.notStarted(ctx, d, c, o)
	}
	l, held, o, ok := e.start(ctx, d, a, c, o)
	if !ok {
		return o
	}
	ctx, o.span = telemetry.StartAttempt(ctx, e.tracer, c.app, c.handler, d.msg.ID, l.Attempt, o.MaxAttempts, l.Trace)
	// The lineage goes with every transition that ends the attempt
	// unsuccessfully, so the next attempt links to this one.
	l = withLineage(l, o.span)
	o.Attempt = l.Attempt
	err := e.run(runCtx, d, a, c, l, &o)
	held.release()
	return e.record(ctx, runCtx, d, c, l, o, err, settle)
}

// lease is how long an attempt of c may run before it counts as lost: its
// timeout plus the grace that covers the runtime's setup and teardown. A
// live attempt must never look expired to another delivery.
func (e *Engine) lease(c call) time.Duration { return c.timeout + e.cfg.LeaseGrace }

// start takes a concurrency slot and claims the next attempt, in the order
// that never charges an attempt for a wait: a first delivery has no state,
// so its claim can only be attempt 1, and it takes the slot first; a
// redelivery, which may find state, claims first and, when it must wait for
// a slot, gives the claim back, waits, and claims again with the slot in
// hand. Were the worker to die while waiting with a claim held, the lease
// would expire and count as a failed attempt although nothing ran. ok
// reports a claimed attempt (its lease, with PrevTrace in Lease.Trace) and a
// held slot; otherwise o says why not.
func (e *Engine) start(ctx context.Context, d *delivery, a *app.App, c call, o Outcome) (l invocation.Lease, held slots, _ Outcome, ok bool) {
	var cl invocation.Claim
	if d.msg.Deliveries < 2 {
		if held, ok = e.cfg.Limiter.tryAcquire(a); !ok {
			o.Waited = true
			if held, ok = e.cfg.Limiter.waitAcquire(ctx, a, e.cfg.ConcurrencyWait); !ok {
				return l, slots{}, e.notStarted(ctx, d, c, noSlot(ctx, o)), false
			}
		}
		if cl, o, ok = e.claimInTime(ctx, d, c, o); !ok {
			held.release()
			return l, slots{}, o, false
		}
		return leaseOf(cl), held, o, true
	}
	if cl, o, ok = e.claimInTime(ctx, d, c, o); !ok {
		return l, slots{}, o, false
	}
	if held, ok = e.cfg.Limiter.tryAcquire(a); ok {
		return leaseOf(cl), held, o, true
	}
	o.Waited = true
	if err := e.release(ctx, leaseOf(cl)); err != nil {
		// The claim stays; its lease expires and counts as an attempt.
		o.Kind, o.Op, o.Err = WriteFailed, "release", err
		return l, slots{}, o, false
	}
	if held, ok = e.cfg.Limiter.waitAcquire(ctx, a, e.cfg.ConcurrencyWait); !ok {
		return l, slots{}, noSlot(ctx, o), false
	}
	if cl, o, ok = e.claimInTime(ctx, d, c, o); !ok {
		held.release()
		return l, slots{}, o, false
	}
	return leaseOf(cl), held, o, true
}

// claimInTime is claimToRun for an attempt about to run, which it gives
// back uncharged (NotRun, errLateClaim) when the claim took half the lease
// grace or more to come back: a worker stalled that long, or a reply held
// up, may have let so much of the lease pass, counted from the claim's
// execution on Redis, that the run would outlive it, and another delivery
// would then charge the attempt while it runs, or even start the next
// (docs/delivery.md#leases). Half the grace stays for the runtime's
// teardown and the outcome's write. Measured from before the claim was
// asked for, on this process's monotonic clock, it needs no clock shared
// with Redis.
func (e *Engine) claimInTime(ctx context.Context, d *delivery, c call, o Outcome) (invocation.Claim, Outcome, bool) {
	asked := time.Now()
	cl, o, ok := e.claimToRun(ctx, d, c, o)
	if !ok {
		return cl, o, false
	}
	took := time.Since(asked)
	if took < e.cfg.LeaseGrace/2 {
		return cl, o, true
	}
	o.Kind, o.Attempt, o.Err = NotRun, cl.Lease.Attempt, fmt.Errorf("%w: the claim took %v, half the lease grace (%v) or more",
		errLateClaim, took.Round(time.Millisecond), e.cfg.LeaseGrace)
	if err := e.release(ctx, leaseOf(cl)); err != nil {
		// The lease then expires and counts as a failed attempt.
		o.Op, o.WriteErr = "release", err
	}
	return cl, o, false
}

// errLateClaim is the error of an attempt claimInTime gave back.
var errLateClaim = errors.New("attempt given back before it ran: its lease may not cover the run")

// noSlot is o for a wait for a slot that ended without one.
func noSlot(ctx context.Context, o Outcome) Outcome {
	o.Kind = NoSlot
	if ctx.Err() != nil {
		o.Kind = Stopping
	}
	return o
}

// leaseOf is the claim's lease, carrying the previous attempt's lineage in
// Trace until the attempt's own span replaces it.
func leaseOf(c invocation.Claim) invocation.Lease {
	l := c.Lease
	l.Trace = c.PrevTrace
	return l
}

// claim asks the state store for the next attempt of field, adding to o an
// attempt the claim found lost. A store error fails closed
// (docs/delivery.md#claim-errors-fail-closed): o becomes WriteFailed, the
// handler is not run and the message stays pending, since running a
// duplicate could race a worker that won the same claim.
func (e *Engine) claim(ctx context.Context, d *delivery, field string, lease time.Duration, maxAttempts int, o Outcome) (invocation.Claim, Outcome, error) {
	octx, cancel := e.detached(ctx)
	defer cancel()
	var rec invocation.Record
	if i := slices.Index(d.record, field); i >= 0 {
		// The others, in order; a message of one invocation allocates
		// nothing for them.
		others := append(make([]string, 0, len(d.record)-1), d.record[:i]...)
		rec = invocation.Record{Fields: append(others, d.record[i+1:]...), Complete: d.recordComplete}
	}
	cl, err := e.c.State.Claim(octx, d.key, field, lease, maxAttempts, rec)
	if err != nil {
		e.claimFails.Add(1)
		o.Kind, o.Op, o.Err = WriteFailed, "claim", err
		return cl, o, err
	}
	if e.claimFails.Load() != 0 {
		e.claimFails.Store(0)
	}
	d.record = nil // recorded
	if cl.Lost > 0 {
		o.Lost = cl.Lost
	}
	return cl, o, nil
}

// claimToRun claims the next attempt of c. ok reports a claimed attempt;
// otherwise the claim's status is turned into o: finished, leased
// elsewhere, not due, or exhausted, in which case the dead-letter entry the
// earlier delivery could not write is written now.
func (e *Engine) claimToRun(ctx context.Context, d *delivery, c call, o Outcome) (invocation.Claim, Outcome, bool) {
	cl, o, err := e.claim(ctx, d, c.field(), e.lease(c), o.MaxAttempts, o)
	if err != nil {
		return cl, o, false
	}
	if cl.Status == invocation.Claimed {
		return cl, o, true
	}
	o.Attempt = cl.Lease.Attempt
	switch cl.Status {
	case invocation.Succeeded, invocation.DeadLettered, invocation.Terminal:
		o.Kind = Done
	case invocation.Running:
		// A reclaimed message whose attempt is still leased: its worker
		// may be alive elsewhere, or dead, in which case the attempt is
		// charged when the lease ends.
		o.Kind, o.Next = Leased, cl.RunningUntil
	case invocation.NotDue:
		o.Kind, o.Next = NotDue, cl.NextAttemptAt
	case invocation.Exhausted:
		// A previous delivery exhausted it (or its last lease expired) but
		// the DLQ entry is not recorded yet.
		reason := fmt.Sprintf("exhausted after %s (the last attempt's outcome was not recorded: its worker stopped, Redis was unreachable when it finished, or its DLQ write failed)", plural.Of(cl.Lease.Attempt, "attempt"))
		o = e.deadLetter(ctx, d, cl.Lease, e.entry(d, c.app, c.handler, cl.Lease.Attempt, reason, e.prevTrace(cl, d)), o)
	default:
		o.Kind, o.Op, o.Err = WriteFailed, "claim", fmt.Errorf("unknown claim status %d", int(cl.Status))
	}
	return cl, o, false
}

// prevTrace is the lineage a dead-letter entry written from a claim links
// to: the last attempt's, or the delivery's when none was stored.
func (e *Engine) prevTrace(cl invocation.Claim, d *delivery) string {
	if cl.PrevTrace != "" {
		return cl.PrevTrace
	}
	return dlqTrace(d.span)
}

// notStarted leaves an invocation that does not start now (o.Kind says
// why) recorded, uncharged, as next_attempt_at:<now>:<attempts used>, so its
// redelivery drives it even if the event no longer matches its rule (a now()
// cutoff passed). When the claim shows the invocation did not need to run
// (finished, leased, not due, exhausted) that is the outcome instead.
func (e *Engine) notStarted(ctx context.Context, d *delivery, c call, o Outcome) Outcome {
	cl, claimed, ok := e.claimToRun(ctx, d, c, o)
	if !ok {
		return claimed
	}
	o.Lost = claimed.Lost
	if err := e.release(ctx, leaseOf(cl)); err != nil {
		o.Op, o.WriteErr = "record", err
	}
	return o
}

// run runs attempt l of c under runCtx, which outlives the Engine's stop by
// the shutdown timeout; it fills o's result and duration and returns the
// runner's error.
func (e *Engine) run(runCtx context.Context, d *delivery, a *app.App, c call, l invocation.Lease, o *Outcome) error {
	req := runtime.Request{
		App: a.Name, Handler: c.handler, MessageID: d.msg.ID, Attempt: l.Attempt,
		Event: c.input, Timeout: c.timeout, Spec: a.Spec,
		// The handler continues the attempt's trace.
		Env: telemetry.HandlerEnv(o.span.SpanContext()),
	}
	e.m.inFlight.Inc()
	start := time.Now()
	_, err := e.c.Runner.Run(trace.ContextWithSpan(runCtx, o.span), req)
	o.Duration = time.Since(start)
	e.m.inFlight.Dec()
	o.Result, o.Err = ResultOf(err), err
	return err
}

// ResultOf is the Result of a Runner's error: how the attempt ended.
func ResultOf(err error) Result {
	exit, isExit := errors.AsType[*runtime.ExitError](err)
	switch {
	case err == nil:
		return ResultSuccess
	case isExit && exit.TimedOut:
		return ResultTimeout
	case isExit && exit.OOMKilled:
		return ResultOOM
	case isExit:
		return ResultFailure
	case errors.Is(err, runtime.ErrUnavailable):
		return ResultUnavailable
	}
	return ResultError
}

// record writes what attempt l's run (runErr) means for the invocation: ok,
// the next attempt's due time, or exhaustion and the dead-letter entry; or,
// when the handler could not run, gives the attempt back uncharged.
func (e *Engine) record(ctx, runCtx context.Context, d *delivery, c call, l invocation.Lease, o Outcome, runErr error, settle bool) Outcome {
	switch o.Result {
	case ResultSuccess:
		finish := func(octx context.Context) error { return e.c.State.Finish(octx, l) }
		if settle && e.c.Settler != nil {
			finish = func(octx context.Context) error { return e.c.Settler.FinishSettle(octx, l, e.cfg.Retention) }
			o.Settled = true
		}
		err := e.persistSuccess(ctx, runCtx, l, finish)
		if err != nil {
			// The handler ran; without the record its lease expires and
			// counts as a failed attempt.
			o.Kind, o.Op, o.Err, o.Settled = WriteFailed, "finish", err, false
			return o
		}
		o.Kind = Succeeded
		return o
	case ResultFailure, ResultTimeout, ResultOOM:
		if l.Attempt >= o.MaxAttempts {
			if err := e.persist(ctx, func(octx context.Context) error { return e.c.State.Exhaust(octx, l) }); err != nil {
				o.Kind, o.Op, o.WriteErr = WriteFailed, "exhaust", err
				return o
			}
			return e.deadLetter(ctx, d, l, e.entry(d, c.app, c.handler, l.Attempt, runErr.Error(), dlqTrace(o.span)), o)
		}
		err := e.persist(ctx, func(octx context.Context) (err error) {
			o.Next, err = e.c.State.ScheduleRetry(octx, l, invocation.Backoff(e.cfg.Backoff, l.Attempt))
			return err
		})
		if err != nil {
			o.Kind, o.Op, o.WriteErr = WriteFailed, "retry", err
			return o
		}
		o.Kind = Retrying
		return o
	}
	if errors.Is(runErr, runtime.ErrOutcomeUnknown) {
		// The handler may have run: keep the claim, whose lease expiry
		// counts the attempt, rather than start it again uncharged.
		o.Kind = OutcomeUnknown
		return o
	}
	// Infrastructure failure or shutdown: not the handler's fault, so no
	// attempt is charged and the message stays pending.
	o.Kind = NotRun
	if runCtx.Err() != nil {
		o.Kind = Stopping
	}
	if err := e.release(ctx, l); err != nil {
		// The lease then expires and counts as a failed attempt.
		o.Op, o.WriteErr = "release", err
	}
	return o
}

// release gives attempt l back uncharged.
func (e *Engine) release(ctx context.Context, l invocation.Lease) error {
	return e.persist(ctx, func(octx context.Context) error { return e.c.State.Release(octx, l) })
}

// deadLetter writes the DLQ entry of exhausted invocation l, then records
// it written (docs/delivery.md#dead-letter-queue). The entry is persisted
// before the message can be acknowledged; a failed write leaves the message
// pending so a redelivery writes it again, and the marker keeps a
// redelivery from writing it twice.
func (e *Engine) deadLetter(ctx context.Context, d *delivery, l invocation.Lease, entry dlq.Entry, o Outcome) Outcome {
	octx, cancel := e.detached(ctx)
	defer cancel()
	o.Reason = entry.Reason
	id, err := e.c.DLQ.Write(octx, entry)
	if err != nil {
		o.Kind, o.Op, o.WriteErr = WriteFailed, "dlq", err
		return o
	}
	o.DLQID = id
	if err := e.persist(ctx, func(octx context.Context) error { return e.c.State.MarkDLQ(octx, l) }); err != nil {
		// The entry exists; a redelivery may write a duplicate.
		o.Kind, o.Op, o.WriteErr = WriteFailed, "mark_dlq", err
		return o
	}
	o.Kind = DeadLettered
	return o
}

// entry builds a DLQ entry of d; trace is the traceparent of the span that
// dead-lettered it (dlqTrace), which relay dlq replay links to.
func (e *Engine) entry(d *delivery, app, handler string, attempts int, reason, trace string) dlq.Entry {
	return dlq.Entry{
		OriginalStream: e.c.Stream, OriginalID: d.msg.ID, Group: e.c.Group, Consumer: e.c.Consumer,
		Event: d.event, Reason: reason, App: app, Handler: handler,
		Deliveries: d.msg.Deliveries, HandlerAttempts: attempts, Timestamp: time.Now().UTC(),
		Trace: trace,
	}
}

// deadLetterMessage routes a message that can never succeed (a malformed
// event, an invalid schedule occurrence) to the DLQ without running a
// handler, through the malformed pseudo-invocation, so a redelivery writes
// its entry only once.
func (e *Engine) deadLetterMessage(ctx context.Context, d *delivery, reason string) Outcome {
	o := Outcome{App: dlq.MalformedName, Handler: dlq.MalformedName, MaxAttempts: 1}
	cl, o, err := e.claim(ctx, d, malformedField, time.Minute, 1, o)
	if err != nil {
		return o
	}
	switch cl.Status {
	case invocation.Claimed:
		if err := e.persist(ctx, func(octx context.Context) error { return e.c.State.Exhaust(octx, cl.Lease) }); err != nil {
			o.Kind, o.Op, o.Err = WriteFailed, "exhaust", err
			return o
		}
		fallthrough
	case invocation.Exhausted:
		return e.deadLetter(ctx, d, cl.Lease, e.entry(d, dlq.MalformedName, dlq.MalformedName, 0, reason, dlqTrace(d.span)), o)
	case invocation.DeadLettered, invocation.Terminal:
		o.Kind = Done
	default:
		// Another delivery is on it right now.
		o.Kind, o.Next = Leased, cl.RunningUntil
	}
	return o
}

// orphan drives an unfinished invocation whose app or rule is no longer
// loaded. It cannot run again, and acknowledging its message without an
// entry would lose it, so it is dead-lettered once any retry is due or any
// lease expired (claiming it with one allowed attempt exhausts it); until
// then the message stays pending. One that never had an attempt charged is
// dropped with its rule, as if the event had arrived after the change.
func (e *Engine) orphan(ctx context.Context, d *delivery, field string) Outcome {
	name, handler, _ := strings.Cut(field, "/")
	o := Outcome{App: name, Handler: handler, Orphan: true}
	if inc := d.gen.incomplete; len(inc) > 0 {
		// Its rule may be in a template that cannot be read now.
		o.Kind, o.Err = Unavailable, fmt.Errorf("apps %v have rules that could not be read; the rule may be there", inc)
		return o
	}
	cl, o, err := e.claim(ctx, d, field, time.Minute, 1, o)
	if err != nil {
		return o
	}
	o.Attempt = cl.Lease.Attempt
	switch cl.Status {
	case invocation.Exhausted:
		reason := fmt.Sprintf("app %q no longer declares handler %q (the invocation was unfinished after %s)", name, handler, plural.Of(cl.Lease.Attempt, "attempt"))
		return e.deadLetter(ctx, d, cl.Lease, e.entry(d, name, handler, cl.Lease.Attempt, reason, e.prevTrace(cl, d)), o)
	case invocation.Claimed:
		// With one attempt allowed, only an invocation that never ran is
		// claimed (given back uncharged, or its state went away).
		o.Kind = Dropped
		if err := e.release(ctx, cl.Lease); err != nil {
			o.Op, o.WriteErr = "release", err
		}
	case invocation.Running:
		o.Kind, o.Next = Leased, cl.RunningUntil
	case invocation.NotDue:
		o.Kind, o.Next = NotDue, cl.NextAttemptAt
	default:
		o.Kind = Done
	}
	return o
}
