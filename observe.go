package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
)

// The observer seam (docs/observability.md): every fact about a delivery is
// reported once, as a value, to each observer; none of the delivery stages
// writes a log line, a metric, a cluster stat or a span attribute itself.

// msgKind is a message-level fact.
type msgKind int

const (
	msgReceived     msgKind = iota // an external event (or malformed entry) was delivered
	msgMatched                     // it matched at least one rule, or has unfinished invocations
	msgUnmatched                   // it matched nothing
	msgMalformed                   // it is not a JSON object (reason)
	msgOversized                   // its event is larger than MaxEventBytes (reason)
	msgObsolete                    // a schedule occurrence whose app or schedule is gone (reason)
	msgLeftPending                 // it stays pending (pending)
	msgAcked                       // it was acknowledged
	msgAckFailed                   // acknowledging it failed (err)
	msgRetainFailed                // it was acknowledged but its state not retained (err)
	msgAttemptLost                 // its claim charged an attempt whose lease expired (app, attrs: handler, lost_attempt)
)

type msgEvent struct {
	kind    msgKind
	reason  string
	app     string
	pending *pendingReason
	err     error
	attrs   []slog.Attr
}

// observer receives the facts of deliveries.
type observer interface {
	message(ctx context.Context, d *delivery, ev msgEvent)
	invocation(ctx context.Context, d *delivery, o Outcome)
}

// observers reports to each observer in turn.
type observers []observer

func (os observers) message(ctx context.Context, d *delivery, ev msgEvent) {
	for _, o := range os {
		o.message(ctx, d, ev)
	}
}

func (os observers) invocation(ctx context.Context, d *delivery, out Outcome) {
	for _, o := range os {
		o.invocation(ctx, d, out)
	}
}

// newObservers are the observers of an Engine of cfg: its log, metrics,
// cluster stats and spans, then Config.OnOutcome when set.
func newObservers(cfg Config, log *slog.Logger, m *metrics, consumer string) observers {
	obs := observers{logObserver{log: log, repeats: newRepeats()}, metricsObserver{m}}
	if cfg.Stats != nil {
		obs = append(obs, statsObserver{cfg.Stats, consumer})
	}
	obs = append(obs, spanObserver{})
	if cfg.OnOutcome != nil {
		obs = append(obs, hookObserver(cfg.OnOutcome))
	}
	return obs
}

// hookObserver hands every outcome to Config.OnOutcome.
type hookObserver func(ctx context.Context, messageID string, o Outcome)

func (hookObserver) message(context.Context, *delivery, msgEvent) {}

func (h hookObserver) invocation(ctx context.Context, d *delivery, o Outcome) { h(ctx, d.msg.ID, o) }

// metricsObserver counts in Prometheus (docs/observability.md#metrics).
type metricsObserver struct{ m *metrics }

func (mo metricsObserver) message(_ context.Context, _ *delivery, ev msgEvent) {
	switch ev.kind {
	case msgReceived:
		mo.m.received.Inc()
	case msgMatched:
		mo.m.matched.Inc()
	case msgUnmatched:
		mo.m.unmatched.Inc()
	case msgMalformed:
		mo.m.malformed.Inc()
	case msgOversized:
		mo.m.oversized.Inc()
	}
}

func (mo metricsObserver) invocation(_ context.Context, _ *delivery, o Outcome) {
	m := mo.m
	if o.Lost > 0 {
		// Charged by this delivery's claim alone, so counted once
		// cluster-wide.
		m.invocations.WithLabelValues(o.App, o.Handler, string(ResultLost)).Inc()
	}
	if o.Waited {
		m.concurrencyWaits.Inc()
	}
	if o.Result != "" {
		m.invocations.WithLabelValues(o.App, o.Handler, string(o.Result)).Inc()
	}
	if ran(o.Result) {
		m.duration.WithLabelValues(o.App, o.Handler).Observe(o.Duration.Seconds())
	}
	if n := o.retries(); n > 0 {
		m.retries.WithLabelValues(o.App, o.Handler).Add(float64(n))
	}
	if o.DLQID != "" {
		m.dlqEntries.WithLabelValues(o.App, o.Handler).Inc()
	}
	switch o.Kind {
	case Throttled:
		m.deferrals.WithLabelValues(o.App, o.Handler, o.Reason).Inc()
	case Debounced:
		m.deferrals.WithLabelValues(o.App, o.Handler, "debounce").Inc()
	case Superseded:
		m.superseded.WithLabelValues(o.App, o.Handler).Inc()
	}
}

