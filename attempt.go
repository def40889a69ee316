package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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

// step is one invocation after the invoke stage: its outcome and, when
// something is left to write, the transition that records it. The outcome
// says what the transition does once written (Succeeded, Retrying,
// DeadLettered, ...); the settle stage writes it and turns a failed write
// into WriteFailed.
type step struct {
	o Outcome
	t *invocation.Transition
	// reported is set once the observers were told of o (an attempt
	// settled before the next handler ran).
	reported bool
}

// verdict is the invoke stage's value: what the stages found, for settle.
type verdict struct {
	plan
	// steps has one entry per invocation driven, the dead-lettered
	// message's pseudo-invocation included, in dispatch order.
	steps []step
}

// done reports that pl leaves nothing to invoke: the message is
// acknowledged or kept pending as it stands.
func (pl plan) done() bool {
	return pl.pending != nil || pl.ack
}

// invoke is the third stage: it drives each invocation of pl in dispatch
// order, one at a time (docs/delivery.md#from-entry-to-acknowledgement). An
// attempt that ran a handler is settled before the next handler starts,
// so a crash never loses its outcome; the last one is left to the settle
// stage, to go with the acknowledgement. Orphans and the targets no rule
// declares come after the calls.
func (p *pipeline) invoke(ctx context.Context, d *delivery, pl plan) verdict {
	v := verdict{plan: pl, steps: make([]step, 0, len(pl.calls)+len(pl.orphans)+len(pl.unknown)+1)}
	if pl.deadLetter != "" {
		v.steps = append(v.steps, p.deadLetterMessage(ctx, d, pl.deadLetter))
		return v
	}
	for _, t := range pl.unknown {
		v.steps = append(v.steps, step{o: Outcome{Kind: NotRun, App: t.App, Handler: t.Handler, Result: ResultError,
			Err: fmt.Errorf("the matcher returned target %s/%s (rule %d), which no loaded app declares", t.App, t.Handler, t.Rule)}})
	}
	for i, c := range pl.calls {
		s := p.attempt(ctx, d, c)
		if s.t != nil && s.o.Result != "" && i < len(pl.calls)-1 {
			// Another handler runs after this one: record it first.
			s = p.settleStep(ctx, d, s)
		}
		v.steps = append(v.steps, s)
	}
	for _, f := range pl.orphans {
		v.steps = append(v.steps, p.orphan(ctx, d, f))
	}
	return v
}

// attempt takes call c through one step of its lifecycle
// (docs/delivery.md#attempts-retries-backoff). When the invocation is due
// it claims the next attempt and runs the handler in a concurrency slot;
// the step then carries the transition that records how it ended.
// Otherwise the outcome says why nothing ran: the invocation is finished,
// leased elsewhere, not due, or cannot start now (app unavailable, no
// slot, shutting down), in which case it is recorded uncharged (a probe)
// for its redelivery.
func (p *pipeline) attempt(ctx context.Context, d *delivery, c call) step {
	o := Outcome{App: c.app, Handler: c.handler, MaxAttempts: c.retries + 1}
	a := d.gen.apps.Get(c.app)
	switch {
	case !a.Available():
		o.Kind, o.Err = Unavailable, a.Errors.Err()
		return p.probe(ctx, d, c, o)
	case ctx.Err() != nil:
		o.Kind = Stopping // start nothing new
		return p.probe(ctx, d, c, o)
	case c.limits.MaxAge > 0 && p.age(d) > c.limits.MaxAge:
		return p.tooOld(ctx, d, c, o)
	}
	cl, taken, s, ok := p.start(ctx, d, a, c, o)
	if !ok {
		return s
	}
	defer taken.release()
	l := cl.Lease
	_, o.span = telemetry.StartAttempt(ctx, p.tracer, c.app, c.handler, d.msg.ID, l.Attempt, o.MaxAttempts, cl.PrevTrace)
	// The lineage goes with every transition that ends the attempt
	// unsuccessfully, so the next attempt links to this one.
	l.Trace = lineage(o.span)
	o.Attempt, o.Lost = l.Attempt, cl.Lost
	var err error
	o.Duration, err = p.run(d, a, c, l, o.span)
	o.Result, o.Err = ResultOf(err), err
	return p.ended(d, c, l, o, err)
}

