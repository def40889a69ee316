package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule/redisschedule"
)

// The producer's span context every traced test publishes beside the
// event, sampled.
const (
	producerTrace  = "4bf92f3577b34da6a3ce929d0e0e4736"
	producerSpan   = "00f067aa0ba902b7"
	producerParent = "00-" + producerTrace + "-" + producerSpan + "-01"
	producerState  = "vendor=opaque"
)

const flakyApp = `
image: relay.local/busybox:latest
events:
  - handler: orders.charge
    pattern: {kind: [order]}
    timeout: 5s
    retries: 3
`

// tracing records every span of a test in memory.
type tracing struct {
	exp *tracetest.InMemoryExporter
	tp  *sdktrace.TracerProvider
}

func newTracing(t *testing.T) *tracing {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{exp: exp, tp: tp}
}

// named returns the ended spans called name, in the order they ended.
func (tr *tracing) named(name string) tracetest.SpanStubs {
	var out tracetest.SpanStubs
	for _, s := range tr.exp.GetSpans() {
		if s.Name == name {
			out = append(out, s)
		}
	}
	return out
}

func attrMap(kvs []attribute.KeyValue) map[string]any {
	m := map[string]any{}
	for _, kv := range kvs {
		m[string(kv.Key)] = kv.Value.AsInterface()
	}
	return m
}

// subset reports the keys of want whose value in got differs.
func subset(want map[string]any, got []attribute.KeyValue) string {
	m := attrMap(got)
	var diffs []string
	for k, v := range want {
		if m[k] != v {
			diffs = append(diffs, fmt.Sprintf("%s = %v (%T), want %v (%T)", k, m[k], m[k], v, v))
		}
	}
	slices.Sort(diffs)
	return strings.Join(diffs, "; ")
}

func traceparentOf(sc trace.SpanContext) string {
	return "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-" + sc.TraceFlags().String()
}

// startTraced runs an Engine on h whose spans go to tp.
func (h *harness) startTraced(tp trace.TracerProvider, mods ...func(*timing)) {
	h.t.Helper()
	cfg := fastConfig(mods...)
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Metrics, cfg.TracerProvider = h.reg, tp
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: h.source, State: h.state, Runner: runtime.NewFunc(h.handlers),
		Stream: h.stream, Group: h.group, Consumer: "c1",
	}, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.run(e)
}

// envLog records the trace environment each run of a handler saw.
type envLog struct {
	mu   sync.Mutex
	envs []map[string]string
}

func (l *envLog) add(req runtime.Request) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.envs = append(l.envs, req.Env)
	return len(l.envs)
}

func (l *envLog) get() []map[string]string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.envs)
}

