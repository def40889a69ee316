package relay

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// opTimeout bounds one state, DLQ or ack write. Those writes run under a
// context detached from shutdown, so a stopping worker still records what
// its handlers did.
const opTimeout = 10 * time.Second

// writeTimeout is opTimeout, in nanoseconds; tests shorten it.
var writeTimeout atomic.Int64

func init() { writeTimeout.Store(int64(opTimeout)) }

// malformedField is the invocation field of a malformed message; it gives
// the malformed path the same idempotent DLQ marker as handler invocations.
const malformedField = dlq.MalformedName + "/" + dlq.MalformedName

func detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), time.Duration(writeTimeout.Load()))
}

// persist runs an idempotent or fenced write until it succeeds, fails with
// a contract error (invocation.ErrStale, ErrTerminal), or opTimeout passes,
// backing off between tries: a Redis blip as a handler finishes must not
// turn its recorded outcome into a lost one. A fenced write whose earlier
// try applied but whose reply was lost comes back ErrStale; callers then
// keep the message pending, and the next delivery's Claim reads the truth.
func persist(ctx context.Context, op func(context.Context) error) error {
	octx, cancel := detached(ctx)
	defer cancel()
	return retryWrite(octx, op)
}

// persistSuccess is persist for the record of a handler's success, which
// is worth waiting longer for: a success that is not recorded makes the
// lease expire and count as a failed attempt, so the handler runs again or
// is dead-lettered. While this delivery retries, its message stays in
// flight and heartbeated, so no other delivery claims the invocation, and
// the fenced write still applies when Redis is back. It retries until the
// lease's deadline plus MinPendingIdle (at least the write timeout), or
// until the worker abandons running work (runCtx).
func (e *Engine) persistSuccess(ctx, runCtx context.Context, l invocation.Lease, op func(context.Context) error) error {
	patience := max(time.Duration(writeTimeout.Load()), time.Until(l.Deadline)+e.o.minPendingIdle)
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), patience)
	defer cancel()
	defer context.AfterFunc(runCtx, cancel)()
	return retryWrite(octx, op)
}

func retryWrite(octx context.Context, op func(context.Context) error) error {
	for tries := 1; ; tries++ {
		err := op(octx)
		if err == nil || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
			return err
		}
		if !ctxtime.Sleep(octx, retryDelay(tries)) {
			return err
		}
	}
}

// delivery is one message being handled by this worker.
type delivery struct {
	msg   stream.Message
	key   invocation.Key
	event string
	// span is the delivery's stream.message span.
	span trace.Span
	// held is set when some invocation is not terminal: the message must
	// stay pending.
	held bool
	// acked is set once the message is acknowledged.
	acked bool
}

// logAttrs are the attributes of a log line about d: its message id and
// its stream.message span (trace_id, span_id), then attrs.
func (e *Engine) logAttrs(d *delivery, attrs ...slog.Attr) []slog.Attr {
	return spanLogAttrs(d.msg.ID, d.span, attrs...)
}

// ctxLogAttrs is logAttrs naming the span ctx holds: the attempt's
// function.invoke when called from drive, else the delivery's span.
func ctxLogAttrs(ctx context.Context, d *delivery, attrs ...slog.Attr) []slog.Attr {
	return spanLogAttrs(d.msg.ID, trace.SpanFromContext(ctx), attrs...)
}

