package telemetry

import (
	"context"
	"log/slog"
	"testing"

	"github.com/google/go-cmp/cmp"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

const (
	tp    = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	state = "vendor=opaque"
)

func TestTraceparentRoundTrip(t *testing.T) {
	sc := ParseTraceparent(tp)
	if !sc.IsValid() || !sc.IsRemote() || !sc.IsSampled() {
		t.Fatalf("ParseTraceparent(%q) = %+v, want a valid, remote, sampled span context", tp, sc)
	}
	if got := Traceparent(sc); got != tp {
		t.Errorf("Traceparent = %q, want %q", got, tp)
	}
	for _, bad := range []string{"", "00-xyz-01", "00-00000000000000000000000000000000-00f067aa0ba902b7-01"} {
		if sc := ParseTraceparent(bad); sc.IsValid() {
			t.Errorf("ParseTraceparent(%q) is valid", bad)
		}
	}
	if got := Traceparent(trace.SpanContext{}); got != "" {
		t.Errorf("Traceparent of an invalid span context = %q, want empty", got)
	}
}

func TestExtractInject(t *testing.T) {
	ctx := Extract(context.Background(), map[string]string{"event": "{}", FieldTraceparent: tp, FieldTracestate: state})
	sc := trace.SpanContextFromContext(ctx)
	if Traceparent(sc) != tp || sc.TraceState().String() != state {
		t.Fatalf("extracted %s / %q, want %s / %q", Traceparent(sc), sc.TraceState().String(), tp, state)
	}
	fields := map[string]string{"event": "{}"}
	Inject(ctx, fields)
	want := map[string]string{"event": "{}", FieldTraceparent: tp, FieldTracestate: state}
	if diff := cmp.Diff(want, fields); diff != "" {
		t.Errorf("injected fields (-want +got):\n%s", diff)
	}
	if sc := trace.SpanContextFromContext(Extract(context.Background(), map[string]string{"event": "{}"})); sc.IsValid() {
		t.Error("a span context was extracted from fields without traceparent")
	}
}

func TestHandlerEnv(t *testing.T) {
	sc := trace.SpanContextFromContext(Extract(context.Background(), map[string]string{FieldTraceparent: tp, FieldTracestate: state}))
	if diff := cmp.Diff(map[string]string{EnvTraceparent: tp, EnvTracestate: state}, HandlerEnv(sc)); diff != "" {
		t.Errorf("HandlerEnv (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{EnvTraceparent: tp}, HandlerEnv(ParseTraceparent(tp))); diff != "" {
		t.Errorf("HandlerEnv without tracestate (-want +got):\n%s", diff)
	}
	if env := HandlerEnv(trace.SpanContext{}); env != nil {
		t.Errorf("HandlerEnv of an invalid span context = %v, want nil", env)
	}
}

func TestSpanAttrs(t *testing.T) {
	remote := trace.ContextWithRemoteSpanContext(context.Background(), ParseTraceparent(tp))
	// A span that is not recorded keeps the trace id but names no span.
	if diff := cmp.Diff([]slog.Attr{slog.String(TraceID, "4bf92f3577b34da6a3ce929d0e0e4736")},
		SpanAttrs(trace.SpanFromContext(remote))); diff != "" {
		t.Errorf("unrecorded span (-want +got):\n%s", diff)
	}
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	_, span := tp.Tracer("test").Start(remote, "s")
	defer span.End()
	want := []slog.Attr{
		slog.String(TraceID, "4bf92f3577b34da6a3ce929d0e0e4736"),
		slog.String(SpanID, span.SpanContext().SpanID().String()),
	}
	if diff := cmp.Diff(want, SpanAttrs(span)); diff != "" {
		t.Errorf("recorded span (-want +got):\n%s", diff)
	}
	if attrs := SpanAttrs(trace.SpanFromContext(context.Background())); attrs != nil {
		t.Errorf("no span: %v, want none", attrs)
	}
}
