package relay

import (
	"context"
	"errors"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// Link reasons (telemetry.AttrLink).
const (
	linkPreviousAttempt = "previous_attempt"
	linkDeadLettered    = "dead_lettered"
	linkCaller          = "caller"
)

func newTracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(telemetry.InstrumentationName)
}

// unsampled reports whether tr is a noop tracer, whose spans never record
// and only carry their parent's span context: those spans are started
// without attributes or links, since nothing would read them and
// building them was a twentieth of a no-op delivery's CPU
// (bench/RESULTS.md). `relay start` with tracing off passes a noop
// provider; a library user turns spans off the same way
// (docs/observability.md#traces).
func unsampled(tr trace.Tracer) bool {
	_, ok := tr.(noop.Tracer)
	return ok
}

// The start options of the spans of a noop tracer (unsampled), built once.
var (
	messageRootOpts  = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot()}
	messageChildOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
	attemptOpts      = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindInternal)}
)

// startMessageSpan starts the stream.message span of one delivery of msg.
// It continues the producer's trace when the entry carries a traceparent;
// otherwise the span is a new root.
func startMessageSpan(ctx context.Context, tr trace.Tracer, streamName, group, consumer string, msg stream.Message) (context.Context, trace.Span) {
	remote := false
	if sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), msg.Fields)); sc.IsValid() {
		ctx, remote = trace.ContextWithRemoteSpanContext(ctx, sc), true
	}
	if unsampled(tr) {
		opts := messageRootOpts
		if remote {
			opts = messageChildOpts
		}
		return tr.Start(ctx, telemetry.SpanStreamMessage, opts...)
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(messageAttrs(streamName, group, consumer, msg)...),
	}
	if !remote {
		opts = append(opts, trace.WithNewRoot())
	}
	return tr.Start(ctx, telemetry.SpanStreamMessage, opts...)
}

// messageAttrs are the attributes of the stream.message span of msg.
func messageAttrs(streamName, group, consumer string, msg stream.Message) []attribute.KeyValue {
	return []attribute.KeyValue{
		telemetry.AttrMessagingSystem.String(telemetry.MessagingSystem),
		telemetry.AttrMessagingOperationType.String("process"),
		telemetry.AttrMessagingDestination.String(streamName),
		telemetry.AttrMessagingConsumerGroup.String(group),
		telemetry.AttrMessagingConsumerID.String(consumer),
		telemetry.AttrMessagingMessageID.String(msg.ID),
		telemetry.AttrDeliveryCount.Int64(msg.Deliveries),
	}
}

// endMessageSpan records whether the message was acknowledged or stays
// pending on its delivery's span, and ends it.
func endMessageSpan(span trace.Span, acked bool) {
	if !span.IsRecording() {
		span.End() // attributes of a span not recorded go nowhere
		return
	}
	outcome := "pending"
	if acked {
		outcome = "acked"
	}
	span.SetAttributes(telemetry.AttrOutcome.String(outcome))
	span.End()
}

// startAttempt starts the function.invoke span of one handler attempt as a
// child of ctx's span, linked to the span of the invocation's previous
// attempt when the state store returned its lineage (prev).
func startAttempt(ctx context.Context, tr trace.Tracer, app, handler, messageID string, attempt, maxAttempts int, prev string) (context.Context, trace.Span) {
	if unsampled(tr) {
		return tr.Start(ctx, telemetry.SpanFunctionInvoke, attemptOpts...)
	}
	return tr.Start(ctx, telemetry.SpanFunctionInvoke, trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attemptAttrs(app, handler, messageID, attempt, maxAttempts)...), trace.WithLinks(attemptLinks(prev)...))
}

// attemptAttrs are the attributes of an attempt's function.invoke span.
func attemptAttrs(app, handler, messageID string, attempt, maxAttempts int) []attribute.KeyValue {
	attrs := []attribute.KeyValue{
		telemetry.AttrApp.String(app),
		telemetry.AttrHandler.String(handler),
		telemetry.AttrAttempt.Int(attempt),
	}
	if maxAttempts > 0 {
		attrs = append(attrs, telemetry.AttrMaxAttempts.Int(maxAttempts))
	}
	if messageID != "" {
		attrs = append(attrs, telemetry.AttrMessagingMessageID.String(messageID))
	}
	return attrs
}

// attemptLinks links an attempt's span to the span of the invocation's
// previous attempt, whose traceparent is prev.
func attemptLinks(prev string) []trace.Link {
	sc := telemetry.ParseTraceparent(prev)
	if !sc.IsValid() {
		return nil
	}
	return []trace.Link{{SpanContext: sc, Attributes: []attribute.KeyValue{telemetry.AttrLink.String(linkPreviousAttempt)}}}
}

// endAttempt records how an attempt ended on its span and ends it; err is
// the runner's error.
func endAttempt(span trace.Span, result Result, err error) {
	if !span.IsRecording() {
		span.End() // attributes and status of a span not recorded go nowhere
		return
	}
	span.SetAttributes(telemetry.AttrResult.String(string(result)))
	if exit, ok := errors.AsType[*runtime.ExitError](err); ok {
		span.SetAttributes(telemetry.AttrExitCode.Int(exit.Code))
	} else if err == nil {
		span.SetAttributes(telemetry.AttrExitCode.Int(0))
	}
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// lineage is what an attempt leaves for the next one and for its DLQ entry:
// the traceparent of its span when Relay records it, so nothing is stored
// while tracing is off.
func lineage(span trace.Span) string {
	if !span.IsRecording() {
		return ""
	}
	return telemetry.Traceparent(span.SpanContext())
}

// dlqTrace is the trace lineage of a DLQ entry: the span of the attempt
// (or delivery) that dead-lettered it. With tracing off, that span carries
// the producer's context when the entry had one, so the entry keeps the
// producer's traceparent.
func dlqTrace(span trace.Span) string { return telemetry.Traceparent(span.SpanContext()) }

// startManual starts the root span of a manual run (Invoke, Replay). It is
// a new root even when ctx holds a span; that span, when there is one, is
// linked as the caller.
func startManual(ctx context.Context, tr trace.Tracer, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	var links []trace.Link
	if sc := trace.SpanContextFromContext(ctx); sc.IsValid() {
		links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{telemetry.AttrLink.String(linkCaller)}})
	}
	return tr.Start(ctx, name, trace.WithNewRoot(), trace.WithSpanKind(trace.SpanKindInternal),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
}

// spanLogAttrs prefixes attrs with the message id and the span ids of a log
// line about a message; span may be nil.
func spanLogAttrs(messageID string, span trace.Span, attrs ...slog.Attr) []slog.Attr {
	out := append(make([]slog.Attr, 0, 3+len(attrs)), slog.String(telemetry.MessageID, messageID))
	if span != nil {
		out = telemetry.AppendSpanAttrs(out, span)
	}
	return append(out, attrs...)
}

// withLineage returns l carrying the lineage of span, for the transition
// that ends the attempt.
func withLineage(l invocation.Lease, span trace.Span) invocation.Lease {
	l.Trace = lineage(span)
	return l
}