// handle classifies one delivered message and drives each of its
// invocations (events.md "Dispatch and concurrency").
func (e *Engine) handle(ctx, runCtx context.Context, msg stream.Message) {
	d := &delivery{msg: msg, key: invocation.Key{Stream: e.c.Stream, Group: e.c.Group, MessageID: msg.ID}}
	ctx, d.span = e.startMessage(ctx, msg)
	defer endMessage(d)
	raw, ok := msg.Fields["event"]
	d.event = raw
	if ok && isOccurrence(raw) {
		// Relay's own schedule occurrence: no classification, no matching,
		// no event counters (reference.md "Schedules").
		e.occurrence(ctx, runCtx, d)
		return
	}
	e.m.received.Inc()
	e.stats.add(countReceived)
	if !ok {
		e.malformed(ctx, d, "message has no event field")
		return
	}
	targets, err := e.c.Matcher.Match([]byte(raw))
	if errors.Is(err, matcher.ErrMalformed) {
		// The reason is read by operators in relay dlq ls; drop the
		// package prefix.
		e.malformed(ctx, d, strings.TrimPrefix(err.Error(), "matcher: "))
		return
	}
	if err != nil {
		// Not the message's fault: leave it pending for a later delivery.
		e.log.LogAttrs(ctx, slog.LevelError, "match failed; message left pending", e.logAttrs(d, slog.Any("error", err))...)
		return
	}
	targets, orphans, err := e.withUnfinished(ctx, d, targets)
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelError, "reading the message's unfinished invocations failed; message left pending",
			e.logAttrs(d, slog.Any("error", err))...)
		return
	}
	if len(targets) == 0 && len(orphans) == 0 {
		if len(e.incomplete) > 0 {
			// An app whose rules are unknown might match it.
			e.log.LogAttrs(ctx, slog.LevelDebug, "event unmatched by known rules; left pending while apps have unreadable rules",
				e.logAttrs(d, slog.Any("apps", e.incomplete))...)
			return
		}
		e.m.unmatched.Inc()
		e.stats.add(countUnmatched)
		e.log.LogAttrs(ctx, slog.LevelDebug, "event unmatched", e.logAttrs(d)...)
		e.ack(ctx, d, false)
		return
	}
	e.m.matched.Inc()
	e.stats.add(countMatched)
	for _, t := range targets {
		e.invoke(ctx, runCtx, d, t)
	}
	for _, f := range orphans {
		e.orphan(ctx, d, f)
	}
	if len(e.incomplete) > 0 {
		d.held = true
	}
	if d.held {
		e.log.LogAttrs(ctx, slog.LevelDebug, "message left pending", e.logAttrs(d)...)
		return
	}
	e.ack(ctx, d, true)
}

// withUnfinished adds to targets, on a redelivery, the invocations the
// state store records as unfinished that this match did not return. The
// event was classified at its first delivery: a now() cutoff that passed
// since, or a changed template, must not drop an invocation that waits for
// its retry, nor get the message acknowledged as unmatched (events.md
// "Guarantees summary"). Recorded invocations whose app or rule is no
// longer loaded are returned as orphans. A first delivery has no state and
// costs nothing here.
func (e *Engine) withUnfinished(ctx context.Context, d *delivery, targets []matcher.Target) ([]matcher.Target, []string, error) {
	if d.msg.Deliveries < 2 {
		return targets, nil, nil
	}
	octx, cancel := detached(ctx)
	defer cancel()
	fields, err := e.c.State.Unfinished(octx, d.key)
	if err != nil {
		return nil, nil, err
	}
	matched := make(map[string]bool, len(targets))
	for _, t := range targets {
		matched[t.App+"/"+t.Handler] = true
	}
	var orphans []string
	added := false
	for _, f := range fields {
		if matched[f] || f == malformedField {
			continue
		}
		name, handler, _ := strings.Cut(f, "/")
		if i := e.apps.Get(name).ruleIndex(handler); i >= 0 {
			targets = append(targets, matcher.Target{App: name, Handler: handler, Rule: i})
			added = true
			continue
		}
		orphans = append(orphans, f)
	}
	if added {
		// Dispatch order: apps by name, rules by declaration.
		slices.SortStableFunc(targets, func(a, b matcher.Target) int {
			return cmp.Or(strings.Compare(a.App, b.App), cmp.Compare(a.Rule, b.Rule))
		})
	}
	return targets, orphans, nil
}