// ended is the step of attempt l of c that ran with outcome o and runner
// error err: the transition its result calls for.
func (p *pipeline) ended(d *delivery, c call, l invocation.Lease, o Outcome, err error) step {
	switch o.Result {
	case ResultSuccess:
		o.Kind = Succeeded
		return step{o: o, t: &invocation.Transition{Kind: invocation.Finish, Lease: l, Gate: c.gate}}
	case ResultFailure, ResultTimeout, ResultOOM:
		if o.Attempt >= o.MaxAttempts || permanent(err) {
			o.Kind = DeadLettered
			e := p.entry(d, c.app, c.handler, l.Attempt, err.Error()+panicStack(err), dlqTrace(o.span))
			o.Reason = e.Reason
			return step{o: o, t: &invocation.Transition{Kind: invocation.Exhaust, Lease: l, Entry: &e, Gate: c.gate}}
		}
		o.Kind = Retrying
		return step{o: o, t: &invocation.Transition{Kind: invocation.Retry, Lease: l, Backoff: invocation.Backoff(p.cfg.Backoff, l.Attempt), Gate: c.gate}}
	}
	if errors.Is(err, errMessageGone) {
		// Nothing to record: the message's state is no longer live.
		o.Kind = Gone
		return step{o: o}
	}
	if errors.Is(err, runtime.ErrOutcomeUnknown) {
		// Keep the claim: its lease's expiry charges the attempt, rather
		// than it starting again uncharged.
		o.Kind = OutcomeUnknown
		return step{o: o}
	}
	// Not the handler's fault: no attempt is charged and the message
	// stays pending.
	o.Kind = NotRun
	if d.handlerCtx.Err() != nil {
		o.Kind = Stopping
	}
	return step{o: o, t: &invocation.Transition{Kind: invocation.Release, Lease: l, Gate: c.gate}}
}

// maxPanicStack bounds the stack of a panicking Go handler that its
// dead-letter entry keeps.
const maxPanicStack = 4 << 10

// panicStack is the stack of a Go handler that panicked
// (runtime.PanicError), on a line of its own after the reason, cut to
// maxPanicStack bytes; "" for any other error.
func panicStack(err error) string {
	pe, ok := errors.AsType[*runtime.PanicError](err)
	if !ok || len(pe.Stack) == 0 {
		return ""
	}
	stack := pe.Stack
	if len(stack) > maxPanicStack {
		stack = append(stack[:maxPanicStack:maxPanicStack], "…"...)
	}
	return "\n" + strings.ToValidUTF8(string(stack), "\ufffd")
}

// age is how old d's message is now: from the time in its stream entry id
// to the store's clock (the entry's time is the Redis server's when
// Redis chose the id).
func (p *pipeline) age(d *delivery) time.Duration {
	t := entryTime(d.msg.ID)
	if t.IsZero() {
		return 0
	}
	return time.Now().Add(time.Duration(p.skew.Load())).Sub(t)
}

// tooOld dead-letters the invocation of c, whose message is older than its
// rule's max_age, without running it (docs/flow-control.md#maximum-event-age):
// the claim takes the attempt, and the settlement exhausts it with the
// reason, counting only the attempts that ran.
func (p *pipeline) tooOld(ctx context.Context, d *delivery, c call, o Outcome) step {
	cl, s, ok := p.claimed(ctx, d, c, o, claimUngated)
	if !ok {
		return s
	}
	l := cl.Lease
	reason := "older than max_age " + app.FormatDuration(c.limits.MaxAge)
	e := p.entry(d, c.app, c.handler, l.Attempt-1, reason, dlqTrace(d.span))
	o.Kind, o.Attempt, o.Lost, o.Reason = DeadLettered, l.Attempt, cl.Lost, reason
	return step{o: o, t: &invocation.Transition{Kind: invocation.Exhaust, Lease: l, Entry: &e}}
}

// permanent reports whether the handler said its failure is permanent
// (runtime.ExitPermanent, runtime.Permanent): the invocation is exhausted
// at this attempt, never retried (docs/delivery.md#permanent-failures).
func permanent(err error) bool {
	exit, ok := errors.AsType[*runtime.ExitError](err)
	return ok && exit.IsPermanent()
}

