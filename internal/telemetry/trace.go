package telemetry

import (
	"context"
	"log/slog"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// InstrumentationName is the instrumentation scope of every tracer Relay
// creates.
const InstrumentationName = "github.com/relaydev/relay"

// Span names (docs/observability.md#spans).
const (
	// SpanStreamMessage covers one delivery of one stream entry: classify,
	// run the due attempts, record, acknowledge. Kind consumer; a child of
	// the producer's context when the entry carries one.
	SpanStreamMessage = "stream.message"
	// SpanFunctionInvoke covers one handler attempt, a child of its
	// delivery's stream.message (or of app.manual_invoke, dlq.replay).
	SpanFunctionInvoke = "function.invoke"
	// SpanManualInvoke is the root of relay app invoke (relay.Invoke).
	SpanManualInvoke = "app.manual_invoke"
	// SpanDLQReplay is the root of relay dlq replay (relay.Replay).
	SpanDLQReplay = "dlq.replay"
	// SpanSchedulePublish covers the publication of one schedule occurrence.
	SpanSchedulePublish = "schedule.publish"
)

// Stream entry fields that carry trace context beside "event", and the
// handler environment variables that carry it on (W3C Trace Context).
const (
	FieldTraceparent = "traceparent"
	FieldTracestate  = "tracestate"
	EnvTraceparent   = "TRACEPARENT"
	EnvTracestate    = "TRACESTATE"
)

// Log attribute keys of the span a log line is about.
const (
	TraceID = "trace_id"
	SpanID  = "span_id"
)

// Span attribute keys. The messaging ones follow the OpenTelemetry
// messaging semantic conventions. Relay's own facts (app, handler, attempt,
// result: docs/observability.md#spans) use the keys of the log attributes
// above, so a span and the log lines about it are searched with the same
// names.
const (
	AttrMessagingSystem        = attribute.Key("messaging.system")
	AttrMessagingOperationType = attribute.Key("messaging.operation.type")
	AttrMessagingDestination   = attribute.Key("messaging.destination.name")
	AttrMessagingConsumerGroup = attribute.Key("messaging.consumer.group.name")
	AttrMessagingMessageID     = attribute.Key("messaging.message.id")
	AttrMessagingConsumerID    = attribute.Key("messaging.client.id")
	// AttrDeliveryCount is the entry's PEL delivery count, named after the
	// per-system delivery_count attributes of the conventions.
	AttrDeliveryCount = attribute.Key("messaging.redis.message.delivery_count")

	AttrApp      = attribute.Key(App)
	AttrHandler  = attribute.Key(Handler)
	AttrAttempt  = attribute.Key(Attempt)
	AttrExitCode = attribute.Key(ExitCode)
	// AttrResult is an attempt's outcome: success, failure, timeout,
	// unavailable or error, the outcome label of relay_invocations_total.
	AttrResult = attribute.Key("result")
	// AttrMaxAttempts is the rule's retries + 1.
	AttrMaxAttempts = attribute.Key("max_attempts")
	// AttrOutcome is what a delivery did with its message: acked, or
	// pending (held for a retry, an unavailable app, a failed write).
	AttrOutcome = attribute.Key("outcome")
	// AttrLink says why a span links to another: previous_attempt,
	// dead_lettered or caller.
	AttrLink = attribute.Key("link")
	// AttrDLQID is the dead-letter entry a replay runs.
	AttrDLQID = attribute.Key("dlq_id")
)

// MessagingSystem is the messaging.system of Relay's stream spans.
const MessagingSystem = "redis"

// propagator reads and writes W3C traceparent/tracestate. Relay uses it
// whatever global propagator a program installs: the stream fields and the
// handler environment are a wire contract.
var propagator = propagation.TraceContext{}

// Extract returns ctx carrying the remote span context found in the
// traceparent and tracestate entries of fields (stream entry fields), or
// ctx unchanged when there is none or it is malformed.
func Extract(ctx context.Context, fields map[string]string) context.Context {
	if fields[FieldTraceparent] == "" {
		return ctx
	}
	return propagator.Extract(ctx, propagation.MapCarrier(fields))
}

// Inject writes the span context of ctx into fields as traceparent and
// tracestate, for a producer putting them beside "event". Nothing is
// written when ctx has no valid span context.
func Inject(ctx context.Context, fields map[string]string) {
	propagator.Inject(ctx, propagation.MapCarrier(fields))
}

// Traceparent returns sc as a W3C traceparent
// ("00-<trace-id>-<span-id>-<flags>"), or "" when sc is not valid.
func Traceparent(sc trace.SpanContext) string {
	if !sc.IsValid() {
		return ""
	}
	m := propagation.MapCarrier{}
	propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), m)
	return m[FieldTraceparent]
}

// ParseTraceparent is the inverse of Traceparent: the remote span context
// of a W3C traceparent, or an invalid SpanContext when s is empty or
// malformed.
func ParseTraceparent(s string) trace.SpanContext {
	if s == "" {
		return trace.SpanContext{}
	}
	ctx := propagator.Extract(context.Background(), propagation.MapCarrier{FieldTraceparent: s})
	return trace.SpanContextFromContext(ctx)
}

// HandlerEnv returns the environment that hands sc to a handler
// (TRACEPARENT, and TRACESTATE when sc has one), or nil when sc is not
// valid.
func HandlerEnv(sc trace.SpanContext) map[string]string {
	if !sc.IsValid() {
		return nil
	}
	m := propagation.MapCarrier{}
	propagator.Inject(trace.ContextWithSpanContext(context.Background(), sc), m)
	env := map[string]string{EnvTraceparent: m[FieldTraceparent]}
	if ts := m[FieldTracestate]; ts != "" {
		env[EnvTracestate] = ts
	}
	return env
}

// SpanAttrs returns the log attributes naming span: trace_id when its span
// context is valid, and span_id when the span is recorded. A span Relay
// does not record (tracing off, sampled out) keeps the trace id it
// continues, since that still finds the producer's trace, but its span id
// would name a span that exists nowhere.
func SpanAttrs(span trace.Span) []slog.Attr {
	return AppendSpanAttrs(nil, span)
}

// AppendSpanAttrs appends the attributes of SpanAttrs to dst and returns
// the extended slice.
func AppendSpanAttrs(dst []slog.Attr, span trace.Span) []slog.Attr {
	sc := span.SpanContext()
	if !sc.IsValid() {
		return dst
	}
	dst = append(dst, slog.String(TraceID, sc.TraceID().String()))
	if span.IsRecording() {
		dst = append(dst, slog.String(SpanID, sc.SpanID().String()))
	}
	return dst
}