// orphan dead-letters an unfinished invocation whose app or rule is no
// longer loaded: it cannot run again, and acknowledging its message
// without an entry would lose it. Claiming it with one allowed attempt
// exhausts it once any retry is due or any lease expired; until then the
// message stays pending.
func (e *Engine) orphan(ctx context.Context, d *delivery, field string) {
	if len(e.incomplete) > 0 {
		d.held = true // its rule may be in a template that cannot be read now
		return
	}
	name, handler, _ := strings.Cut(field, "/")
	attrs := func(extra ...slog.Attr) []slog.Attr {
		return e.logAttrs(d, append([]slog.Attr{slog.String(telemetry.App, name), slog.String(telemetry.Handler, handler)}, extra...)...)
	}
	c, err := e.claim(ctx, d, field, time.Minute, 1)
	if err != nil {
		return
	}
	switch c.Status {
	case invocation.Exhausted:
		reason := fmt.Sprintf("app %q no longer declares handler %q (the invocation was unfinished after %d attempts)", name, handler, c.Lease.Attempt)
		tr := c.PrevTrace
		if tr == "" {
			tr = dlqTrace(d.span)
		}
		e.log.LogAttrs(ctx, slog.LevelWarn, "unfinished invocation of a handler no longer declared; dead-lettering it", attrs()...)
		e.deadLetter(ctx, d, c.Lease, e.entry(d, name, handler, c.Lease.Attempt, reason, tr))
	case invocation.Claimed:
		// With one attempt allowed, only an invocation that never ran is
		// claimed (given back uncharged, or its state went away): its rule
		// is gone, as if the event had arrived after the change, which
		// would have left it unmatched. Give the claim back; the message is
		// acknowledged without it.
		e.releaseLease(ctx, d, c.Lease, attrs)
		e.log.LogAttrs(ctx, slog.LevelInfo, "invocation of a handler no longer declared had no attempt charged; dropped with its rule", attrs()...)
	case invocation.Running, invocation.NotDue:
		d.held = true
	}
}

// malformed counts a malformed event and dead-letters its message.
func (e *Engine) malformed(ctx context.Context, d *delivery, reason string) {
	e.m.malformed.Inc()
	e.stats.add(countMalformed)
	e.deadLetterMessage(ctx, d, reason)
}

// deadLetterMessage routes a message that can never succeed to the DLQ
// without running a handler, then acknowledges it (events.md, malformed
// messages; invalid schedule occurrences, which are not events and are not
// counted as such).
func (e *Engine) deadLetterMessage(ctx context.Context, d *delivery, reason string) {
	e.log.LogAttrs(ctx, slog.LevelWarn, "malformed message", e.logAttrs(d, slog.String("reason", reason))...)
	c, err := e.claim(ctx, d, malformedField, time.Minute, 1)
	if err != nil {
		return
	}
	switch c.Status {
	case invocation.Claimed:
		if err := e.exhaust(ctx, d, c.Lease); err != nil {
			return
		}
		fallthrough
	case invocation.Exhausted:
		entry := e.entry(d, dlq.MalformedName, dlq.MalformedName, 0, reason, dlqTrace(d.span))
		if !e.deadLetter(ctx, d, c.Lease, entry) {
			return
		}
	case invocation.DeadLettered, invocation.Terminal:
	default:
		// Another delivery is on it right now.
		return
	}
	e.ack(ctx, d, true)
}

// entry builds the DLQ entry of d; trace is the traceparent of the span
// that dead-lettered it (dlqTrace), which relay dlq replay links to.
func (e *Engine) entry(d *delivery, app, handler string, attempts int, reason, trace string) dlq.Entry {
	return dlq.Entry{
		OriginalStream: e.c.Stream, OriginalID: d.msg.ID, Group: e.c.Group, Consumer: e.c.Consumer,
		Event: d.event, Reason: reason, App: app, Handler: handler,
		Deliveries: d.msg.Deliveries, HandlerAttempts: attempts, Timestamp: time.Now().UTC(),
		Trace: trace,
	}
}