// start takes a concurrency slot and claims the next attempt, in the order
// that never charges an attempt for a wait: a first delivery has no state,
// so its claim can only be attempt 1, and it takes the slot first; a
// redelivery, which may find state, claims first and, when it must wait for
// a slot, gives the claim back, waits, and claims again with the slot in
// hand. Were the worker to die while waiting with a claim taken, the lease
// would expire and count as a failed attempt although nothing ran. ok
// reports a claimed attempt and taken slots; otherwise s is the step.
func (p *pipeline) start(ctx context.Context, d *delivery, a *app.App, c call, o Outcome) (_ invocation.Claim, taken slots, s step, ok bool) {
	want := p.limiter.slotsOf(a, c.handler, c.limits)
	if d.msg.Deliveries < 2 {
		if taken, ok = p.limiter.tryAcquire(want); !ok {
			if taken, ok = p.waitSlots(ctx, want, &o); !ok {
				return invocation.Claim{}, slots{}, p.probe(ctx, d, c, o), false
			}
		}
		cl, s, ok := p.claimInTime(ctx, d, c, o)
		if !ok {
			taken.release()
		}
		return cl, taken, s, ok
	}
	cl, s, ok := p.claimInTime(ctx, d, c, o)
	if !ok {
		return cl, slots{}, s, false
	}
	if taken, ok = p.limiter.tryAcquire(want); ok {
		return cl, taken, s, true
	}
	o.Waited = true
	if err := p.giveBack(ctx, d, cl.Lease, c.gate); err != nil {
		// The claim stays until it is given back (voids.go).
		o.failed(OpRelease, err)
		return cl, slots{}, step{o: o}, false
	}
	if taken, ok = p.waitSlots(ctx, want, &o); !ok {
		return cl, slots{}, step{o: o}, false
	}
	if cl, s, ok = p.claimInTime(ctx, d, c, o); !ok {
		taken.release()
	}
	return cl, taken, s, ok
}

// waitSlots waits for the slots of want, at most the concurrency wait.
// When they did not free, o is NoSlot (Stopping when ctx ended).
func (p *pipeline) waitSlots(ctx context.Context, want slots, o *Outcome) (slots, bool) {
	o.Waited = true
	unblock := p.act.block()
	taken, ok := p.limiter.waitAcquire(ctx, want, p.cfg.ConcurrencyWait)
	unblock()
	if !ok {
		o.Kind = NoSlot
		if ctx.Err() != nil {
			o.Kind = Stopping
		}
	}
	return taken, ok
}

// claimInTime claims the next attempt of c to run it, and gives it back
// uncharged (NotRun, errLateClaim) when the claim took half the lease
// grace or more to come back: a worker stalled that long, or a reply held
// up, may have let so much of the lease pass, counted from the claim's
// execution on Redis, that the run would outlive it, and another delivery
// would then charge the attempt while it runs, or even start the next
// (docs/delivery.md#leases). Half the grace stays for the runtime's
// teardown and the outcome's write. Measured from before the claim was
// asked for, on this process's monotonic clock, it needs no clock shared
// with Redis. ok reports a claimed attempt; otherwise s is the step.
func (p *pipeline) claimInTime(ctx context.Context, d *delivery, c call, o Outcome) (invocation.Claim, step, bool) {
	asked := time.Now()
	cl, s, ok := p.claimed(ctx, d, c, o, claimRun)
	if !ok {
		return cl, s, false
	}
	took := time.Since(asked)
	if took < p.cfg.LeaseGrace/2 {
		return cl, s, true
	}
	o.Kind, o.Attempt, o.Lost = NotRun, cl.Lease.Attempt, cl.Lost
	o.Err = fmt.Errorf("%w: the claim took %v, half the lease grace (%v) or more", errLateClaim, took.Round(time.Millisecond), p.cfg.LeaseGrace)
	if err := p.giveBack(ctx, d, cl.Lease, c.gate); err != nil {
		// Given back later, once the store answers (voids.go).
		o.WriteErr = &WriteError{Op: OpRelease, Err: err}
	}
	return cl, step{o: o}, false
}

// errLateClaim is the error of an attempt claimInTime gave back.
var errLateClaim = errors.New("attempt given back before it ran: its lease may not cover the run")

