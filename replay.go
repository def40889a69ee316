package relay

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
)

// DLQReader reads and deletes dead-letter entries by id; dlq.Store and
// relaytest.DLQ implement it. Get returns dlq.ErrNotFound for an unknown
// id; so may Delete.
type DLQReader interface {
	Get(ctx context.Context, id string) (dlq.Entry, error)
	Delete(ctx context.Context, id string) error
}

// Replay runs the invocation recorded by the dead-letter entry id once
// more: that exact app and handler, with the stored event, through runner
// (reference.md "CLI", relay dlq replay). Like Invoke it is outside the
// stream lifecycle: no invocation state, no retry, no new DLQ entry. The
// request carries the entry's original message id (RELAY_MESSAGE_ID, so a
// handler can recognise the event) and the attempt after the recorded ones;
// the current timeout of the handler's event rule applies.
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
// Tracing (reference.md "Observability"): the call is a dlq.replay span, a
// new root linked to the entry's stored trace (the span of the attempt that
// dead-lettered it, or the producer's context) and to the span ctx holds,
// if any; the run is its function.invoke child, whose context the handler
// gets as TRACEPARENT. The only option that applies is WithTracerProvider;
// any other is an error.
func Replay(ctx context.Context, apps *Apps, runner Runner, store DLQReader, id string, opts ...Option) (err error) {
	if apps == nil || runner == nil || store == nil {
		return errors.New("relay: Replay: nil apps, runner or store")
	}
	tr, err := manualTracer("Replay", opts)
	if err != nil {
		return err
	}
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
	app := apps.Get(e.App)
	if app == nil {
		return fmt.Errorf("replay %s: %w: app %q is not in the apps root", id, ErrHandlerGone, e.App)
	}
	if !app.Available() {
		return fmt.Errorf("replay %s %s: %w: %w", id, target, ErrAppUnavailable, app.Errors.Err())
	}
	input, timeout, err := replayTarget(app, e)
	if err != nil {
		return fmt.Errorf("replay %s: %w", id, err)
	}
	res := runManual(ctx, tr, runner, runtime.Request{
		App: app.Name, Handler: e.Handler, MessageID: e.OriginalID, Attempt: e.HandlerAttempts + 1,
		Event: input, Timeout: timeout, Spec: app.Spec,
	})
	if res.Err != nil {
		return fmt.Errorf("replay %s %s: %w", id, target, res.Err)
	}
	dctx, cancel := detached(ctx)
	defer cancel()
	if err := store.Delete(dctx, id); err != nil && !errors.Is(err, dlq.ErrNotFound) {
		return fmt.Errorf("replay %s %s: the handler succeeded but the entry was not deleted: %w", id, target, err)
	}
	return nil
}

// replayTarget returns the stdin and timeout of the handler a DLQ entry
// names: its event rule's, or for a schedule occurrence its schedule's.
func replayTarget(app *App, e dlq.Entry) ([]byte, time.Duration, error) {
	if !isOccurrence(e.Event) {
		i := slices.IndexFunc(app.Rules, func(r Rule) bool { return r.Handler == e.Handler })
		if i < 0 {
			return nil, 0, fmt.Errorf("%w: app %q has no event rule with handler %q", ErrHandlerGone, e.App, e.Handler)
		}
		return []byte(e.Event), app.Rules[i].Timeout, nil
	}
	env, err := schedule.DecodeEnvelope([]byte(e.Event))
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrReplayMalformed, err)
	}
	i := slices.IndexFunc(app.Schedules, func(s Schedule) bool { return s.Name == env.Schedule })
	if i < 0 || app.Schedules[i].Handler != e.Handler {
		return nil, 0, fmt.Errorf("%w: app %q has no schedule %q with handler %q", ErrHandlerGone, e.App, env.Schedule, e.Handler)
	}
	return env.Input(), app.Schedules[i].Timeout, nil
}