// claim asks the state store for the next attempt. An error fails closed:
// the handler is not run and the message stays pending, since running a
// duplicate could race a worker that won the same claim (events.md).
func (e *Engine) claim(ctx context.Context, d *delivery, field string, lease time.Duration, attempts int) (invocation.Claim, error) {
	octx, cancel := detached(ctx)
	defer cancel()
	c, err := e.c.State.Claim(octx, d.key, field, lease, attempts)
	if err != nil {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "claim failed; handler not run, message left pending",
			e.logAttrs(d, slog.String("invocation", field), slog.Any("error", err))...)
		return c, err
	}
	if c.Lost > 0 {
		// Charged by this claim alone, so counted once cluster-wide.
		app, handler, _ := strings.Cut(field, "/")
		e.m.invocations.WithLabelValues(app, handler, outcomeLost).Inc()
		e.stats.add(countFailures)
		e.log.LogAttrs(ctx, slog.LevelWarn, "attempt lost: its worker stopped or stalled mid-run and its lease expired; charged as failed",
			e.logAttrs(d, slog.String(telemetry.App, app), slog.String(telemetry.Handler, handler), slog.Int("lost_attempt", c.Lost))...)
	}
	return c, nil
}

// call is one invocation a delivery drives: the handler to run, its limits
// and its stdin. Event rules and schedule occurrences both end up here.
type call struct {
	app     *App
	handler string
	timeout time.Duration
	retries int
	input   []byte
}

func (c call) field() string { return c.app.Name + "/" + c.handler }

// callAttrs are the attributes of a log line about invocation c of d,
// naming span (the attempt's function.invoke once it started, else the
// delivery's stream.message).
func (e *Engine) callAttrs(d *delivery, span trace.Span, c call, extra ...slog.Attr) []slog.Attr {
	return spanLogAttrs(d.msg.ID, span, append([]slog.Attr{slog.String(telemetry.App, c.app.Name), slog.String(telemetry.Handler, c.handler)}, extra...)...)
}

// invoke resolves one matched target to its rule and drives it.
func (e *Engine) invoke(ctx, runCtx context.Context, d *delivery, t matcher.Target) {
	app := e.apps.Get(t.App)
	if app == nil || t.Rule < 0 || t.Rule >= len(app.Rules) {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "matcher returned an unknown target; message left pending",
			e.logAttrs(d, slog.String(telemetry.App, t.App), slog.String(telemetry.Handler, t.Handler))...)
		return
	}
	rule := app.Rules[t.Rule]
	e.drive(ctx, runCtx, d, call{app: app, handler: rule.Handler, timeout: rule.Timeout, retries: rule.Retries, input: []byte(d.event)})
}

// claimToRun claims the next attempt of cl and reports whether it may run.
// Every other status is dealt with here: nothing to do (succeeded,
// dead-lettered, retained), wait (leased elsewhere, retry not due: the
// message is held), or the dead-letter entry of an exhausted invocation.
func (e *Engine) claimToRun(ctx context.Context, d *delivery, cl call, attrs func(...slog.Attr) []slog.Attr, lease time.Duration, maxAttempts int) (invocation.Claim, bool) {
	c, err := e.claim(ctx, d, cl.field(), lease, maxAttempts)
	if err != nil {
		return c, false
	}
	switch c.Status {
	case invocation.Claimed:
		return c, true
	case invocation.Succeeded, invocation.DeadLettered, invocation.Terminal:
	case invocation.Running:
		d.held = true
		// A reclaimed message whose attempt is still leased: its worker
		// may be alive elsewhere, or dead, in which case the attempt is
		// charged when the lease ends. Say so: the wait can be minutes.
		e.log.LogAttrs(ctx, slog.LevelInfo, "invocation leased by an earlier delivery; waiting for it to finish or its lease to expire",
			attrs(slog.Time("lease_until", c.RunningUntil))...)
	case invocation.NotDue:
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelDebug, "invocation not due", attrs(slog.Time("next_attempt_at", c.NextAttemptAt))...)
	case invocation.Exhausted:
		// A previous delivery exhausted it (or its last lease expired) but
		// the DLQ entry is not recorded yet.
		reason := fmt.Sprintf("exhausted after %d attempts (the last attempt's outcome was not recorded: its worker stopped, Redis was unreachable when it finished, or its DLQ write failed)", c.Lease.Attempt)
		tr := c.PrevTrace
		if tr == "" {
			tr = dlqTrace(d.span)
		}
		e.deadLetter(ctx, d, c.Lease, e.entry(d, cl.app.Name, cl.handler, c.Lease.Attempt, reason, tr))
	default:
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "unknown claim status; message left pending", attrs(slog.Int("status", int(c.Status)))...)
	}
	return c, false
}