// probe records an invocation that does not start now (o.Kind says why)
// uncharged, as due, so that its redelivery drives it even if the event no
// longer matches its rule (a now() cutoff passed). When the probe shows the
// invocation did not need to run (finished, leased, not due, exhausted),
// that is the outcome instead.
func (p *pipeline) probe(ctx context.Context, d *delivery, c call, o Outcome) step {
	cl, s, ok := p.claimed(ctx, d, c, o, claimProbe)
	if ok {
		// Recorded due: o stands, with a lost attempt the probe charged.
		o.Lost = cl.Lost
		return step{o: o}
	}
	return s
}

// claimMode says what claimed asks the store for.
type claimMode int

const (
	// claimRun claims an attempt to run, through the rule's gate.
	claimRun claimMode = iota
	// claimUngated claims an attempt that runs no handler (max_age).
	claimUngated
	// claimProbe records the invocation due instead (ClaimRequest.Probe).
	claimProbe
)

// claimed claims (or probes) the next attempt of c. ok reports a claimed
// (or probed) attempt; otherwise the claim's status is turned into the
// step: finished, superseded, leased elsewhere, not due, waiting for a
// limit, or exhausted, in which case the step writes the dead-letter entry
// the earlier delivery could not.
func (p *pipeline) claimed(ctx context.Context, d *delivery, c call, o Outcome, mode claimMode) (invocation.Claim, step, bool) {
	r := invocation.ClaimRequest{Field: c.field, Lease: p.lease(c), MaxAttempts: o.MaxAttempts, Probe: mode == claimProbe}
	if mode == claimRun {
		r.Gate = c.gate
	}
	cl, err := p.claim(ctx, d, r, &o)
	if err != nil {
		return cl, step{o: o}, false
	}
	if cl.Status != invocation.Throttled && !r.Gate.IsZero() {
		p.pacer.started(c, d.msg.ID)
	}
	switch cl.Status {
	case invocation.Claimed, invocation.Probed:
		return cl, step{}, true
	}
	o.Attempt = cl.Lease.Attempt
	switch cl.Status {
	case invocation.Terminal:
		o.Kind = Done
		if cl.NotPending {
			// Left the PEL while this delivery held it, as the
			// heartbeat finds: its state cannot be read for what ran.
			o.Kind = Gone
		}
	case invocation.Succeeded, invocation.DeadLettered:
		o.Kind = Done
	case invocation.Running:
		// A reclaimed message whose attempt is still leased: its worker
		// may be alive elsewhere, or dead, in which case the attempt is
		// charged when the lease ends.
		o.Kind, o.Next = Leased, cl.RunningUntil
	case invocation.NotDue:
		o.Kind, o.Next = NotDue, cl.NextAttemptAt
	case invocation.Superseded:
		o.Kind, o.Reason = Superseded, "superseded by message "+cl.SupersededBy
	case invocation.Debounced:
		o.Kind, o.Next = Debounced, cl.NextAttemptAt
	case invocation.Throttled:
		// On the store's clock, as its answer.
		now := time.Now().Add(time.Duration(p.skew.Load()))
		o.Kind, o.Reason, o.Next = Throttled, cl.Limit, p.pacer.next(c, d.msg.ID, cl, now)
	case invocation.Exhausted:
		// A previous delivery exhausted it (or its last lease expired) but
		// the DLQ entry is not recorded yet.
		reason := fmt.Sprintf("exhausted after %s (the last attempt's outcome was not recorded: its worker stopped, Redis was unreachable when it finished, or its DLQ write failed)", plural.Of(cl.Lease.Attempt, "attempt"))
		return cl, p.deadLetterFound(d, c.app, c.handler, cl, reason, o), false
	default:
		o.failed(OpClaim, fmt.Errorf("unknown claim status %d", int(cl.Status)))
	}
	return cl, step{o: o}, false
}