// retries counts the failed attempts of o scheduled for another try: the
// attempt this delivery ran, when it is Retrying, and a lost attempt this
// delivery's claim charged, when one was left after it (the claim then
// started or scheduled the next; without one it exhausted the invocation).
func (o Outcome) retries() int {
	n := 0
	if o.Kind == Retrying {
		n++
	}
	if o.Lost > 0 && o.Lost < o.MaxAttempts {
		n++
	}
	return n
}

// ran reports whether a handler ran to a result of its own.
func ran(r AttemptResult) bool {
	return r == ResultSuccess || r == ResultFailure || r == ResultTimeout || r == ResultOOM
}

// statsObserver counts in the cluster-wide stats hash and adds outcomes to
// the feed relay console tails (docs/delivery.md#cluster-wide-counters).
type statsObserver struct {
	r        Stats
	consumer string
}

func (so statsObserver) message(_ context.Context, _ *delivery, ev msgEvent) {
	switch ev.kind {
	case msgReceived:
		so.r.Add(stats.Received)
	case msgMatched:
		so.r.Add(stats.Matched)
	case msgUnmatched:
		so.r.Add(stats.Unmatched)
	case msgMalformed, msgOversized:
		so.r.Add(stats.Malformed)
	}
}

func (so statsObserver) invocation(_ context.Context, d *delivery, o Outcome) {
	if o.Lost > 0 {
		so.r.Add(stats.Failures)
	}
	switch {
	case o.Result == ResultSuccess:
		so.r.Add(stats.Successes)
	case ran(o.Result):
		so.r.Add(stats.Failures)
	}
	for range o.retries() {
		so.r.Add(stats.Retries)
	}
	if o.DLQID != "" {
		so.r.Add(stats.DLQEntries)
	}
	if o.Kind == Superseded {
		so.r.Add(stats.Superseded)
	}
	if outcome := feedOutcome(o); outcome != "" {
		ev := stats.Event{
			Time: time.Now(), Consumer: so.consumer, MessageID: d.msg.ID, App: o.App, Handler: o.Handler,
			Outcome: outcome, Result: string(o.Result), Attempt: o.Attempt, MaxAttempts: o.MaxAttempts,
			Duration: o.Duration, Reason: o.Reason, DLQID: o.DLQID,
		}
		switch {
		case ev.Reason != "":
		case o.Err != nil:
			ev.Reason = o.Err.Error()
		case o.WriteErr != nil:
			ev.Reason = o.WriteErr.Err.Error()
		}
		so.r.Record(ev)
	}
}

// feedOutcome is how the feed names o, or "" for an outcome it leaves out
// (nothing ran and nothing was dead-lettered).
func feedOutcome(o Outcome) string {
	switch {
	case o.Kind == Succeeded:
		return "succeeded"
	case o.Kind == Retrying:
		return "failed"
	case o.Kind == DeadLettered:
		return "dead-lettered"
	case o.Result != "":
		return "error"
	}
	return ""
}

// spanObserver ends an attempt's function.invoke span with its result
// (docs/observability.md#traces).
type spanObserver struct{}

func (spanObserver) message(context.Context, *delivery, msgEvent) {}

func (spanObserver) invocation(_ context.Context, _ *delivery, o Outcome) {
	if o.span != nil {
		err := o.Err
		if err == nil && o.Kind == WriteFailed {
			err = o.WriteErr.Err // the success that could not be recorded
		}
		telemetry.EndAttempt(o.span, string(o.Result), err)
	}
}

// logObserver writes one log line per fact worth a line, with the message
// id and the trace of the span concerned (docs/observability.md#logs).
type logObserver struct {
	log     *slog.Logger
	repeats *repeats // failures that hit message after message
}

// logFailure writes the line of a failure that may hit every message
// alike at level, or at DEBUG when it repeats (repeats).
func (lo logObserver) logFailure(ctx context.Context, level slog.Level, msg string, err error, attrs []slog.Attr) {
	if err != nil {
		var n int
		level, n = lo.repeats.level(level, msg, cause(err), time.Now())
		attrs = repeatedAttr(attrs, n)
	}
	logAttrs(ctx, lo.log, level, msg, attrs...)
}