// drive takes one invocation through one step of its lifecycle: claim,
// run, record the outcome (events.md "Retries", "Dead-letter queue"). The
// attempt it runs gets a function.invoke span, a child of the delivery's,
// linked to the previous attempt's span through the lineage the state store
// keeps (reference.md "Observability").
func (e *Engine) drive(ctx, runCtx context.Context, d *delivery, cl call) {
	app := cl.app
	span := d.span // the attempt's span once it starts
	attrs := func(extra ...slog.Attr) []slog.Attr { return e.callAttrs(d, span, cl, extra...) }
	maxAttempts := cl.retries + 1
	// The lease covers the run and its teardown: a live attempt must never
	// look expired to another delivery.
	lease := cl.timeout + e.o.leaseGrace
	// record leaves an invocation that does not start now recorded,
	// uncharged, for its redelivery, which may no longer match the rule (a
	// now() cutoff passes): Unfinished then still lists it.
	record := func() {
		if c, claimed := e.claimToRun(ctx, d, cl, attrs, lease, maxAttempts); claimed {
			e.releaseLease(ctx, d, c.Lease, attrs)
		}
	}
	if !app.Available() {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelWarn, "app unavailable; message left pending", attrs(slog.Any("error", app.Errors.Err()))...)
		record()
		return
	}
	if ctx.Err() != nil {
		d.held = true // shutting down: start nothing new
		record()
		return
	}
	noSlot := func() {
		d.held = true
		if ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "no concurrency slot within the wait; message left pending",
				attrs(slog.Duration("wait", e.o.concurrencyWait))...)
		}
	}
	var release func()
	if d.msg.Deliveries < 2 {
		// A first delivery has no state, so its claim can only be attempt
		// 1: take the slot first, and the wait holds no claim.
		var ok bool
		if release, ok = e.acquire(ctx, app); !ok {
			record()
			noSlot()
			return
		}
	}
	c, ok := e.claimToRun(ctx, d, cl, attrs, lease, maxAttempts)
	if !ok {
		if release != nil {
			release()
		}
		return
	}
	if release == nil {
		release, ok = e.tryAcquire(app)
	}
	if !ok {
		// Every slot is busy. Were this worker to die while it waits, a
		// claim held through the wait would be charged as a failed attempt
		// although nothing ran (the attempt count is the number of runs):
		// give the claim back, wait, and claim again with the slot in hand.
		e.releaseLease(ctx, d, c.Lease, attrs)
		if release, ok = e.waitAcquire(ctx, app); !ok {
			noSlot()
			return
		}
		if c, ok = e.claimToRun(ctx, d, cl, attrs, lease, maxAttempts); !ok {
			release()
			return
		}
	}
	l := c.Lease
	ctx, span = startAttempt(ctx, e.tracer, app.Name, cl.handler, d.msg.ID, l.Attempt, maxAttempts, c.PrevTrace)
	result, runErr := outcomeError, error(nil)
	defer func() { endAttempt(span, result, runErr) }()
	// The lineage goes with every transition that ends the attempt
	// unsuccessfully, so the next attempt links to this one.
	l = withLineage(l, span)
	req := runtime.Request{
		App: app.Name, Handler: cl.handler, MessageID: d.msg.ID, Attempt: l.Attempt,
		Event: cl.input, Timeout: cl.timeout, Spec: app.Spec,
		// The handler continues the attempt's trace.
		Env: telemetry.HandlerEnv(span.SpanContext()),
	}
	e.m.inFlight.Inc()
	start := time.Now()
	_, err := e.c.Runner.Run(trace.ContextWithSpan(runCtx, span), req)
	took := time.Since(start)
	e.m.inFlight.Dec()
	release()
	runErr = err

	var exit *runtime.ExitError
	switch {
	case err == nil:
		result = outcomeSuccess
		e.m.invocations.WithLabelValues(app.Name, cl.handler, outcomeSuccess).Inc()
		e.stats.add(countSuccesses)
		e.m.duration.WithLabelValues(app.Name, cl.handler).Observe(took.Seconds())
		e.log.LogAttrs(ctx, slog.LevelInfo, "invocation succeeded", attrs(slog.Int(telemetry.Attempt, l.Attempt), slog.Duration(telemetry.Duration, took))...)
		if err := e.persistSuccess(ctx, runCtx, l, func(octx context.Context) error { return e.c.State.Finish(octx, l) }); err != nil {
			// The handler ran; without the record its lease expires and
			// counts as a failed attempt.
			d.held = true
			e.log.LogAttrs(ctx, slog.LevelError, "recording success failed; its lease will expire and count as a failed attempt, so the handler may run again",
				attrs(slog.Any("error", err))...)
		}
	case errors.As(err, &exit):
		result = outcomeFailure
		if exit.TimedOut {
			result = outcomeTimeout
		} else if exit.OOMKilled {
			result = outcomeOOM
		}
		e.m.invocations.WithLabelValues(app.Name, cl.handler, result).Inc()
		e.stats.add(countFailures)
		e.m.duration.WithLabelValues(app.Name, cl.handler).Observe(took.Seconds())
		fa := attrs(slog.Int(telemetry.Attempt, l.Attempt), slog.Int("max_attempts", maxAttempts),
			slog.Duration(telemetry.Duration, took), slog.Int(telemetry.ExitCode, exit.Code), slog.Any("error", err))
		if l.Attempt >= maxAttempts {
			e.log.LogAttrs(ctx, slog.LevelError, "invocation exhausted; dead-lettering", fa...)
			if e.exhaust(ctx, d, l) == nil {
				e.deadLetter(ctx, d, l, e.entry(d, app.Name, cl.handler, l.Attempt, err.Error(), dlqTrace(span)))
			}
			return
		}
		d.held = true
		var next time.Time
		serr := persist(ctx, func(octx context.Context) (err error) {
			next, err = e.c.State.ScheduleRetry(octx, l, e.backoff(l.Attempt))
			return err
		})
		if serr != nil {
			e.log.LogAttrs(ctx, slog.LevelError, "recording failure failed", attrs(slog.Any("error", serr))...)
			return
		}
		e.m.retries.WithLabelValues(app.Name, cl.handler).Inc()
		e.stats.add(countRetries)
		e.log.LogAttrs(ctx, slog.LevelWarn, "invocation failed; will retry", append(fa, slog.Time("next_attempt_at", next))...)
	case errors.Is(err, runtime.ErrOutcomeUnknown):
		// The handler may have run: keep the claim, whose lease expiry
		// counts the attempt, rather than start it again uncharged.
		d.held = true
		e.m.invocations.WithLabelValues(app.Name, cl.handler, outcomeError).Inc()
		e.log.LogAttrs(ctx, slog.LevelError, "handler outcome unknown; its lease will expire and count as an attempt",
			attrs(slog.Int(telemetry.Attempt, l.Attempt), slog.Any("error", err))...)
	default:
		// Infrastructure failure or shutdown: not the handler's fault, so
		// no attempt is charged and the message stays pending.
		d.held = true
		if errors.Is(err, runtime.ErrUnavailable) {
			result = outcomeUnavailable
		}
		e.m.invocations.WithLabelValues(app.Name, cl.handler, result).Inc()
		e.releaseLease(ctx, d, l, attrs)
		switch {
		case runCtx.Err() != nil:
			e.log.LogAttrs(ctx, slog.LevelWarn, "handler stopped by the shutdown timeout; no attempt charged, message left pending for another worker",
				attrs(slog.Duration("ran", took), slog.Any("error", err))...)
		case errors.Is(err, runtime.ErrUnavailable):
			e.log.LogAttrs(ctx, slog.LevelWarn, "invocation could not run; no attempt charged, message left pending",
				attrs(slog.Any("error", err))...)
		default:
			e.log.LogAttrs(ctx, slog.LevelError, "invocation could not run; no attempt charged, message left pending",
				attrs(slog.Any("error", err))...)
		}
	}
}