// claim asks the state store for the next attempt of r.Field of d's
// message, in a batch with the claims of other deliveries (batch.go),
// recording the message's other invocations with a first delivery's
// first claim. A store error fails closed
// (docs/delivery.md#claim-errors-fail-closed): o becomes WriteFailed, the
// handler is not run and the message stays pending, since running a
// duplicate could race a worker that won the same claim.
func (p *pipeline) claim(ctx context.Context, d *delivery, r invocation.ClaimRequest, o *Outcome) (invocation.Claim, error) {
	r.Key = d.key
	if i := slices.Index(d.record, r.Field); i >= 0 {
		// The others, in order; a message of one invocation allocates
		// nothing for them.
		others := append(make([]string, 0, len(d.record)-1), d.record[:i]...)
		r.Record = invocation.Record{Fields: append(others, d.record[i+1:]...), Complete: d.complete}
	}
	cl, err := p.claims.do(p.writeCtx(ctx), r)
	if err != nil {
		p.claimFails.Add(1)
		if lost, ok := errors.AsType[*invocation.ClaimUnknownError](err); ok && p.voids.add(lost.Lease) {
			err = fmt.Errorf("%w (the claim is given back once the store answers)", err)
		}
		o.failed(OpClaim, err)
		return cl, err
	}
	if p.claimFails.Load() != 0 {
		p.claimFails.Store(0)
	}
	if cl.Status == invocation.Claimed {
		// The store wrote the deadline at its now + the lease, just before
		// this reply: its clock's lead over this one (dueAt).
		p.skew.Store(int64(cl.Lease.Deadline.Add(-r.Lease).Sub(time.Now())))
	}
	d.record = nil // recorded
	if cl.Lost > 0 && r.Field != malformedField {
		p.obs.message(ctx, d, msgEvent{kind: msgAttemptLost, app: o.App,
			attrs: []slog.Attr{slog.String(telemetry.Handler, o.Handler), slog.Int("lost_attempt", cl.Lost)}})
	}
	return cl, nil
}

// run runs attempt l of c under the delivery's handler context, which
// outlives the Engine's stop by the shutdown timeout, as a child of span;
// it returns how long the runner took and its error.
func (p *pipeline) run(d *delivery, a *app.App, c call, l invocation.Lease, span trace.Span) (time.Duration, error) {
	req := runtime.Request{
		App: a.Name, Handler: c.handler, MessageID: d.msg.ID, Attempt: l.Attempt,
		Event: c.input, Timeout: c.timeout, Spec: a.Spec,
		// The handler continues the attempt's trace.
		Env: telemetry.HandlerEnv(span.SpanContext()),
	}
	p.m.inFlight.Inc()
	p.act.handle()
	start := time.Now()
	p.runs.add(l.Token, &Running{App: a.Name, Handler: c.handler, MessageID: d.msg.ID, Attempt: l.Attempt,
		MaxAttempts: c.retries + 1, Started: start, Timeout: c.timeout, LeaseUntil: l.Deadline})
	_, err := p.runner.Run(trace.ContextWithSpan(d.handlerCtx, span), req)
	took := time.Since(start)
	p.act.handled()
	p.runs.remove(l.Token)
	p.m.inFlight.Dec()
	if _, exited := errors.AsType[*runtime.ExitError](err); err != nil && !exited && context.Cause(d.handlerCtx) == errMessageGone {
		// Stopped by the heartbeat, not ended by itself.
		err = fmt.Errorf("%w: %w", errMessageGone, err)
	}
	return took, err
}

// errMessageGone ends the handlers of a message the heartbeat found no
// longer pending: acknowledged by another consumer, or lost with Redis's
// data. Their outcome cannot be recorded.
var errMessageGone = errors.New("the message is no longer pending in the consumer group (another consumer acknowledged it, or Redis lost it); its handler was stopped")

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