func (lo logObserver) message(ctx context.Context, d *delivery, ev msgEvent) {
	switch ev.kind {
	case msgReceived, msgMatched:
		return // no line
	case msgUnmatched, msgAcked:
		// Debug lines of every message: build nothing unless they are read.
		if !lo.log.Enabled(ctx, slog.LevelDebug) {
			return
		}
	}
	attrs := func(extra ...slog.Attr) []slog.Attr { return spanLogAttrs(d.msg.ID, d.span, extra...) }
	switch ev.kind {
	case msgMalformed:
		logAttrs(ctx, lo.log, slog.LevelWarn, "malformed message", attrs(slog.String("reason", ev.reason))...)
	case msgOversized:
		logAttrs(ctx, lo.log, slog.LevelWarn, "oversized event; dead-lettering it without decoding", attrs(slog.String("reason", ev.reason))...)
	case msgUnmatched:
		logAttrs(ctx, lo.log, slog.LevelDebug, "event unmatched", attrs()...)
	case msgObsolete:
		logAttrs(ctx, lo.log, slog.LevelInfo, "schedule occurrence obsolete: "+ev.reason+"; acknowledged",
			attrs(append([]slog.Attr{slog.String(telemetry.App, ev.app)}, ev.attrs...)...)...)
	case msgLeftPending:
		p := ev.pending
		extra := p.attrs
		if p.err != nil {
			extra = append(extra, slog.Any("error", p.err))
		}
		lo.logFailure(ctx, p.level, p.msg, p.err, attrs(extra...))
	case msgAcked:
		logAttrs(ctx, lo.log, slog.LevelDebug, "message acknowledged", attrs()...)
	case msgAckFailed:
		lo.logFailure(ctx, slog.LevelError, "ack failed; message stays pending and will be redelivered", ev.err, attrs(slog.Any("error", ev.err)))
	case msgRetainFailed:
		logAttrs(ctx, lo.log, slog.LevelWarn, "switching invocation state to retention failed; the state is leaked, not expired",
			attrs(slog.Any("error", ev.err))...)
	case msgAttemptLost:
		// Logged as the claim charges it, not when the attempt that follows
		// ends, which may be minutes later.
		logAttrs(ctx, lo.log, slog.LevelWarn, "attempt lost: its worker stopped or stalled mid-run and its lease expired; charged as failed",
			attrs(append([]slog.Attr{slog.String(telemetry.App, ev.app)}, ev.attrs...)...)...)
	}
}

func (lo logObserver) invocation(ctx context.Context, d *delivery, o Outcome) {
	span := o.span
	if span == nil {
		span = d.span
	}
	if o.Kind == Succeeded && o.WriteErr == nil {
		// The line of every successful invocation, without the closure
		// and slices of the rarer lines below.
		lo.succeeded(ctx, d.msg.ID, span, o)
		return
	}
	// failure writes the line of a failure that may hit message after
	// message alike (repeats); with a nil err, any other line.
	failure := func(level slog.Level, msg string, err error, extra ...slog.Attr) {
		if !lo.log.Enabled(ctx, level) {
			return // build no attributes for a line nobody reads
		}
		base := []slog.Attr{slog.String(telemetry.App, o.App), slog.String(telemetry.Handler, o.Handler)}
		lo.logFailure(ctx, level, msg, err, spanLogAttrs(d.msg.ID, span, append(base, extra...)...))
	}
	// A lost attempt was logged when the claim charged it (msgAttemptLost).
	lo.kindLine(o, failure)
	if pe, ok := errors.AsType[*runtime.PanicError](o.Err); ok && lo.log.Enabled(ctx, slog.LevelDebug) {
		logAttrs(ctx, lo.log, slog.LevelDebug, "handler panicked", spanLogAttrs(d.msg.ID, span,
			slog.String(telemetry.App, o.App), slog.String(telemetry.Handler, o.Handler), slog.Int(telemetry.Attempt, o.Attempt),
			slog.String("panic", fmt.Sprint(pe.Value)), slog.String("stack", string(pe.Stack)))...)
	}
	if o.WriteErr != nil && o.Kind != WriteFailed {
		failure(slog.LevelError, "giving the attempt back failed; its lease will expire and count as a failed attempt",
			o.WriteErr.Err, slog.String("op", o.WriteErr.Op.String()), slog.Any("error", o.WriteErr.Err))
	}
}

