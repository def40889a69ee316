package relay

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
)

// Sentinels of Manual.Invoke and Manual.Replay, for callers that branch on
// why nothing ran. Each is wrapped with the app, handler or entry it
// concerns.
var (
	// ErrAppUnavailable: the app's template has errors, so none of its
	// handlers may run.
	ErrAppUnavailable = errors.New("relay: app unavailable")
	// ErrReplayMalformed: the dead-letter entry records a malformed message
	// (app and handler "-"); it has no handler to run again.
	ErrReplayMalformed = errors.New("relay: a malformed-message entry cannot be replayed")
	// ErrHandlerGone: the app named by a dead-letter entry is no longer
	// loaded, or has no event rule with the entry's handler any more.
	ErrHandlerGone = errors.New("relay: handler no longer exists")
)

// manualWriteTimeout bounds the deletion of a replayed entry.
const manualWriteTimeout = 10 * time.Second

// Manual runs invocations outside the stream lifecycle: relay app invoke
// and relay dlq replay (docs/operations.md#commands).
// Nothing is recorded in invocation state: no retry, no new dead-letter
// entry. The zero TracerProvider means otel.GetTracerProvider().
type Manual struct {
	Runner         Runner
	TracerProvider trace.TracerProvider
}

// InvokeResult is the outcome of one handler run by Manual.Invoke.
type InvokeResult struct {
	App     string
	Handler string
	// Duration is the wall time of the run, runtime setup included.
	Duration time.Duration
	// Err is nil when the handler succeeded. It wraps *runtime.ExitError
	// when the handler failed, timed out or was killed, and is any other
	// error when the handler could not run (see Runner).
	Err error
}

// Failed reports whether the handler did not succeed.
func (r InvokeResult) Failed() bool { return r.Err != nil }

func (m Manual) tracer() trace.Tracer {
	tp := m.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return newTracer(tp)
}

// Invoke runs every rule of a whose pattern matches event once,
// synchronously and in declaration order: relay app invoke. A failed rule
// is reported in its result and the next rule still runs. Each request has
// no MessageID, Attempt 1 and the rule's timeout; now() cutoffs are
// evaluated at the current time.
//
// It returns no results and a nil error when no rule matches. The error
// wraps matcher.ErrMalformed when event is not one JSON object and
// ErrAppUnavailable when the app has template errors; nothing runs then.
// When ctx is cancelled, the rules not started yet are skipped and the
// error wraps ctx.Err(), alongside the results so far.
//
// Tracing (docs/observability.md#traces): the call is an app.manual_invoke
// span, a new root (linked to the span ctx holds, if any), with one
// function.invoke child per rule run, whose context the handler gets as
// TRACEPARENT.
func (m Manual) Invoke(ctx context.Context, a *app.App, event []byte) ([]InvokeResult, error) {
	if a == nil || m.Runner == nil {
		return nil, errors.New("relay: Manual.Invoke: nil app or Runner")
	}
	obj, err := matcher.DecodeEvent(event)
	if err != nil {
		return nil, fmt.Errorf("invoke %s: %w", a.Name, err)
	}
	if !a.Available() {
		return nil, fmt.Errorf("invoke %s: %w: %w", a.Name, ErrAppUnavailable, a.Errors.Err())
	}
	tr := m.tracer()
	ctx, span := startManual(ctx, tr, telemetry.SpanManualInvoke, telemetry.AttrApp.String(a.Name))
	defer span.End()
	now := time.Now()
	var results []InvokeResult
	for _, rule := range a.Rules {
		if !rule.Pattern.MatchValue(obj, now) {
			continue
		}
		if err := ctx.Err(); err != nil {
			return results, fmt.Errorf("invoke %s: %w", a.Name, err)
		}
		results = append(results, m.run(ctx, tr, runtime.Request{
			App: a.Name, Handler: rule.Handler, Attempt: 1,
			Event: event, Timeout: rule.Timeout, Spec: a.Spec,
		}))
	}
	return results, nil
}

// DLQReader reads and deletes dead-letter entries by id; dlq.Store and
// relaytest.DLQ implement it. Get returns dlq.ErrNotFound for an unknown
// id; so may Delete.
type DLQReader interface {
	Get(ctx context.Context, id string) (dlq.Entry, error)
	Delete(ctx context.Context, id string) error
}