// deadLetterMessage routes a message that can never succeed (a malformed
// or oversized event, an invalid schedule occurrence) to the DLQ without
// running a handler, through the malformed pseudo-invocation, so that a
// redelivery writes its entry only once.
func (p *pipeline) deadLetterMessage(ctx context.Context, d *delivery, reason string) step {
	o := Outcome{App: dlq.MalformedName, Handler: dlq.MalformedName, MaxAttempts: 1}
	// No handler runs: the lease only keeps a concurrent delivery from
	// writing the entry too (the settlement is fenced either way), so a
	// redelivery may take over as soon as the grace has passed.
	cl, err := p.claim(ctx, d, invocation.ClaimRequest{Field: malformedField, Lease: p.cfg.LeaseGrace, MaxAttempts: 1}, &o)
	if err != nil {
		return step{o: o}
	}
	switch cl.Status {
	case invocation.Claimed:
		o.Kind, o.Reason = DeadLettered, reason
		e := p.entry(d, dlq.MalformedName, dlq.MalformedName, 0, reason, dlqTrace(d.span))
		return step{o: o, t: &invocation.Transition{Kind: invocation.Exhaust, Lease: cl.Lease, Entry: &e}}
	case invocation.Exhausted:
		return p.deadLetterFound(d, dlq.MalformedName, dlq.MalformedName, cl, reason, o)
	case invocation.DeadLettered, invocation.Terminal:
		o.Kind = Done
	default:
		// Another delivery is on it right now.
		o.Kind, o.Next = Leased, cl.RunningUntil
	}
	return step{o: o}
}

// orphan drives an unfinished invocation whose app or rule is no longer
// loaded. It cannot run again, and acknowledging its message without an
// entry would lose it, so it is dead-lettered once any retry is due or any
// lease expired (a probe with one allowed attempt exhausts it); until then
// the message stays pending. One that never had an attempt charged is
// dropped with its rule, as if the event had arrived after the change.
func (p *pipeline) orphan(ctx context.Context, d *delivery, field string) step {
	name, handler := invocation.SplitField(field)
	o := Outcome{App: name, Handler: handler, Orphan: true}
	if inc := d.gen.incomplete; len(inc) > 0 {
		// Its rule may be in a template that cannot be read now.
		o.Kind, o.Err = Unavailable, fmt.Errorf("apps %v have rules that could not be read; the rule may be there", inc)
		return step{o: o}
	}
	cl, err := p.claim(ctx, d, invocation.ClaimRequest{Field: field, Lease: time.Minute, MaxAttempts: 1, Probe: true}, &o)
	if err != nil {
		return step{o: o}
	}
	o.Attempt = cl.Lease.Attempt
	switch cl.Status {
	case invocation.Exhausted:
		reason := fmt.Sprintf("app %q no longer declares handler %q (the invocation was unfinished after %s)", name, handler, plural.Of(cl.Lease.Attempt, "attempt"))
		return p.deadLetterFound(d, name, handler, cl, reason, o)
	case invocation.Probed:
		// With one attempt allowed, only an invocation that never ran is
		// claimable (given back uncharged, or its state went away).
		o.Kind = Dropped
	case invocation.Running:
		o.Kind, o.Next = Leased, cl.RunningUntil
	case invocation.NotDue:
		o.Kind, o.Next = NotDue, cl.NextAttemptAt
	default:
		o.Kind = Done
	}
	return step{o: o}
}

// deadLetterFound is the step of an invocation a claim found exhausted:
// its dead-letter entry, with reason, written with its ":dlq" marker
// (docs/delivery.md#dead-letter-queue).
func (p *pipeline) deadLetterFound(d *delivery, appName, handler string, cl invocation.Claim, reason string, o Outcome) step {
	trace := cl.PrevTrace
	if trace == "" {
		trace = dlqTrace(d.span)
	}
	attempts, lost := cl.Lease.Attempt, cl.Lost
	if appName == dlq.MalformedName {
		// No handler ran: its expired lease was no attempt.
		attempts, lost = 0, 0
	}
	e := p.entry(d, appName, handler, attempts, reason, trace)
	o.Kind, o.Reason, o.Attempt, o.Lost = DeadLettered, reason, cl.Lease.Attempt, lost
	return step{o: o, t: &invocation.Transition{Kind: invocation.DeadLetter, Lease: cl.Lease, Entry: &e}}
}

// entry builds a DLQ entry of d; trace is the traceparent of the span that
// dead-lettered it (dlqTrace), which relay dlq replay links to.
func (p *pipeline) entry(d *delivery, appName, handler string, attempts int, reason, trace string) dlq.Entry {
	return dlq.Entry{
		OriginalStream: p.id.stream, OriginalID: d.msg.ID, Group: p.id.group, Consumer: p.id.consumer,
		Event: d.event, Reason: reason, App: appName, Handler: handler,
		Deliveries: d.msg.Deliveries, HandlerAttempts: attempts, Timestamp: time.Now().UTC(),
		Trace: trace,
	}
}