// failureLog writes one log line about an invocation; err is set for a
// failure that may hit message after message alike (repeats).
type failureLog func(level slog.Level, msg string, err error, extra ...slog.Attr)

// kindLine writes the line that says what o's kind means.
func (lo logObserver) kindLine(o Outcome, failure failureLog) {
	log := func(level slog.Level, msg string, extra ...slog.Attr) { failure(level, msg, nil, extra...) }
	run := runAttrs(o)
	switch o.Kind {
	case Succeeded:
		log(slog.LevelInfo, "invocation succeeded", run...)
	case Retrying:
		log(slog.LevelWarn, "invocation failed; will retry", append(run, slog.Time("next_attempt_at", o.Next))...)
	case DeadLettered:
		switch {
		case o.Result != "":
			log(slog.LevelError, "invocation exhausted; dead-lettered", append(run, slog.String("dlq_id", o.DLQID))...)
		case o.Orphan:
			log(slog.LevelWarn, "unfinished invocation of a handler no longer declared; dead-lettered",
				slog.String("dlq_id", o.DLQID), slog.String("reason", o.Reason))
		default:
			log(slog.LevelWarn, "dead-lettered", slog.String("dlq_id", o.DLQID), slog.String("reason", o.Reason))
		}
	case Dropped:
		log(slog.LevelInfo, "invocation of a handler no longer declared had no attempt charged; dropped with its rule")
	case NotDue:
		log(slog.LevelDebug, "invocation not due", slog.Time("next_attempt_at", o.Next))
	case Throttled:
		log(slog.LevelDebug, "invocation throttled by its rule's "+o.Reason+" limit; waiting, no attempt charged", slog.Time("next_attempt_at", o.Next))
	case Debounced:
		log(slog.LevelDebug, "invocation debounced; waiting for its period to end", slog.Time("next_attempt_at", o.Next))
	case Superseded:
		log(slog.LevelInfo, "invocation superseded by a newer event with its debounce key; not run", slog.String("reason", o.Reason))
	case Leased:
		// The wait can be minutes: say so.
		log(slog.LevelInfo, "invocation leased by an earlier delivery; waiting for it to finish or its lease to expire",
			slog.Time("lease_until", o.Next))
	case Unavailable:
		msg := "app unavailable; message left pending"
		if o.Orphan {
			msg = "unfinished invocation of a handler not declared by any readable template; message left pending"
		}
		failure(slog.LevelWarn, msg, o.Err, slog.Any("error", o.Err))
	case NoSlot:
		log(slog.LevelWarn, "no concurrency slot within the wait; message left pending")
	case Stopping:
		if o.Result != "" {
			log(slog.LevelWarn, "handler stopped by the shutdown timeout; no attempt charged, message left pending for another worker",
				append(run, slog.Any("error", o.Err))...)
		}
	case NotRun:
		level := slog.LevelError
		if errors.Is(o.Err, runtime.ErrUnavailable) {
			level = slog.LevelWarn
		}
		failure(level, "invocation could not run; no attempt charged, message left pending", o.Err, slog.Any("error", o.Err))
	case OutcomeUnknown:
		log(slog.LevelError, "handler outcome unknown; its lease will expire and count as an attempt",
			slog.Int(telemetry.Attempt, o.Attempt), slog.Any("error", o.Err))
	case Gone:
		if o.Result == "" {
			log(slog.LevelWarn, "invocation not run: its message is no longer pending in the consumer group (another consumer acknowledged it, or Redis lost its data)")
			break
		}
		log(slog.LevelWarn, "handler stopped: its message is no longer pending in the consumer group (another consumer acknowledged it, or Redis lost its data); its outcome is not recorded",
			append(run, slog.Any("error", o.Err))...)
	case WriteFailed:
		err := o.WriteErr.Err
		lo.writeFailed(func(level slog.Level, msg string, extra ...slog.Attr) { failure(level, msg, err, extra...) }, o, run)
	}
}