// TestTracingFollowsAnEventThroughRetries follows one event whose handler
// fails twice and then succeeds: three deliveries, each a stream.message
// span in the producer's trace, each with one function.invoke child; every
// retry links to the attempt before it, through the lineage kept in the
// invocation hash, and every handler run continues its own span
// (docs/observability.md#spans).
func TestTracingFollowsAnEventThroughRetries(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": flakyApp})
	tr := newTracing(t)
	var seen envLog
	h.handle("shop/orders.charge", func(_ context.Context, req runtime.Request) error {
		if n := seen.add(req); n <= 2 {
			return fmt.Errorf("card declined (run %d)", n)
		}
		return nil
	})
	// A retry is due well before the idle message is reclaimed, so every
	// delivery after the first runs an attempt.
	h.startTraced(tr.tp, backoff(20*time.Millisecond))
	id := h.publish("event", `{"kind":"order","id":7}`, "traceparent", producerParent, "tracestate", producerState)
	testutil.WaitFor(t, 15*time.Second, "three attempts and the ack", func() bool {
		return h.calls.Count("shop/orders.charge") == 3 && h.settled()
	})
	// The span of the last delivery ends right after its ack.
	testutil.WaitFor(t, 5*time.Second, "three stream.message spans", func() bool { return len(tr.named(telemetry.SpanStreamMessage)) == 3 })

	msgs, invokes := tr.named(telemetry.SpanStreamMessage), tr.named(telemetry.SpanFunctionInvoke)
	if len(msgs) != 3 || len(invokes) != 3 {
		t.Fatalf("%d stream.message and %d function.invoke spans, want 3 each", len(msgs), len(invokes))
	}
	for i, m := range msgs {
		if got := m.SpanContext.TraceID().String(); got != producerTrace {
			t.Errorf("stream.message %d: trace %s, want the producer's %s", i+1, got, producerTrace)
		}
		if got := m.Parent.SpanID().String(); got != producerSpan || !m.Parent.IsRemote() {
			t.Errorf("stream.message %d: parent %s (remote %v), want the producer's span %s", i+1, got, m.Parent.IsRemote(), producerSpan)
		}
		if m.SpanKind != trace.SpanKindConsumer {
			t.Errorf("stream.message %d: kind %v, want consumer", i+1, m.SpanKind)
		}
		outcome := "pending"
		if i == 2 {
			outcome = "acked"
		}
		if d := subset(map[string]any{
			"messaging.system": "redis", "messaging.destination.name": h.stream,
			"messaging.consumer.group.name": h.group, "messaging.client.id": "c1",
			"messaging.message.id": id, "messaging.operation.type": "process",
			"messaging.redis.message.delivery_count": int64(i + 1),
			"outcome":                                outcome,
		}, m.Attributes); d != "" {
			t.Errorf("stream.message %d attributes: %s", i+1, d)
		}
	}

	envs := seen.get()
	results := []string{"failure", "failure", "success"}
	exits := []int64{1, 1, 0}
	for i, s := range invokes {
		if s.Parent.SpanID() != msgs[i].SpanContext.SpanID() || s.SpanContext.TraceID() != msgs[i].SpanContext.TraceID() {
			t.Errorf("function.invoke %d: parent %s, want stream.message %s of the same delivery", i+1, s.Parent.SpanID(), msgs[i].SpanContext.SpanID())
		}
		if d := subset(map[string]any{
			"app": "shop", "handler": "orders.charge", "attempt": int64(i + 1),
			"max_attempts": int64(4), "result": results[i], "exit_code": exits[i],
			"messaging.message.id": id,
		}, s.Attributes); d != "" {
			t.Errorf("function.invoke %d attributes: %s", i+1, d)
		}
		wantCode := codes.Error
		if i == 2 {
			wantCode = codes.Unset
		}
		if s.Status.Code != wantCode {
			t.Errorf("function.invoke %d: status %v, want %v", i+1, s.Status.Code, wantCode)
		}
		var wantLinks []string
		if i > 0 {
			wantLinks = []string{traceparentOf(invokes[i-1].SpanContext) + " previous_attempt"}
		}
		var gotLinks []string
		for _, l := range s.Links {
			gotLinks = append(gotLinks, traceparentOf(l.SpanContext)+" "+attrMap(l.Attributes)["link"].(string))
		}
		if diff := cmp.Diff(wantLinks, gotLinks); diff != "" {
			t.Errorf("function.invoke %d links (-want +got):\n%s", i+1, diff)
		}
		want := map[string]string{"TRACEPARENT": traceparentOf(s.SpanContext), "TRACESTATE": producerState}
		if diff := cmp.Diff(want, envs[i]); diff != "" {
			t.Errorf("run %d: handler trace environment (-want +got):\n%s", i+1, diff)
		}
	}

	// The lineage the next attempt would read is the last failed one's.
	if got, want := h.hash(id)[invocation.TraceField("shop/orders.charge")], traceparentOf(invokes[1].SpanContext); got != want {
		t.Errorf("stored lineage %q, want attempt 2's %q", got, want)
	}
	// Log lines about the message name its trace, and the attempt's span.
	logs := h.logs.String()
	for i, msg := range []string{"invocation failed; will retry", "invocation failed; will retry", "invocation succeeded"} {
		want := fmt.Sprintf("trace_id=%s span_id=%s", producerTrace, invokes[i].SpanContext.SpanID())
		if !strings.Contains(logs, want) {
			t.Errorf("no log line %q names attempt %d's span (%s)", msg, i+1, want)
		}
	}
	for _, line := range strings.Split(logs, "\n") {
		if strings.Contains(line, "message_id="+id) && !strings.Contains(line, "trace_id="+producerTrace) {
			t.Errorf("log line about the message without its trace id: %s", line)
		}
	}
}