func (e *Engine) backoff(failedAttempt int) time.Duration {
	return invocation.Backoff(e.o.backoff, failedAttempt)
}

func (e *Engine) releaseLease(ctx context.Context, d *delivery, l invocation.Lease, attrs func(...slog.Attr) []slog.Attr) {
	if err := persist(ctx, func(octx context.Context) error { return e.c.State.Release(octx, l) }); err != nil {
		// The lease then expires and counts as a failed attempt.
		e.log.LogAttrs(ctx, slog.LevelError, "releasing claim failed", attrs(slog.Any("error", err))...)
	}
}

func (e *Engine) exhaust(ctx context.Context, d *delivery, l invocation.Lease) error {
	err := persist(ctx, func(octx context.Context) error { return e.c.State.Exhaust(octx, l) })
	if err != nil {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "recording exhaustion failed; message left pending",
			ctxLogAttrs(ctx, d, slog.String("invocation", l.Field), slog.Any("error", err))...)
	}
	return err
}

// deadLetter writes the DLQ entry of an exhausted invocation, then marks
// it written. The entry is persisted before the message can be acked; a
// failed write leaves the message pending so a redelivery writes it again
// (events.md "Dead-letter queue"). It reports whether both steps succeeded.
func (e *Engine) deadLetter(ctx context.Context, d *delivery, l invocation.Lease, entry dlq.Entry) bool {
	octx, cancel := detached(ctx)
	defer cancel()
	id, err := e.c.DLQ.Write(octx, entry)
	if err != nil {
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "dead-letter write failed; message left pending",
			ctxLogAttrs(ctx, d, slog.String("invocation", l.Field), slog.Any("error", err))...)
		return false
	}
	e.m.dlqEntries.WithLabelValues(entry.App, entry.Handler).Inc()
	e.stats.add(countDLQEntries)
	if err := persist(ctx, func(octx context.Context) error { return e.c.State.MarkDLQ(octx, l) }); err != nil {
		// The entry exists; a redelivery may write a duplicate.
		d.held = true
		e.log.LogAttrs(ctx, slog.LevelError, "recording dead-letter marker failed; message left pending",
			ctxLogAttrs(ctx, d, slog.String("invocation", l.Field), slog.String("dlq_id", id), slog.Any("error", err))...)
		return false
	}
	e.log.LogAttrs(ctx, slog.LevelWarn, "dead-lettered", ctxLogAttrs(ctx, d,
		slog.String(telemetry.App, entry.App), slog.String(telemetry.Handler, entry.Handler),
		slog.String("dlq_id", id), slog.String("reason", entry.Reason))...)
	return true
}

