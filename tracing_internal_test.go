package relay

import (
	"context"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/stream"
)

// TestUnsampledTracers: the spans of a noop provider start without
// attributes; an SDK provider's get them at start, where its sampler sees
// them.
func TestUnsampledTracers(t *testing.T) {
	if !telemetry.Unsampled(newTracer(noop.NewTracerProvider())) {
		t.Error("unsampled(noop tracer) = false")
	}
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	tr := newTracer(tp)
	if telemetry.Unsampled(tr) {
		t.Fatal("unsampled(SDK tracer) = true")
	}
	_, span := startMessageSpan(context.Background(), tr, identity{"events", "workers", "c1"}, stream.Message{ID: "1-0", Deliveries: 1})
	endMessageSpan(span, true)
	if got := rec.Ended(); len(got) != 1 || len(got[0].Attributes()) != 8 {
		t.Fatalf("SDK spans: %v, want one stream.message with 7 start attributes and its outcome", got)
	}
}