// TestTracingDeadLetterAndReplay exhausts an invocation, checks that its
// DLQ entry keeps the last attempt's span, and replays it: dlq.replay is a
// new root linked to that span, with the run as its function.invoke child.
func TestTracingDeadLetterAndReplay(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": `
image: relay.local/busybox:latest
events:
  - handler: orders.charge
    pattern: {kind: [order]}
    timeout: 5s
    retries: 1
`})
	tr := newTracing(t)
	h.handle("shop/orders.charge", func(context.Context, runtime.Request) error { return errors.New("card declined") })
	h.startTraced(tr.tp, backoff(20*time.Millisecond))
	id := h.publish("event", `{"kind":"order"}`, "traceparent", producerParent)
	testutil.WaitFor(t, 15*time.Second, "the DLQ entry and the ack", func() bool { return len(h.dlqEntries()) == 1 && h.settled() })
	testutil.WaitFor(t, 5*time.Second, "two stream.message spans", func() bool { return len(tr.named(telemetry.SpanStreamMessage)) == 2 })

	invokes := tr.named(telemetry.SpanFunctionInvoke)
	if len(invokes) != 2 {
		t.Fatalf("%d function.invoke spans, want 2", len(invokes))
	}
	last := invokes[1]
	entry := h.dlqEntries()[0]
	if want := traceparentOf(last.SpanContext); entry.Trace != want {
		t.Errorf("DLQ entry trace %q, want the last attempt's %q", entry.Trace, want)
	}
	if entry.OriginalID != id || entry.HandlerAttempts != 2 {
		t.Errorf("DLQ entry %+v, want message %s after 2 attempts", entry, id)
	}

	// The replay runs with the handler fixed, in a trace of its own.
	replays := newTracing(t)
	var env map[string]string
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{"shop/orders.charge": func(_ context.Context, req runtime.Request) error {
		env = req.Env
		return nil
	}})
	if err := (manual.Invoker{Runner: runner, TracerProvider: replays.tp}).Replay(t.Context(), h.apps, h.dlq, entry.ID); err != nil {
		t.Fatal(err)
	}
	roots, runs := replays.named(telemetry.SpanDLQReplay), replays.named(telemetry.SpanFunctionInvoke)
	if len(roots) != 1 || len(runs) != 1 {
		t.Fatalf("%d dlq.replay and %d function.invoke spans, want 1 each", len(roots), len(runs))
	}
	root, run := roots[0], runs[0]
	if root.Parent.IsValid() || root.SpanContext.TraceID() == last.SpanContext.TraceID() {
		t.Errorf("dlq.replay: parent %v, trace %s; want a new root", root.Parent, root.SpanContext.TraceID())
	}
	if len(root.Links) != 1 || root.Links[0].SpanContext.SpanID() != last.SpanContext.SpanID() ||
		root.Links[0].SpanContext.TraceID() != last.SpanContext.TraceID() {
		t.Errorf("dlq.replay links %+v, want the last attempt's span %s", root.Links, last.SpanContext.SpanID())
	}
	if d := subset(map[string]any{"dlq_id": entry.ID, "app": "shop", "handler": "orders.charge",
		"messaging.message.id": id}, root.Attributes); d != "" {
		t.Errorf("dlq.replay attributes: %s", d)
	}
	if run.Parent.SpanID() != root.SpanContext.SpanID() {
		t.Errorf("function.invoke parent %s, want dlq.replay %s", run.Parent.SpanID(), root.SpanContext.SpanID())
	}
	if d := subset(map[string]any{"attempt": int64(3), "result": "success", "exit_code": int64(0)}, run.Attributes); d != "" {
		t.Errorf("replayed function.invoke attributes: %s", d)
	}
	if got, want := env["TRACEPARENT"], traceparentOf(run.SpanContext); got != want {
		t.Errorf("replayed handler TRACEPARENT %q, want its span %q", got, want)
	}
}

// shopApp has three rules, two of which match kind "order".
const shopApp = `
image: relay.local/busybox:latest
events:
  - handler: orders.audit
    pattern: {kind: [order]}
  - handler: refunds.run
    pattern: {kind: [refund]}
  - handler: orders.charge
    pattern: {kind: [order]}
`

// TestTracingManualInvoke: manual.Invoker.Invoke is an app.manual_invoke root with
// one function.invoke child per matching rule, linked to a caller's span,
// all with the message id the handlers got.
func TestTracingManualInvoke(t *testing.T) {
	a := apptest.One(t, "shop", shopApp)
	tr := newTracing(t)
	envs := map[string]map[string]string{}
	handler := func(_ context.Context, req runtime.Request) error {
		envs[req.Handler] = req.Env
		if req.Handler == "orders.audit" {
			return errors.New("audit log full")
		}
		return nil
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{"orders.audit": handler, "orders.charge": handler})
	ctx, caller := tr.tp.Tracer("caller").Start(t.Context(), "caller")
	res, err := manual.Invoker{Runner: runner, TracerProvider: tr.tp}.Invoke(ctx, a, []byte(`{"kind":"order"}`))
	caller.End()
	if err != nil || len(res) != 2 {
		t.Fatalf("Invoke = %v, %v; want two results", res, err)
	}
	roots, runs := tr.named(telemetry.SpanManualInvoke), tr.named(telemetry.SpanFunctionInvoke)
	if len(roots) != 1 || len(runs) != 2 {
		t.Fatalf("%d app.manual_invoke and %d function.invoke spans, want 1 and 2", len(roots), len(runs))
	}
	root := roots[0]
	if root.Parent.IsValid() || root.SpanContext.TraceID() == caller.SpanContext().TraceID() {
		t.Errorf("app.manual_invoke: parent %v; want a new root", root.Parent)
	}
	if len(root.Links) != 1 || root.Links[0].SpanContext.SpanID() != caller.SpanContext().SpanID() ||
		attrMap(root.Links[0].Attributes)["link"] != "caller" {
		t.Errorf("app.manual_invoke links %+v, want the caller's span", root.Links)
	}
	id := res[0].MessageID
	if d := subset(map[string]any{"app": "shop", "messaging.message.id": id}, root.Attributes); d != "" || id == "" {
		t.Errorf("app.manual_invoke attributes, message id %q: %s", id, d)
	}
	want := map[string]map[string]any{
		"orders.audit":  {"app": "shop", "handler": "orders.audit", "attempt": int64(1), "result": "failure", "exit_code": int64(1), "messaging.message.id": id},
		"orders.charge": {"app": "shop", "handler": "orders.charge", "attempt": int64(1), "result": "success", "exit_code": int64(0), "messaging.message.id": id},
	}
	for _, run := range runs {
		h := attrMap(run.Attributes)["handler"].(string)
		if d := subset(want[h], run.Attributes); d != "" {
			t.Errorf("function.invoke %s attributes: %s", h, d)
		}
		if run.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("function.invoke %s: parent %s, want app.manual_invoke", h, run.Parent.SpanID())
		}
		if got, want := envs[h]["TRACEPARENT"], traceparentOf(run.SpanContext); got != want {
			t.Errorf("%s TRACEPARENT %q, want its span %q", h, got, want)
		}
	}
}

// TestTracingOffHandsOnTheProducersContext: without a tracer provider
// nothing is recorded or stored, but a handler still gets the producer's
// traceparent and log lines still carry its trace id; a malformed
// traceparent is dropped.
func TestTracingOffHandsOnTheProducersContext(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": flakyApp})
	var seen envLog
	h.handle("shop/orders.charge", func(_ context.Context, req runtime.Request) error {
		if n := seen.add(req); n == 1 {
			return errors.New("card declined")
		}
		return nil
	})
	h.start("c1", backoff(20*time.Millisecond))
	id := h.publish("event", `{"kind":"order"}`, "traceparent", producerParent)
	testutil.WaitFor(t, 15*time.Second, "two attempts and the ack", func() bool {
		return h.calls.Count("shop/orders.charge") == 2 && h.settled()
	})
	bad := h.publish("event", `{"kind":"order"}`, "traceparent", "00-not-a-trace-01")
	testutil.WaitFor(t, 15*time.Second, "the second message", func() bool { return h.calls.Count("shop/orders.charge") == 3 && h.settled() })

	envs := seen.get()
	want := []map[string]string{{"TRACEPARENT": producerParent}, {"TRACEPARENT": producerParent}, nil}
	if diff := cmp.Diff(want, envs); diff != "" {
		t.Errorf("handler trace environments (-want +got):\n%s", diff)
	}
	for _, msg := range []string{id, bad} {
		if _, ok := h.hash(msg)[invocation.TraceField("shop/orders.charge")]; ok {
			t.Errorf("message %s: a lineage was stored with tracing off: %v", msg, h.hash(msg))
		}
	}
	logs := h.logs.String()
	if !strings.Contains(logs, "trace_id="+producerTrace) {
		t.Error("no log line carries the producer's trace id")
	}
	if strings.Contains(logs, "span_id=") {
		t.Error("a log line names a span id although no span is recorded")
	}
}

// TestTracingScheduleOccurrence: an occurrence published with
// schedule.publish is consumed in the same trace: its stream.message is a
// child of the publish span and the handler's function.invoke a child of
// that.
func TestTracingScheduleOccurrence(t *testing.T) {
	h := newHarness(t, map[string]string{"reports": `
image: relay.local/busybox:latest
schedules:
  - name: nightly
    handler: reports.build
    cron: "*/5 * * * *"
`})
	tr := newTracing(t)
	var seen envLog
	h.handle("reports/reports.build", func(_ context.Context, req runtime.Request) error {
		seen.add(req)
		return nil
	})
	h.startTraced(tr.tp)
	specs := h.apps.ScheduleSpecs()
	if len(specs) != 1 {
		t.Fatalf("schedule specs %+v, want one", specs)
	}
	at, err := specs[0].Next(time.Now().Add(-10 * time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	pub, err := redisschedule.NewPublisher(h.rc, h.stream, redisschedule.WithTracerProvider(tr.tp))
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := pub.Publish(t.Context(), specs[0], at); err != nil || !ok {
		t.Fatalf("Publish = %v, %v", ok, err)
	}
	testutil.WaitFor(t, 10*time.Second, "the handler's run and the stream.message span", func() bool {
		return h.calls.Count("reports/reports.build") == 1 && len(tr.named(telemetry.SpanStreamMessage)) == 1
	})
	pubs, msgs, runs := tr.named(telemetry.SpanSchedulePublish), tr.named(telemetry.SpanStreamMessage), tr.named(telemetry.SpanFunctionInvoke)
	if len(pubs) != 1 || len(runs) != 1 {
		t.Fatalf("%d schedule.publish and %d function.invoke spans, want 1 each", len(pubs), len(runs))
	}
	p, m, r := pubs[0], msgs[0], runs[0]
	if m.Parent.SpanID() != p.SpanContext.SpanID() || m.SpanContext.TraceID() != p.SpanContext.TraceID() {
		t.Errorf("stream.message parent %s in trace %s, want schedule.publish %s in %s",
			m.Parent.SpanID(), m.SpanContext.TraceID(), p.SpanContext.SpanID(), p.SpanContext.TraceID())
	}
	if r.Parent.SpanID() != m.SpanContext.SpanID() {
		t.Errorf("function.invoke parent %s, want stream.message %s", r.Parent.SpanID(), m.SpanContext.SpanID())
	}
	if d := subset(map[string]any{"app": "reports", "handler": "reports.build", "attempt": int64(1), "result": "success"}, r.Attributes); d != "" {
		t.Errorf("function.invoke attributes: %s", d)
	}
	if got, want := seen.get()[0]["TRACEPARENT"], traceparentOf(r.SpanContext); got != want {
		t.Errorf("handler TRACEPARENT %q, want %q", got, want)
	}
}