// ack acknowledges a message whose invocations are all terminal, then
// switches its state to terminal retention (events.md "Invocation state
// persistence"). A failed retain only leaks the hash.
func (e *Engine) ack(ctx context.Context, d *delivery, hasState bool) {
	if hasState && e.ackRetain != nil {
		e.ackAndRetain(ctx, d)
		return
	}
	if err := persist(ctx, func(octx context.Context) error { return e.c.Source.Ack(octx, d.msg.ID) }); err != nil {
		e.log.LogAttrs(ctx, slog.LevelError, "ack failed; message stays pending and will be redelivered", e.logAttrs(d, slog.Any("error", err))...)
		return
	}
	d.acked = true
	e.log.LogAttrs(ctx, slog.LevelDebug, "message acknowledged", e.logAttrs(d)...)
	if hasState {
		e.retain(ctx, d.msg.ID, d.span)
	}
}

// ackAndRetain is ack with state through the store's pipelined XACK and
// retain (pipelinedAck): the same order on the server, one round trip. A
// retry repeats both, which are idempotent; a retain that failed after a
// successful XACK is retried alone, as ack retries it.
func (e *Engine) ackAndRetain(ctx context.Context, d *delivery) {
	var retainErr error
	err := persist(ctx, func(octx context.Context) (ackErr error) {
		ackErr, retainErr = e.ackRetain.AckRetain(octx, d.key, e.o.retention)
		return ackErr
	})
	if err != nil {
		e.log.LogAttrs(ctx, slog.LevelError, "ack failed; message stays pending and will be redelivered", e.logAttrs(d, slog.Any("error", err))...)
		return
	}
	d.acked = true
	e.log.LogAttrs(ctx, slog.LevelDebug, "message acknowledged", e.logAttrs(d)...)
	if retainErr != nil {
		e.retain(ctx, d.msg.ID, d.span)
	}
}

