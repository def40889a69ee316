package relay

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/stream"
)

func newTracer(tp trace.TracerProvider) trace.Tracer {
	return tp.Tracer(telemetry.InstrumentationName)
}

// The start options of the spans of a noop tracer (telemetry.Unsampled), built once.
var (
	messageRootOpts  = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer), trace.WithNewRoot()}
	messageChildOpts = []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindConsumer)}
)

// startMessageSpan starts the stream.message span of one delivery of msg.
// It continues the producer's trace when the entry carries a traceparent;
// otherwise the span is a new root.
func startMessageSpan(ctx context.Context, tr trace.Tracer, id identity, msg stream.Message) (context.Context, trace.Span) {
	remote := false
	if sc := trace.SpanContextFromContext(telemetry.Extract(context.Background(), msg.Fields)); sc.IsValid() {
		ctx, remote = trace.ContextWithRemoteSpanContext(ctx, sc), true
	}
	if telemetry.Unsampled(tr) {
		opts := messageRootOpts
		if remote {
			opts = messageChildOpts
		}
		return tr.Start(ctx, telemetry.SpanStreamMessage, opts...)
	}
	opts := []trace.SpanStartOption{
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(messageAttrs(id, msg)...),
	}
	if !remote {
		opts = append(opts, trace.WithNewRoot())
	}
	return tr.Start(ctx, telemetry.SpanStreamMessage, opts...)
}

// messageAttrs are the attributes of the stream.message span of msg.
func messageAttrs(id identity, msg stream.Message) []attribute.KeyValue {
	return []attribute.KeyValue{
		telemetry.AttrMessagingSystem.String(telemetry.MessagingSystem),
		telemetry.AttrMessagingOperationType.String("process"),
		telemetry.AttrMessagingDestination.String(id.stream),
		telemetry.AttrMessagingConsumerGroup.String(id.group),
		telemetry.AttrMessagingConsumerID.String(id.consumer),
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

// spanLogAttrs prefixes attrs with the message id and the span ids of a log
// line about a message; span may be nil.
func spanLogAttrs(messageID string, span trace.Span, attrs ...slog.Attr) []slog.Attr {
	out := append(make([]slog.Attr, 0, 3+len(attrs)), slog.String(telemetry.MessageID, messageID))
	if span != nil {
		out = telemetry.AppendSpanAttrs(out, span)
	}
	return append(out, attrs...)
}
