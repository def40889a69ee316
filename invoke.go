package relay

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
)

// InvokeResult is the outcome of one handler run by Invoke.
type InvokeResult struct {
	App     string
	Handler string
	// Duration is the wall time of the run, runtime setup included.
	Duration time.Duration
	// Err is nil when the handler succeeded. It wraps *runtime.ExitError
	// when the handler failed or timed out, and is any other error when the
	// handler could not run (see Runner).
	Err error
}

// Failed reports whether the handler did not succeed.
func (r InvokeResult) Failed() bool { return r.Err != nil }

// Invoke runs every rule of app whose pattern matches event once,
// synchronously and in declaration order, with runner: a manual invocation
// outside the stream lifecycle (reference.md "CLI", relay app invoke).
// Nothing is recorded in Redis: no invocation state, no retry, no DLQ entry.
// A failed rule is reported in its result and the next rule still runs.
// Each request has no MessageID, Attempt 1 and the rule's timeout; now()
// cutoffs are evaluated at the current time.
//
// It returns no results and a nil error when no rule matches. The error
// wraps matcher.ErrMalformed when event is not one JSON object and
// ErrAppUnavailable when the app has template errors; nothing runs then.
// When ctx is cancelled, the rules not started yet are skipped and the
// error wraps ctx.Err(), alongside the results so far.
//
// Tracing (reference.md "Observability"): the call is an app.manual_invoke
// span, a new root (linked to the span ctx holds, if any), with one
// function.invoke child per rule run, whose context the handler gets as
// TRACEPARENT. The only option that applies is WithTracerProvider; any
// other is an error.
func Invoke(ctx context.Context, app *App, runner Runner, event []byte, opts ...Option) ([]InvokeResult, error) {
	if app == nil || runner == nil {
		return nil, errors.New("relay: Invoke: nil app or runner")
	}
	tr, err := manualTracer("Invoke", opts)
	if err != nil {
		return nil, err
	}
	obj, err := matcher.DecodeEvent(event)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", app.Name, err)
	}
	if !app.Available() {
		return nil, fmt.Errorf("invoke %s: %w: %w", app.Name, ErrAppUnavailable, app.Errors.Err())
	}
	ctx, span := startManual(ctx, tr, telemetry.SpanManualInvoke, telemetry.AttrApp.String(app.Name))
	defer span.End()
	now := time.Now()
	var results []InvokeResult
	for _, rule := range app.Rules {
		if !rule.Pattern.MatchValue(obj, now) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return results, fmt.Errorf("invoke %s: %w", app.Name, err)
		}
		results = append(results, runManual(ctx, tr, runner, runtime.Request{
			App: app.Name, Handler: rule.Handler, Attempt: 1,
			Event: event, Timeout: rule.Timeout, Spec: app.Spec,
		}))
	}
	return results, nil
}

// manualTracer builds the options of Invoke or Replay (named fn), of which
// only WithTracerProvider applies, and returns the tracer they select.
func manualTracer(fn string, opts []Option) (trace.Tracer, error) {
	o, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	for _, name := range slices.Sorted(maps.Keys(o.set)) {
		if name != "WithTracerProvider" {
			return nil, fmt.Errorf("relay: %s: option %s does not apply; only WithTracerProvider does", fn, name)
		}
	}
	return newTracer(o.tracerProvider), nil
}

// runManual runs one request of Invoke or Replay as a function.invoke span
// under ctx's span, and times it.
func runManual(ctx context.Context, tr trace.Tracer, runner Runner, req runtime.Request) InvokeResult {
	ctx, span := startAttempt(ctx, tr, req.App, req.Handler, req.MessageID, req.Attempt, 0, "")
	req.Env = telemetry.HandlerEnv(span.SpanContext())
	start := time.Now()
	_, err := runner.Run(ctx, req)
	res := InvokeResult{App: req.App, Handler: req.Handler, Duration: time.Since(start), Err: err}
	endAttempt(span, manualResult(err), err)
	return res
}

// manualResult is the outcome label of a manual run's error.
func manualResult(err error) string {
	exit, isExit := errors.AsType[*runtime.ExitError](err)
	switch {
	case err == nil:
		return outcomeSuccess
	case isExit && exit.TimedOut:
		return outcomeTimeout
	case isExit && exit.OOMKilled:
		return outcomeOOM
	case isExit:
		return outcomeFailure
	case errors.Is(err, runtime.ErrUnavailable):
		return outcomeUnavailable
	}
	return outcomeError
}