// retain switches message id's state to retention; span is its delivery's,
// nil when there is none (a missing payload).
func (e *Engine) retain(ctx context.Context, id string, span trace.Span) {
	key := invocation.Key{Stream: e.c.Stream, Group: e.c.Group, MessageID: id}
	if err := persist(ctx, func(octx context.Context) error { return e.c.State.Retain(octx, key, e.o.retention) }); err != nil {
		e.log.LogAttrs(ctx, slog.LevelWarn, "switching invocation state to retention failed; the state is leaked, not expired",
			spanLogAttrs(id, span, slog.Any("error", err))...)
	}
}

// acquire takes the app's and the global concurrency slot, at once when
// both are free, else waiting as waitAcquire does.
func (e *Engine) acquire(ctx context.Context, app *App) (release func(), ok bool) {
	if release, ok = e.tryAcquire(app); ok {
		return release, true
	}
	return e.waitAcquire(ctx, app)
}

// tryAcquire takes the app's and the global concurrency slot if both are
// free now.
func (e *Engine) tryAcquire(app *App) (release func(), ok bool) {
	appSlots, global := e.limiter.app(app), e.limiter.global
	select {
	case appSlots <- struct{}{}:
		select {
		case global <- struct{}{}:
			return func() { <-global; <-appSlots }, true
		default:
		}
		<-appSlots
	default:
	}
	return nil, false
}

// waitAcquire takes the app's and the global concurrency slot, waiting at
// most the concurrency wait; the wait is counted in
// concurrency_waits_total.
func (e *Engine) waitAcquire(ctx context.Context, app *App) (release func(), ok bool) {
	appSlots, global := e.limiter.app(app), e.limiter.global
	e.m.concurrencyWaits.Inc()
	timer := time.NewTimer(e.o.concurrencyWait)
	defer timer.Stop()
	select {
	case appSlots <- struct{}{}:
	case <-timer.C:
		return nil, false
	case <-ctx.Done():
		return nil, false
	}
	select {
	case global <- struct{}{}:
		return func() { <-global; <-appSlots }, true
	case <-timer.C:
	case <-ctx.Done():
	}
	<-appSlots
	return nil, false
}