// succeeded writes the line of a successful invocation, the line
// invocation writes for it, with its attributes on the stack.
func (lo logObserver) succeeded(ctx context.Context, messageID string, span trace.Span, o Outcome) {
	if !lo.log.Enabled(ctx, slog.LevelInfo) {
		return
	}
	var buf [8]slog.Attr
	attrs := append(buf[:0], slog.String(telemetry.MessageID, messageID))
	if span != nil {
		attrs = telemetry.AppendSpanAttrs(attrs, span)
	}
	attrs = append(attrs, slog.String(telemetry.App, o.App), slog.String(telemetry.Handler, o.Handler))
	if o.Result != "" {
		attrs = append(attrs, slog.Int(telemetry.Attempt, o.Attempt), slog.Duration(telemetry.Duration, o.Duration))
	}
	logAttrs(ctx, lo.log, slog.LevelInfo, "invocation succeeded", attrs...)
}

// logAttrs writes one log line like slog.Logger.LogAttrs, but gives the
// record no program counter: LogAttrs calls runtime.Callers for it on every
// line, a tenth of a no-op delivery's CPU (bench/RESULTS.md), for the source
// position only a handler with AddSource prints (docs/observability.md#logs).
func logAttrs(ctx context.Context, l *slog.Logger, level slog.Level, msg string, attrs ...slog.Attr) {
	h := l.Handler()
	if !h.Enabled(ctx, level) {
		return
	}
	r := slog.NewRecord(time.Now(), level, msg, 0)
	r.AddAttrs(attrs...)
	_ = h.Handle(ctx, r) // as in LogAttrs: a handler's error has nowhere to go
}

// writeFailed logs a failed write, saying what it means for the invocation.
func (lo logObserver) writeFailed(log func(slog.Level, string, ...slog.Attr), o Outcome, run []slog.Attr) {
	op, err := o.WriteErr.Op, o.WriteErr.Err
	msg := writeFailedMsgs[op]
	if msg == "" {
		msg = "recording invocation state failed; message left pending"
	}
	attrs := append(run, slog.String("op", op.String()), slog.Any("error", err))
	if o.DLQID != "" {
		attrs = append(attrs, slog.String("dlq_id", o.DLQID))
	}
	if op == OpClaim || o.Result == "" {
		attrs = []slog.Attr{slog.String("invocation", o.field()), slog.Any("error", err)}
	}
	if errors.As(err, new(retriedWrite)) {
		// The earlier try of this write may be what moved the invocation
		// on; the refusal cannot tell that from a takeover.
		log(slog.LevelWarn, "a retried write found the attempt's lease gone: the earlier try, whose reply was lost, may have recorded the outcome, or another delivery took over", attrs...)
		return
	}
	if errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
		// Not a failure to fix: the attempt outlived its lease (a stalled
		// or suspended worker) and another delivery owns the invocation
		// now, or the message is no longer pending (docs/delivery.md). The
		// line still says how the handler really ended.
		if o.Result != "" {
			attrs = append(attrs, slog.String("handler_result", string(o.Result)))
		}
		msg := "attempt's lease taken over by another delivery; its outcome is not recorded"
		if errors.Is(err, invocation.ErrTerminal) {
			msg = "the message is no longer pending in the consumer group (another delivery acknowledged it, or Redis lost its data); the outcome is not recorded"
		}
		log(slog.LevelWarn, msg, attrs...)
		return
	}
	log(slog.LevelError, msg, attrs...)
}

// writeFailedMsgs are the log messages of WriteFailed, by the write that
// failed.
var writeFailedMsgs = map[Op]string{
	OpClaim:   "claim failed; handler not run, message left pending",
	OpRelease: "giving the claim back before waiting for a slot failed; its lease will expire and count as an attempt",
	OpFinish:  "recording success failed; its lease will expire and count as a failed attempt, so the handler may run again",
	OpRetry:   "recording failure failed; message left pending",
	OpExhaust: "recording exhaustion failed; message left pending",
	OpDLQ:     "dead-letter write failed; message left pending",
}

// runAttrs describe the attempt o ran, if any.
func runAttrs(o Outcome) []slog.Attr {
	if o.Result == "" {
		return nil
	}
	attrs := []slog.Attr{slog.Int(telemetry.Attempt, o.Attempt), slog.Duration(telemetry.Duration, o.Duration)}
	if o.MaxAttempts > 0 && o.Result != ResultSuccess {
		attrs = append(attrs, slog.Int("max_attempts", o.MaxAttempts))
	}
	if exit, ok := errors.AsType[*runtime.ExitError](o.Err); ok {
		attrs = append(attrs, slog.Int(telemetry.ExitCode, exit.Code), slog.Any("error", o.Err))
	}
	return attrs
}
