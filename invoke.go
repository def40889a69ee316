package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// invoke is the third stage: it takes one invocation through one step of
// its lifecycle (docs/delivery.md#attempts-retries-backoff). When the
// invocation is due it claims the next attempt and runs the handler in a
// concurrency slot; the attempt it returns then carries the transition
// that records the result (record.go). Otherwise the attempt's outcome
// says why nothing ran: the invocation is finished, leased elsewhere, not
// due, or cannot start now (app unavailable, no slot, shutting down), in
// which case it stays recorded uncharged for its redelivery.
func (e *Engine) invoke(ctx context.Context, d *delivery, c call) attempt {
	o := Outcome{App: c.app, Handler: c.handler, MaxAttempts: c.retries + 1}
	a := d.gen.apps.Get(c.app)
	switch {
	case !a.Available():
		o.Kind, o.Err = Unavailable, a.Errors.Err()
		e.notStarted(ctx, d, c, &o)
		return attempt{o: o}
	case ctx.Err() != nil:
		o.Kind = Stopping // start nothing new
		e.notStarted(ctx, d, c, &o)
		return attempt{o: o}
	}
	l, taken, ok := e.start(ctx, d, a, c, &o)
	if !ok {
		return attempt{o: o}
	}
	_, o.span = telemetry.StartAttempt(ctx, e.tracer, c.app, c.handler, d.msg.ID, l.Attempt, o.MaxAttempts, l.Trace)
	// The lineage goes with every transition that ends the attempt
	// unsuccessfully, so the next attempt links to this one.
	l = withLineage(l, o.span)
	o.Attempt = l.Attempt
	var err error
	o.Duration, err = e.run(d, a, c, l, o.span)
	taken.release()
	o.Result, o.Err = ResultOf(err), err
	return attempt{o: o, c: c, lease: l, next: nextTransition(o, err)}
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
// hand. Were the worker to die while waiting with a claim taken, the lease
// would expire and count as a failed attempt although nothing ran. ok
// reports a claimed attempt (its lease, with PrevTrace in Lease.Trace) and
// taken slots; otherwise o says why not.
func (e *Engine) start(ctx context.Context, d *delivery, a *app.App, c call, o *Outcome) (_ invocation.Lease, taken slots, ok bool) {
	if d.msg.Deliveries < 2 {
		if taken, ok = e.cfg.Limiter.tryAcquire(a); !ok {
			if taken, ok = e.waitSlots(ctx, a, o); !ok {
				e.notStarted(ctx, d, c, o)
				return invocation.Lease{}, slots{}, false
			}
		}
		cl, ok := e.claimInTime(ctx, d, c, o)
		if !ok {
			taken.release()
		}
		return leaseOf(cl), taken, ok
	}
	cl, ok := e.claimInTime(ctx, d, c, o)
	if !ok {
		return invocation.Lease{}, slots{}, false
	}
	if taken, ok = e.cfg.Limiter.tryAcquire(a); ok {
		return leaseOf(cl), taken, true
	}
	if err := e.release(ctx, leaseOf(cl)); err != nil {
		// The claim stays until it is given back (unsettled.go).
		o.Waited = true
		o.failed(OpRelease, err)
		return invocation.Lease{}, slots{}, false
	}
	if taken, ok = e.waitSlots(ctx, a, o); !ok {
		return invocation.Lease{}, slots{}, false
	}
	if cl, ok = e.claimInTime(ctx, d, c, o); !ok {
		taken.release()
	}
	return leaseOf(cl), taken, ok
}

// waitSlots waits for a's slot and a global one, at most the concurrency
// wait. When none freed, o is NoSlot (Stopping when ctx ended).
func (e *Engine) waitSlots(ctx context.Context, a *app.App, o *Outcome) (slots, bool) {
	o.Waited = true
	taken, ok := e.cfg.Limiter.waitAcquire(ctx, a, e.cfg.ConcurrencyWait)
	if !ok {
		o.Kind = NoSlot
		if ctx.Err() != nil {
			o.Kind = Stopping
		}
	}
	return taken, ok
}

// claimInTime is claimToRun for an attempt about to run, which it gives
// back uncharged (NotRun, errLateClaim) when the claim took half the lease
// grace or more to come back: a worker stalled that long, or a reply taken
// up, may have let so much of the lease pass, counted from the claim's
// execution on Redis, that the run would outlive it, and another delivery
// would then charge the attempt while it runs, or even start the next
// (docs/delivery.md#leases). Half the grace stays for the runtime's
// teardown and the outcome's write. Measured from before the claim was
// asked for, on this process's monotonic clock, it needs no clock shared
// with Redis.
func (e *Engine) claimInTime(ctx context.Context, d *delivery, c call, o *Outcome) (invocation.Claim, bool) {
	asked := time.Now()
	cl, ok := e.claimToRun(ctx, d, c, o)
	if !ok {
		return cl, false
	}
	took := time.Since(asked)
	if took < e.cfg.LeaseGrace/2 {
		return cl, true
	}
	o.Kind, o.Attempt, o.Err = NotRun, cl.Lease.Attempt, fmt.Errorf("%w: the claim took %v, half the lease grace (%v) or more",
		errLateClaim, took.Round(time.Millisecond), e.cfg.LeaseGrace)
	if err := e.release(ctx, leaseOf(cl)); err != nil {
		// Given back later, once the store answers (unsettled.go).
		o.WriteErr = &WriteError{Op: OpRelease, Err: err}
	}
	return cl, false
}

// errLateClaim is the error of an attempt claimInTime gave back.
var errLateClaim = errors.New("attempt given back before it ran: its lease may not cover the run")

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
func (e *Engine) claim(ctx context.Context, d *delivery, field string, lease time.Duration, maxAttempts int, o *Outcome) (invocation.Claim, error) {
	var rec invocation.Record
	if i := slices.Index(d.invocations, field); i >= 0 {
		// The others, in order; a message of one invocation allocates
		// nothing for them.
		others := append(make([]string, 0, len(d.invocations)-1), d.invocations[:i]...)
		rec = invocation.Record{Fields: append(others, d.invocations[i+1:]...), Complete: d.invocationsComplete}
	}
	cl, err := e.c.State.Claim(e.writeCtx(ctx), d.key, field, lease, maxAttempts, rec)
	if err != nil {
		e.claimFails.Add(1)
		if lost, ok := errors.AsType[*invocation.ClaimUnknownError](err); ok && e.unsettle(lost.Lease) {
			err = fmt.Errorf("%w (the claim is given back once the store answers)", err)
		}
		o.failed(OpClaim, err)
		return cl, err
	}
	if e.claimFails.Load() != 0 {
		e.claimFails.Store(0)
	}
	d.invocations = nil // recorded
	if cl.Lost > 0 {
		o.Lost = cl.Lost
		e.obs.message(ctx, d, msgEvent{kind: msgAttemptLost, app: o.App,
			attrs: []slog.Attr{slog.String(telemetry.Handler, o.Handler), slog.Int("lost_attempt", cl.Lost)}})
	}
	return cl, nil
}

// claimToRun claims the next attempt of c. ok reports a claimed attempt;
// otherwise the claim's status is turned into o: finished, leased
// elsewhere, not due, or exhausted, in which case the dead-letter entry the
// earlier delivery could not write is written now.
func (e *Engine) claimToRun(ctx context.Context, d *delivery, c call, o *Outcome) (invocation.Claim, bool) {
	cl, err := e.claim(ctx, d, c.field(), e.lease(c), o.MaxAttempts, o)
	if err != nil {
		return cl, false
	}
	if cl.Status == invocation.Claimed {
		return cl, true
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
		e.deadLetter(ctx, d, cl.Lease, e.entry(d, c.app, c.handler, cl.Lease.Attempt, reason, e.prevTrace(cl, d)), o)
	default:
		o.failed(OpClaim, fmt.Errorf("unknown claim status %d", int(cl.Status)))
	}
	return cl, false
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
func (e *Engine) notStarted(ctx context.Context, d *delivery, c call, o *Outcome) {
	claimed := *o
	cl, ok := e.claimToRun(ctx, d, c, &claimed)
	if !ok {
		*o = claimed
		return
	}
	o.Lost = claimed.Lost
	if err := e.release(ctx, leaseOf(cl)); err != nil {
		o.WriteErr = &WriteError{Op: OpRecord, Err: err}
	}
}

// run runs attempt l of c under the delivery's run context, which outlives
// the Engine's stop by the shutdown timeout, as a child of span; it
// returns how long the runner took and its error.
func (e *Engine) run(d *delivery, a *app.App, c call, l invocation.Lease, span trace.Span) (time.Duration, error) {
	req := runtime.Request{
		App: a.Name, Handler: c.handler, MessageID: d.msg.ID, Attempt: l.Attempt,
		Event: c.input, Timeout: c.timeout, Spec: a.Spec,
		// The handler continues the attempt's trace.
		Env: telemetry.HandlerEnv(span.SpanContext()),
	}
	e.m.inFlight.Inc()
	start := time.Now()
	done := e.runs.add(l.Token, Running{App: a.Name, Handler: c.handler, MessageID: d.msg.ID, Attempt: l.Attempt,
		MaxAttempts: c.retries + 1, Started: start, Timeout: c.timeout, LeaseUntil: l.Deadline})
	_, err := e.c.Runner.Run(trace.ContextWithSpan(d.handlerCtx, span), req)
	took := time.Since(start)
	done()
	e.m.inFlight.Dec()
	return took, err
}

// ResultOf is the Result of a Runner's error: how the attempt ended.
func ResultOf(err error) AttemptResult {
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