// Replay runs the invocation recorded by the dead-letter entry id once
// more: that exact app and handler, with the stored event (relay dlq
// replay). The request carries the entry's original message id
// (RELAY_MESSAGE_ID, so a handler can recognise the event) and the attempt
// after the recorded ones; the current timeout of the handler's event rule
// applies.
//
// On success the entry is deleted, under a context detached from ctx so an
// interrupt right after the handler finished cannot leave it behind; an
// entry deleted meanwhile by someone else counts as deleted. On failure the
// entry is kept and the error wraps the runner's (a *runtime.ExitError when
// the handler failed).
//
// An entry of a schedule occurrence runs the handler with the occurrence's
// stdin ({"source":"relay.schedule","schedule":...,"scheduled_at":...})
// and the current timeout of that schedule, which must still exist and
// still name the handler.
//
// Nothing runs when the entry is missing (dlq.ErrNotFound), records a
// malformed message (ErrReplayMalformed), names an app or handler that is
// no longer loaded or has no event rule or schedule (ErrHandlerGone), or
// an app with template errors (ErrAppUnavailable). Two concurrent Replays
// of one entry both run it.
//
// Tracing (docs/observability.md#traces): the call is a dlq.replay span, a
// new root linked to the entry's stored trace (the span of the attempt that
// dead-lettered it, or the producer's context) and to the span ctx holds,
// if any; the run is its function.invoke child, whose context the handler
// gets as TRACEPARENT.
func (m Manual) Replay(ctx context.Context, apps *app.Set, store DLQReader, id string) (err error) {
	if apps == nil || m.Runner == nil || store == nil {
		return errors.New("relay: Manual.Replay: nil apps, Runner or store")
	}
	tr := m.tracer()
	ctx, span := startManual(ctx, tr, telemetry.SpanDLQReplay, telemetry.AttrDLQID.String(id))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.End()
	}()
	e, err := store.Get(ctx, id)
	if err != nil {
		return err
	}
	span.SetAttributes(telemetry.AttrApp.String(e.App), telemetry.AttrHandler.String(e.Handler),
		telemetry.AttrMessagingMessageID.String(e.OriginalID))
	if sc := telemetry.ParseTraceparent(e.Trace); sc.IsValid() {
		span.AddLink(trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{telemetry.AttrLink.String(linkDeadLettered)}})
	}
	target := e.App + "/" + e.Handler
	if e.App == dlq.MalformedName || e.Handler == dlq.MalformedName {
		return fmt.Errorf("replay %s: %w", id, ErrReplayMalformed)
	}
	a := apps.Get(e.App)
	if a == nil {
		return fmt.Errorf("replay %s: %w: app %q is not in the apps root", id, ErrHandlerGone, e.App)
	}
	if !a.Available() {
		return fmt.Errorf("replay %s %s: %w: %w", id, target, ErrAppUnavailable, a.Errors.Err())
	}
	input, timeout, err := replayTarget(a, e)
	if err != nil {
		return fmt.Errorf("replay %s: %w", id, err)
	}
	res := m.run(ctx, tr, runtime.Request{
		App: a.Name, Handler: e.Handler, MessageID: e.OriginalID, Attempt: e.HandlerAttempts + 1,
		Event: input, Timeout: timeout, Spec: a.Spec,
	})
	if res.Err != nil {
		return fmt.Errorf("replay %s %s: %w", id, target, res.Err)
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), manualWriteTimeout)
	defer cancel()
	if err := store.Delete(dctx, id); err != nil && !errors.Is(err, dlq.ErrNotFound) {
		return fmt.Errorf("replay %s %s: the handler succeeded but the entry was not deleted: %w", id, target, err)
	}
	return nil
}

// replayTarget returns the stdin and timeout of the handler a DLQ entry
// names: its event rule's, or for a schedule occurrence its schedule's.
func replayTarget(a *app.App, e dlq.Entry) ([]byte, time.Duration, error) {
	if !schedule.IsEnvelope([]byte(e.Event)) {
		i := a.RuleIndex(e.Handler)
		if i < 0 {
			return nil, 0, fmt.Errorf("%w: app %q has no event rule with handler %q", ErrHandlerGone, e.App, e.Handler)
		}
		return []byte(e.Event), a.Rules[i].Timeout, nil
	}
	env, err := schedule.DecodeEnvelope([]byte(e.Event))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrReplayMalformed, err)
	}
	s := a.Schedule(env.Schedule)
	if s == nil || s.Handler != e.Handler {
		return nil, 0, fmt.Errorf("%w: app %q has no schedule %q with handler %q", ErrHandlerGone, e.App, env.Schedule, e.Handler)
	}
	return env.Input(), s.Timeout, nil
}

// run runs one request of Invoke or Replay as a function.invoke span
// under ctx's span, and times it.
func (m Manual) run(ctx context.Context, tr trace.Tracer, req runtime.Request) InvokeResult {
	ctx, span := startAttempt(ctx, tr, req.App, req.Handler, req.MessageID, req.Attempt, 0, "")
	req.Env = telemetry.HandlerEnv(span.SpanContext())
	start := time.Now()
	_, err := m.Runner.Run(ctx, req)
	res := InvokeResult{App: req.App, Handler: req.Handler, Duration: time.Since(start), Err: err}
	endAttempt(span, resultOf(err), err)
	return res
}
