package telemetry

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/relaydev/relay/runtime"
)

// The spans of one handler attempt, shared by the Engine's deliveries and
// the manual runs of package manual (docs/observability.md#traces).

// Link reasons (AttrLink).
const (
	LinkPreviousAttempt = "previous_attempt"
	LinkDeadLettered    = "dead_lettered"
	LinkCaller          = "caller"
)

// Unsampled reports whether tr is a noop tracer, whose spans never record
// and only carry their parent's span context: those spans are started
// without attributes or links, since nothing would read them and
// building them was a twentieth of a no-op delivery's CPU
// (bench/RESULTS.md). `relay start` with tracing off passes a noop
// provider; a library user turns spans off the same way
// (docs/observability.md#traces).
func Unsampled(tr trace.Tracer) bool {
	_, ok := tr.(noop.Tracer)
	return ok
}

var attemptOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}

// StartAttempt starts the function.invoke span of one handler attempt as a
// child of ctx's span, linked to the span of the invocation's previous
// attempt when the state store returned its lineage (prev).
func StartAttempt(ctx context.Context, tr trace.Tracer, app, handler, messageID string, attempt, maxAttempts int, prev string) (context.Context, trace.Span) {
	if Unsampled(tr) {
		return tr.Start(ctx, SpanFunctionInvoke, attemptOpts...)
	}
	return tr.Start(ctx, SpanFunctionInvoke, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attemptAttrs(app, handler, messageID, attempt, maxAttempts)...), trace.WithLinks(attemptLinks(prev)...))
}

// attemptAttrs are the attributes of an attempt's function.invoke span.
func attemptAttrs(app, handler, messageID string, attempt, maxAttempts int) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		AttrApp.String(app),
		AttrHandler.String(handler),
		AttrAttempt.Int(attempt),
	}
	if maxAttempts > 0 {
		attrs = append(attrs, AttrMaxAttempts.Int(maxAttempts))
	}
	if messageID != "" {
		attrs = append(attrs, AttrMessagingMessageID.String(messageID))
	}
	return attrs
}

// attemptLinks links an attempt's span to the span of the invocation's
// previous attempt, whose traceparent is prev.
func attemptLinks(prev string) []trace.Link {
	sc := ParseTraceparent(prev)
	if !sc.IsValid() {
		return nil
	}
	return []trace.Link{{SpanContext: sc, Attributes: []attribute.KeyValue{AttrLink.String(LinkPreviousAttempt)}}}
}

// EndAttempt records how an attempt ended on its span and ends it; err is
// the runner's error.
func EndAttempt(span trace.Span, result string, err error) {
	if !span.IsRecording() {
		span.End() // attributes and status of a span not recorded go nowhere
		return
	}
	span.SetAttributes(AttrResult.String(result))
	if exit, ok := errors.AsType[*runtime.ExitError](err); ok {
		span.SetAttributes(AttrExitCode.Int(exit.Code))
	} else if err == nil {
		span.SetAttributes(AttrExitCode.Int(0))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// StartManual starts the root span of a manual run (Invoke, Replay). It is
// a new root even when ctx holds a span; that span, when there is one, is
// linked as the caller.
func StartManual(ctx context.Context, tr trace.Tracer, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	var links []trace.Link
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrLink.String(LinkCaller)}})
	}
	return tr.Start(ctx, name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
}
