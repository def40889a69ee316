package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// calls records handler runs, per "app/handler".
type calls struct {
	mu   sync.Mutex
	runs map[string][]runtime.Request
}

func (c *calls) add(req runtime.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.runs == nil {
		c.runs = map[string][]runtime.Request{}
	}
	k := req.App + "/" + req.Handler
	c.runs[k] = append(c.runs[k], req)
}

func (c *calls) count(k string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs[k])
}

func (c *calls) get(k string) []runtime.Request {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]runtime.Request(nil), c.runs[k]...)
}

// harness is one Engine on a real redis-server with Go handlers.
type harness struct {
	t        *testing.T
	rc       rueidis.Client
	stream   string
	group    string
	src      *stream.Source
	dlq      *dlq.Store
	state    *invocation.Store
	calls    *calls
	reg      *prometheus.Registry
	logs     *testutil.Buffer
	handlers map[string]runtime.HandlerFunc
	apps     *app.Set
	source   relay.StreamSource // what the engine reads through (src unless wrapped)
	dlqw     relay.DLQWriter
	last     string // id of the last published entry
	// stateStore and runner replace h.state and the Func runner when set.
	stateStore relay.StateStore
	runner     relay.Runner
}

// timing holds the engine timings a test runs with.
type timing struct {
	backoff         []time.Duration
	shutdownTimeout time.Duration
	concurrencyWait time.Duration
	writeTimeout    time.Duration
}

// fastConfig shrinks every timing docs/delivery.md fixes so tests take
// seconds; mods change single values.
func fastConfig(mods ...func(*timing)) relay.Config {
	tm := timing{backoff: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}, shutdownTimeout: 2 * time.Second,
		concurrencyWait: 200 * time.Millisecond}
	for _, m := range mods {
		m(&tm)
	}
	return relay.Config{
		MinPendingIdle:    300 * time.Millisecond,
		ReclaimInterval:   50 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond,
		Backoff:           tm.backoff,
		LeaseGrace:        500 * time.Millisecond,
		ConcurrencyWait:   tm.concurrencyWait,
		ShutdownTimeout:   tm.shutdownTimeout,
		WriteTimeout:      tm.writeTimeout,
	}
}

func writeTimeout(d time.Duration) func(*timing) { return func(tm *timing) { tm.writeTimeout = d } }

func backoff(ds ...time.Duration) func(*timing) { return func(tm *timing) { tm.backoff = ds } }

func shutdownTimeout(d time.Duration) func(*timing) {
	return func(tm *timing) { tm.shutdownTimeout = d }
}

// writeApps writes templates into a temp apps root and loads it.
func writeApps(t *testing.T, templates map[string]string) *app.Set {
	t.Helper()
	apps, err := template.LoadDir(testutil.AppsRoot(t, templates))
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

// loadOne loads one app from its template source.
func loadOne(t *testing.T, name, src string) *app.App {
	t.Helper()
	a := writeApps(t, map[string]string{name: src}).Get(name)
	if a == nil {
		t.Fatalf("app %q not loaded", name)
	}
	return a
}

func newHarness(t *testing.T, templates map[string]string) *harness {
	t.Helper()
	rc := redistest.Client(t)
	h := &harness{
		t: t, rc: rc,
		stream: redistest.Name(t, "events"), group: "workers",
		calls: &calls{}, reg: prometheus.NewRegistry(), logs: &testutil.Buffer{},
		handlers: map[string]runtime.HandlerFunc{},
		apps:     writeApps(t, templates),
	}
	h.src = stream.New(rc, h.stream, h.group, "c1", stream.WithBlock(50*time.Millisecond))
	h.source = h.src
	h.dlq = dlq.NewStore(rc, h.stream)
	h.dlqw = dlq.NewWriter(rc, h.stream)
	h.state = invocation.New(rc)
	if err := h.src.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return h
}

// handle registers fn as the handler "app/handler"; every run is recorded.
func (h *harness) handle(key string, fn runtime.HandlerFunc) {
	h.handlers[key] = func(ctx context.Context, req runtime.Request) error {
		h.calls.add(req)
		if fn == nil {
			return nil
		}
		return fn(ctx, req)
	}
}

// start runs an engine until the test ends (or stop is called).
func (h *harness) start(consumer string, mods ...func(*timing)) (stop func()) {
	h.t.Helper()
	cfg := fastConfig(mods...)
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	reg := h.reg // the counters tests read are c1's; other engines get their own
	if consumer != "c1" {
		reg = prometheus.NewRegistry()
	}
	cfg.Metrics = reg
	src := h.source
	if consumer != "c1" {
		src = stream.New(h.rc, h.stream, h.group, consumer, stream.WithBlock(50*time.Millisecond))
	}
	var state relay.StateStore = h.state
	if h.stateStore != nil {
		state = h.stateStore
	}
	var runner relay.Runner = runtime.NewFunc(h.handlers)
	if h.runner != nil {
		runner = h.runner
	}
	// Pair XACK and retention in one round trip as a Worker does, unless
	// the test replaced the source or the store.
	var ackRetainer relay.AckRetainer
	if _, plain := src.(*stream.Source); plain && h.stateStore == nil {
		ackRetainer = h.state
	}
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: src, State: state, Runner: runner, DLQ: h.dlqw, AckRetainer: ackRetainer,
		Stream: h.stream, Group: h.group, Consumer: consumer,
	}, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.run(e)
}

// run runs e until the test ends or stop is called, and shows the engine
// log when the test failed.
func (h *harness) run(e *relay.Engine) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				h.t.Errorf("Run: %v", err)
			}
		})
	}
	h.t.Cleanup(stop)
	h.t.Cleanup(func() {
		if h.t.Failed() {
			h.t.Logf("engine log:\n%s", h.logs.String())
		}
	})
	return stop
}

func (h *harness) publish(fields ...string) string {
	h.t.Helper()
	m := map[string]string{}
	for i := 0; i+1 < len(fields); i += 2 {
		m[fields[i]] = fields[i+1]
	}
	id, err := h.src.Publish(context.Background(), m)
	if err != nil {
		h.t.Fatal(err)
	}
	h.last = id
	return id
}

// settled reports whether every published entry was delivered and none is
// pending any more.
func (h *harness) settled() bool {
	h.t.Helper()
	// One XINFO GROUPS reply holds both facts, read atomically.
	res, err := h.rc.Do(context.Background(), h.rc.B().XinfoGroups().Key(h.stream).Build()).ToArray()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, g := range res {
		m, err := g.AsMap()
		if err != nil {
			h.t.Fatal(err)
		}
		name, pend, lastID := m["name"], m["pending"], m["last-delivered-id"]
		if n, _ := name.ToString(); n != h.group {
			continue
		}
		pending, err := pend.AsInt64()
		if err != nil {
			h.t.Fatal(err)
		}
		last, _ := lastID.ToString()
		return pending == 0 && stream.CompareID(last, h.last) >= 0
	}
	return false
}

func (h *harness) pending() int64 {
	n, _, err := h.src.Pending(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *harness) dlqEntries() []dlq.Entry {
	es, err := h.dlq.List(context.Background(), dlq.Filter{})
	if err != nil {
		h.t.Fatal(err)
	}
	return es
}

func (h *harness) counter(name string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}

func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testutil.WaitFor(t, timeout, what, cond)
}

func (h *harness) hash(id string) map[string]string {
	m, err := h.state.Get(context.Background(), invocation.Key{Stream: h.stream, Group: h.group, MessageID: id})
	if err != nil {
		h.t.Fatal(err)
	}
	return m
}

func (h *harness) ttl(id string) time.Duration {
	ms, err := h.rc.Do(context.Background(), h.rc.B().Pttl().Key(keys.Invocation(h.stream, h.group, id)).Build()).AsInt64()
	if err != nil {
		h.t.Fatal(err)
	}
	return time.Duration(ms) * time.Millisecond
}

const usersApp = `
image: relay.local/busybox:latest
events:
  - handler: events.created
    pattern:
      event_name: [INSERT]
      table_name: [users]
    timeout: 5s
`

func TestMatchedEventRunsAndIsAcked(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	h.start("c1")
	event := `{"event_name":"INSERT","table_name":"users","id":7}`
	id := h.publish("event", event)
	waitFor(t, 5*time.Second, "ack", func() bool { return h.calls.count("users/events.created") == 1 && h.settled() })

	req := h.calls.get("users/events.created")[0]
	if string(req.Event) != event || req.MessageID != id || req.Attempt != 1 || req.Timeout != 5*time.Second {
		t.Errorf("request = %+v", req)
	}
	waitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" })
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok", got)
	}
	if ttl := h.ttl(id); ttl <= 6*24*time.Hour || ttl > relay.DefaultRetention {
		t.Errorf("retention TTL = %s, want about %s", ttl, relay.DefaultRetention)
	}
	if n := h.counter("relay_events_matched_total"); n != 1 {
		t.Errorf("matched = %v", n)
	}
}

func TestUnmatchedIsAckedWithoutRun(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	h.start("c1")
	id := h.publish("event", `{"event_name":"DELETE","table_name":"users"}`)
	waitFor(t, 5*time.Second, "unmatched counted", func() bool { return h.counter("relay_events_unmatched_total") == 1 })
	waitFor(t, 2*time.Second, "ack", func() bool { return h.settled() })
	if n := h.calls.count("users/events.created"); n != 0 {
		t.Errorf("handler ran %d times for an unmatched event", n)
	}
	if len(h.hash(id)) != 0 {
		t.Errorf("unmatched event left invocation state %v", h.hash(id))
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("unmatched event was dead-lettered")
	}
}

func TestMalformedMessagesAreDeadLetteredOnceAndAcked(t *testing.T) {
	cases := map[string][]string{
		"no event field":   {"payload", `{"a":1}`},
		"json string":      {"event", `"INSERT"`},
		"json array":       {"event", `[{"event_name":"INSERT"}]`},
		"json number":      {"event", `42`},
		"not json":         {"event", `{event_name: INSERT}`},
		"trailing garbage": {"event", `{"event_name":"INSERT"} x`},
		"empty":            {"event", ``},
	}
	for name, fields := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, map[string]string{"users": usersApp})
			h.handle("users/events.created", nil)
			h.start("c1")
			id := h.publish(fields...)
			waitFor(t, 5*time.Second, "dead letter and ack", func() bool { return len(h.dlqEntries()) == 1 && h.settled() })
			e := h.dlqEntries()[0]
			if e.App != "-" || e.Handler != "-" || e.HandlerAttempts != 0 || e.OriginalID != id ||
				e.OriginalStream != h.stream || e.Group != h.group || e.Consumer != "c1" || e.Reason == "" {
				t.Errorf("entry = %+v", e)
			}
			if fields[0] == "event" && e.Event != fields[1] {
				t.Errorf("entry event = %q, want the original %q", e.Event, fields[1])
			}
			if h.calls.count("users/events.created") != 0 {
				t.Error("a handler ran for a malformed message")
			}
			if h.counter("relay_events_malformed_total") != 1 {
				t.Error("malformed not counted")
			}
			// Dead-lettered on first encounter: the entry was written by
			// the first delivery, not after a reclaim (MinPendingIdle is
			// 300ms).
			if e.Deliveries != 1 {
				t.Errorf("entry deliveries = %d, want 1 (first encounter)", e.Deliveries)
			}
			// Acked with state: the malformed marker is retained, not
			// leaked.
			waitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" && h.ttl(id) > 0 })
		})
	}
	// Acked only after the DLQ entry is persisted: a failed write leaves
	// the message pending and a redelivery writes it.
	t.Run("DLQ write fails", func(t *testing.T) {
		t.Parallel()
		h := newHarness(t, map[string]string{"users": usersApp})
		h.handle("users/events.created", nil)
		f := &failingDLQ{DLQWriter: h.dlqw, n: 2}
		h.dlqw = f
		h.start("c1")
		id := h.publish("event", `not json`)
		// One write per delivery: the second failure needs a redelivery,
		// which an ack after the first failure would have prevented.
		waitFor(t, 5*time.Second, "two failed writes", func() bool { f.mu.Lock(); defer f.mu.Unlock(); return f.n == 0 })
		waitFor(t, 5*time.Second, "written, then acked", func() bool { return len(h.dlqEntries()) == 1 && h.settled() })
		if e := h.dlqEntries()[0]; e.OriginalID != id || e.App != "-" || e.Deliveries < 3 {
			t.Errorf("entry = %+v, want the message's, written on its 3rd delivery", e)
		}
		if h.calls.count("users/events.created") != 0 {
			t.Error("a handler ran for a malformed message")
		}
	})
}

const billingApp = `
image: relay.local/busybox:latest
events:
  - handler: charges.fail
    pattern:
      kind: [charge]
    retries: 0
  - handler: charges.audit
    pattern:
      kind: [charge]
`

func TestFailingRuleWithoutRetriesIsDeadLetteredOnce(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("card declined") })
	h.handle("billing/charges.audit", nil)
	h.start("c1")
	event := `{"kind":"charge","amount":12}`
	id := h.publish("event", event)
	waitFor(t, 5*time.Second, "ack", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })

	// The failing handler must not stop the other matched handler.
	if n := h.calls.count("billing/charges.audit"); n != 1 {
		t.Errorf("audit ran %d times, want 1", n)
	}
	if n := h.calls.count("billing/charges.fail"); n != 1 {
		t.Errorf("fail ran %d times, want 1 (retries: 0)", n)
	}
	e := h.dlqEntries()[0]
	if e.App != "billing" || e.Handler != "charges.fail" || e.HandlerAttempts != 1 || e.OriginalID != id ||
		e.Event != event || !strings.Contains(e.Reason, "card declined") || e.Deliveries < 1 {
		t.Errorf("entry = %+v", e)
	}
	waitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" })
	st := h.hash(id)
	if st["billing/charges.audit"] != "ok" || !strings.HasPrefix(st["billing/charges.fail"], "exhausted:1:") || !strings.HasSuffix(st["billing/charges.fail"], ":dlq") {
		t.Errorf("state = %v", st)
	}
	// Nothing more happens afterwards.
	time.Sleep(500 * time.Millisecond)
	if len(h.dlqEntries()) != 1 || h.calls.count("billing/charges.fail") != 1 {
		t.Errorf("after ack: %d DLQ entries, %d runs", len(h.dlqEntries()), h.calls.count("billing/charges.fail"))
	}
}

func TestRetriesThenSucceeds(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	var mu sync.Mutex
	var times []time.Time
	h.handle("users/events.created", func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if req.Attempt < 3 {
			return fmt.Errorf("attempt %d fails", req.Attempt)
		}
		return nil
	})
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 10*time.Second, "ack after retries", func() bool { return h.settled() && h.calls.count("users/events.created") == 3 })
	runs := h.calls.get("users/events.created")
	for i, r := range runs {
		if r.Attempt != i+1 {
			t.Errorf("run %d had attempt %d", i, r.Attempt)
		}
	}
	// Each retry waited at least its backoff (200ms, then 400ms).
	mu.Lock()
	defer mu.Unlock()
	if d := times[1].Sub(times[0]); d < 200*time.Millisecond {
		t.Errorf("second attempt after %s, before the 200ms backoff", d)
	}
	if d := times[2].Sub(times[1]); d < 400*time.Millisecond {
		t.Errorf("third attempt after %s, before the 400ms backoff", d)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("a retried success was dead-lettered")
	}
	if got := h.counter("relay_retries_total"); got != 2 {
		t.Errorf("retries_total = %v, want 2", got)
	}
	if h.hash(id)["users/events.created"] != "ok" {
		t.Errorf("state = %v", h.hash(id))
	}
}

func TestExhaustsAfterDefaultAttemptsAndDeadLettersWithCount(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: relay.local/busybox:latest
events:
  - handler: events.created
    pattern: {event_name: [INSERT]}
    retries: 2
`})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("boom") })
	h.start("c1", backoff(50*time.Millisecond))
	h.publish("event", `{"event_name":"INSERT"}`)
	waitFor(t, 10*time.Second, "dead letter", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })
	if n := h.calls.count("users/events.created"); n != 3 {
		t.Errorf("ran %d times, want 3 (retries: 2)", n)
	}
	if e := h.dlqEntries()[0]; e.HandlerAttempts != 3 {
		t.Errorf("handler_attempts = %d, want 3", e.HandlerAttempts)
	}
}

func TestRedeliveryBeforeNextAttemptAtDoesNotRun(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("fail") })
	// A long backoff with a short reclaim threshold: the message is
	// redelivered many times before its retry is due.
	h.start("c1", backoff(time.Hour))
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 5*time.Second, "first attempt", func() bool { return h.calls.count("users/events.created") == 1 })
	waitFor(t, 5*time.Second, "retry recorded", func() bool {
		return strings.HasPrefix(h.hash(id)["users/events.created"], "next_attempt_at:")
	})
	// Let several reclaims redeliver it (MinPendingIdle is 300ms).
	before := deliveries(t, h, id)
	waitFor(t, 5*time.Second, "redeliveries", func() bool { return deliveries(t, h, id) >= before+2 })
	if n := h.calls.count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times; a redelivery before next_attempt_at must skip it", n)
	}
	if h.pending() != 1 {
		t.Error("message with a pending retry was acknowledged")
	}
}

func deliveries(t *testing.T, h *harness, id string) int64 {
	t.Helper()
	res, err := h.rc.Do(context.Background(), h.rc.B().Xpending().Key(h.stream).Group(h.group).Start(id).End(id).Count(1).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	if len(res) == 0 {
		return 0
	}
	row, _ := res[0].ToArray()
	n, _ := row[3].AsInt64()
	return n
}

func TestUnavailableAppKeepsMessagePending(t *testing.T) {
	h := newHarness(t, map[string]string{
		// Valid pattern, invalid elsewhere: the app is unavailable but its
		// rule still matches, so the message must stay pending.
		"broken": `
image: relay.local/busybox:latest
concurrency: 0
events:
  - handler: events.created
    pattern: {event_name: [INSERT]}
`,
		"users": usersApp,
	})
	h.handle("broken/events.created", nil)
	h.handle("users/events.created", nil)
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 5*time.Second, "available app ran", func() bool { return h.calls.count("users/events.created") == 1 })
	waitFor(t, 5*time.Second, "redelivery", func() bool { return deliveries(t, h, id) >= 2 })
	if h.pending() != 1 {
		t.Error("message matched by an unavailable app was acknowledged")
	}
	if h.calls.count("broken/events.created") != 0 || len(h.dlqEntries()) != 0 {
		t.Error("unavailable app ran or was dead-lettered")
	}
	// The unavailable app's invocation is recorded with no attempt used, so
	// a redelivery that no longer matches its rule still drives it.
	if st := h.hash(id); st["users/events.created"] != "ok" || attemptsUsed(t, st["broken/events.created"]) != 0 ||
		!strings.HasPrefix(st["broken/events.created"], "next_attempt_at:") {
		t.Errorf("state = %v", st)
	}
	if h.calls.count("users/events.created") != 1 {
		t.Error("the succeeded invocation ran again on redelivery")
	}
}

func TestMissingPayloadIsCountedNotRunNotDeadLettered(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	ctx := context.Background()
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	// Another consumer read it and died; then the entry was deleted.
	other := stream.New(h.rc, h.stream, h.group, "dead", stream.WithBlock(50*time.Millisecond))
	if msgs, err := other.Read(ctx, 10); err != nil || len(msgs) != 1 {
		t.Fatalf("read = %v, %v", msgs, err)
	}
	// The dead consumer had claimed an invocation: its hash is pending,
	// without a TTL.
	if _, err := h.state.Claim(ctx, invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}, "users/events.created", time.Minute, 5); err != nil {
		t.Fatal(err)
	}
	if ttl := h.ttl(id); ttl >= 0 {
		t.Fatalf("pending hash has TTL %s", ttl)
	}
	if err := h.rc.Do(ctx, h.rc.B().Xdel().Key(h.stream).Id(id).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.start("c1")
	waitFor(t, 5*time.Second, "missing payload counted", func() bool { return h.counter("relay_missing_payload_total") == 1 })
	waitFor(t, 2*time.Second, "PEL cleared", func() bool { return h.settled() })
	if h.calls.count("users/events.created") != 0 || len(h.dlqEntries()) != 0 {
		t.Error("missing payload ran a handler or wrote a DLQ entry")
	}
	// Leaving the PEL switches the hash to retention; it must not leak.
	waitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" && h.ttl(id) > 0 })
	time.Sleep(300 * time.Millisecond)
	if got := h.counter("relay_missing_payload_total"); got != 1 {
		t.Errorf("missing_payload_total = %v, want 1", got)
	}
}

// failingAck fails the first Ack of each id, as if the worker crashed
// after the DLQ write and before the XACK.
type failingAck struct {
	relay.StreamSource
	mu     sync.Mutex
	failed map[string]bool
}

func (f *failingAck) Ack(ctx context.Context, ids ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if !f.failed[id] {
			f.failed[id] = true
			return errors.New("injected: crash before XACK")
		}
	}
	return f.StreamSource.Ack(ctx, ids...)
}

func TestDLQWriteIsIdempotentAcrossCrashBeforeAck(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("declined") })
	h.handle("billing/charges.audit", nil)
	h.source = &failingAck{StreamSource: h.src, failed: map[string]bool{}}
	h.start("c1")
	h.publish("event", `{"kind":"charge"}`)
	waitFor(t, 10*time.Second, "ack on redelivery", func() bool { return h.settled() })
	if n := len(h.dlqEntries()); n != 1 {
		t.Errorf("%d DLQ entries after a crash between DLQ write and ack, want 1", n)
	}
	if h.calls.count("billing/charges.fail") != 1 || h.calls.count("billing/charges.audit") != 1 {
		t.Errorf("handlers ran again on redelivery: fail %d, audit %d", h.calls.count("billing/charges.fail"), h.calls.count("billing/charges.audit"))
	}
}

// failingDLQ fails the first n writes.
type failingDLQ struct {
	relay.DLQWriter
	mu sync.Mutex
	n  int
}

func (f *failingDLQ) Write(ctx context.Context, e dlq.Entry) (string, error) {
	f.mu.Lock()
	if f.n > 0 {
		f.n--
		f.mu.Unlock()
		return "", errors.New("injected: DLQ unavailable")
	}
	f.mu.Unlock()
	return f.DLQWriter.Write(ctx, e)
}

func TestDLQWriteFailureKeepsMessagePendingUntilWritten(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("declined") })
	h.handle("billing/charges.audit", nil)
	h.dlqw = &failingDLQ{DLQWriter: h.dlqw, n: 2}
	h.start("c1")
	id := h.publish("event", `{"kind":"charge"}`)
	waitFor(t, 5*time.Second, "exhausted", func() bool { return strings.HasPrefix(h.hash(id)["billing/charges.fail"], "exhausted:") })
	if h.pending() != 1 {
		t.Fatal("message acknowledged although its DLQ entry was not written")
	}
	waitFor(t, 10*time.Second, "written on redelivery, then acked", func() bool { return h.settled() })
	if n := len(h.dlqEntries()); n != 1 {
		t.Errorf("%d DLQ entries, want 1", n)
	}
	if n := h.calls.count("billing/charges.fail"); n != 1 {
		t.Errorf("exhausted handler ran %d times, want 1", n)
	}
}

func TestTwoAppsBothExhaustWriteOneEntryEach(t *testing.T) {
	h := newHarness(t, map[string]string{
		"a": `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}, retries: 0}
  - {handler: h.two, pattern: {kind: [x]}, retries: 0}
`,
		"b": `
image: x
events:
  - {handler: h.one, pattern: {kind: [{prefix: "x"}]}, retries: 0}
`,
	})
	fail := func(context.Context, runtime.Request) error { return errors.New("no") }
	h.handle("a/h.one", fail)
	h.handle("a/h.two", fail)
	h.handle("b/h.one", fail)
	h.start("c1")
	h.publish("event", `{"kind":"x"}`)
	waitFor(t, 5*time.Second, "ack", func() bool { return h.settled() })
	got := map[string]int{}
	for _, e := range h.dlqEntries() {
		got[e.App+"/"+e.Handler]++
	}
	want := map[string]int{"a/h.one": 1, "a/h.two": 1, "b/h.one": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("DLQ entries by invocation = %v, want %v", got, want)
	}
}

func TestDispatchOrderIsAppNameThenDeclaration(t *testing.T) {
	h := newHarness(t, map[string]string{
		"zeta":  "image: x\nevents:\n  - {handler: m.z1, pattern: {k: [v]}}\n",
		"alpha": "image: x\nevents:\n  - {handler: m.a2, pattern: {k: [v]}}\n  - {handler: m.a1, pattern: {k: [{exists: true}]}}\n",
	})
	var mu sync.Mutex
	var order []string
	rec := func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		order = append(order, req.App+"/"+req.Handler)
		mu.Unlock()
		return nil
	}
	for _, k := range []string{"zeta/m.z1", "alpha/m.a2", "alpha/m.a1"} {
		h.handle(k, rec)
	}
	h.start("c1")
	h.publish("event", `{"k":"v"}`)
	waitFor(t, 5*time.Second, "ack", func() bool { return h.settled() })
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ","); got != "alpha/m.a2,alpha/m.a1,zeta/m.z1" {
		t.Errorf("order = %s", got)
	}
}

func TestPerMessageInvocationsRunOneAtATimeAcrossMessagesConcurrently(t *testing.T) {
	h := newHarness(t, map[string]string{
		"a": "image: x\nconcurrency: 4\nevents:\n  - {handler: m.one, pattern: {k: [v]}}\n  - {handler: m.two, pattern: {k: [v]}}\n",
	})
	var mu sync.Mutex
	running := map[string]int{} // per message
	maxPerMsg, cur, maxAll := 0, 0, 0
	release := make(chan struct{})
	fn := func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		running[req.MessageID]++
		cur++
		maxPerMsg = max(maxPerMsg, running[req.MessageID])
		maxAll = max(maxAll, cur)
		mu.Unlock()
		<-release
		mu.Lock()
		running[req.MessageID]--
		cur--
		mu.Unlock()
		return nil
	}
	h.handle("a/m.one", fn)
	h.handle("a/m.two", fn)
	h.start("c1")
	for range 3 {
		h.publish("event", `{"k":"v"}`)
	}
	waitFor(t, 5*time.Second, "three messages running", func() bool { mu.Lock(); defer mu.Unlock(); return cur == 3 })
	close(release)
	waitFor(t, 5*time.Second, "ack", func() bool { return h.settled() })
	if maxPerMsg != 1 {
		t.Errorf("a message ran %d invocations at once, want 1", maxPerMsg)
	}
	if maxAll != 3 {
		t.Errorf("max concurrent = %d, want 3 (one per message)", maxAll)
	}
}

func TestConcurrencyBoundsAndBlockedSlotChargesNoAttempt(t *testing.T) {
	h := newHarness(t, map[string]string{
		"a": "image: x\nconcurrency: 1\nevents:\n  - {handler: m.slow, pattern: {k: [v]}}\n",
	})
	var mu sync.Mutex
	cur, maxCur := 0, 0
	release := make(chan struct{})
	h.handle("a/m.slow", func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		cur++
		maxCur = max(maxCur, cur)
		mu.Unlock()
		<-release
		mu.Lock()
		cur--
		mu.Unlock()
		return nil
	})
	h.start("c1")
	// A failed wait must not leave the handler blocked: the engine's stop
	// (an earlier cleanup, so run later) waits for it.
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	first := h.publish("event", `{"k":"v"}`)
	second := h.publish("event", `{"k":"v"}`)
	// The second waits for the app's only slot, gives up after the
	// concurrency wait and stays pending with no attempt charged.
	waitFor(t, 5*time.Second, "a concurrency wait", func() bool { return h.counter("relay_concurrency_waits_total") >= 1 })
	waitFor(t, 5*time.Second, "blocked invocation released", func() bool {
		return strings.Contains(h.logs.String(), "no concurrency slot within the wait")
	})
	// Released means left pending, not acked: the blocked message comes
	// back through a reclaim while the slot is still taken.
	waitFor(t, 5*time.Second, "blocked message redelivered", func() bool {
		return deliveries(t, h, first) >= 2 || deliveries(t, h, second) >= 2
	})
	if n := h.pending(); n != 2 {
		t.Errorf("pending = %d while one message runs and one is blocked, want 2", n)
	}
	for _, id := range []string{first, second} {
		if v := h.hash(id)["a/m.slow"]; attemptsUsed(t, v) > 0 {
			t.Errorf("blocked message %s charged an attempt: %q", id, v)
		}
	}
	unblock()
	waitFor(t, 10*time.Second, "both acked", func() bool { return h.settled() })
	if maxCur != 1 {
		t.Errorf("app with concurrency 1 ran %d at once", maxCur)
	}
	// The blocked message was replayed and ran once, as attempt 1.
	runs := map[string]int{}
	for _, r := range h.calls.get("a/m.slow") {
		runs[r.MessageID]++
		if r.Attempt != 1 {
			t.Errorf("message %s ran as attempt %d; a blocked invocation must not be charged", r.MessageID, r.Attempt)
		}
	}
	if len(runs) != 2 || runs[first] != 1 || runs[second] != 1 {
		t.Errorf("runs per message = %v, want one each for %s and %s", runs, first, second)
	}
}

func TestGracefulShutdownLeavesUnfinishedPendingWithoutCharge(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	started := make(chan struct{})
	h.handle("users/events.created", func(ctx context.Context, req runtime.Request) error {
		close(started)
		<-ctx.Done() // never finishes on its own
		return ctx.Err()
	})
	stop := h.start("c1", shutdownTimeout(100*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	<-started
	stop()
	if h.pending() != 1 {
		t.Fatal("unfinished message was acknowledged at shutdown")
	}
	// Released: due at once with no attempt used, still recorded as
	// unfinished for a redelivery that no longer matches.
	if v := h.hash(id)["users/events.created"]; !strings.HasPrefix(v, "next_attempt_at:") || attemptsUsed(t, v) != 0 {
		t.Errorf("abandoned attempt left state %q, want it released", v)
	}
}

// attemptsUsed returns how many attempts an invocation state value has
// charged: a running attempt is not charged yet, a released one leaves
// next_attempt_at with the attempts used before it.
func attemptsUsed(t *testing.T, v string) int {
	t.Helper()
	parts := strings.Split(v, ":")
	var s string
	switch {
	case v == "":
		return 0
	case parts[0] == "running" && len(parts) == 4:
		n, err := strconv.Atoi(parts[2])
		if err != nil {
			t.Fatalf("state %q: %v", v, err)
		}
		return n - 1
	case parts[0] == "next_attempt_at" && len(parts) == 4:
		s = parts[2]
	case parts[0] == "exhausted" && len(parts) >= 3:
		s = parts[1]
	default:
		t.Fatalf("state %q: not an unfinished invocation", v)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("state %q: %v", v, err)
	}
	return n
}

func TestNewValidates(t *testing.T) {
	apps := writeApps(t, map[string]string{"users": usersApp})
	_, err := relay.NewEngine(apps, relay.Components{}, relay.Config{MaxConcurrency: -1, MinPendingIdle: -1})
	if err == nil {
		t.Fatal("NewEngine accepted missing components")
	}
	for _, want := range []string{"Components.Source is required", "Components.Stream is required", "Config.MaxConcurrency: must be >= 0", "Config.MinPendingIdle"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
}

func TestUnreadableTemplateHoldsEveryMessage(t *testing.T) {
	h := newHarness(t, map[string]string{
		"orders": "image: x\nevents:\n  - {handler: o.created, pattern: {t: [order]}}\n  - {handler: o.other, pattern: {t: [other]\n",
		"users":  usersApp,
	})
	if got := h.apps.Incomplete(); len(got) != 1 || got[0] != "orders" {
		t.Fatalf("Incomplete = %v", got)
	}
	h.handle("users/events.created", nil)
	h.start("c1")
	unmatched := h.publish("event", `{"t":"order"}`)
	matched := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 5*time.Second, "the available app ran", func() bool { return h.calls.count("users/events.created") == 1 })
	waitFor(t, 5*time.Second, "redeliveries", func() bool { return deliveries(t, h, unmatched) >= 2 && deliveries(t, h, matched) >= 2 })
	if h.pending() != 2 {
		t.Errorf("pending = %d; with an unreadable template nothing may be acknowledged", h.pending())
	}
	if h.calls.count("users/events.created") != 1 {
		t.Error("a succeeded invocation ran again while its message was held")
	}
	if !strings.Contains(h.logs.String(), "apps have rules that could not be read") {
		t.Error("no startup error names the incomplete app")
	}
}

func TestRuleWithBadHandlerStillMatchesAndHolds(t *testing.T) {
	h := newHarness(t, map[string]string{"orders": "image: x\nevents:\n  - {handler: nodot, pattern: {t: [order]}}\n"})
	if len(h.apps.Incomplete()) != 0 || h.apps.Get("orders").Available() {
		t.Fatal("a readable pattern with a bad handler should be complete but unavailable")
	}
	h.start("c1")
	id := h.publish("event", `{"t":"order"}`)
	waitFor(t, 5*time.Second, "redelivery", func() bool { return deliveries(t, h, id) >= 2 })
	if h.pending() != 1 || h.counter("relay_events_unmatched_total") != 0 {
		t.Error("an event matching an unavailable app's rule was treated as unmatched")
	}
}

func TestPendingGauges(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("keep it pending") })
	h.start("c1", backoff(time.Hour))
	h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 5*time.Second, "pending gauge", func() bool { return h.gauge("relay_pending_entries") == 2 })
	if age := h.gauge("relay_pending_oldest_age_seconds"); age < 0 || age > 60 {
		t.Errorf("oldest pending age = %vs", age)
	}
}

func (h *harness) gauge(name string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		h.t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}

// A handler that runs far longer than MinPendingIdle is kept by its
// worker's heartbeat: the entry stays with its owner, its delivery count
// does not rise, and no other worker runs it again. (The state fence alone
// would stop a second run; the heartbeat is what stops the reclaim.)
func TestHeartbeatKeepsLiveWorkFromReclaim(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 10s}
`})
	started, release := make(chan struct{}), make(chan struct{})
	h.handle("users/events.created", func(ctx context.Context, req runtime.Request) error {
		close(started)
		<-release
		return nil
	})
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT"}`)
	<-started
	h.start("c2") // a second worker reclaiming every 50ms
	// Asserting that something does not happen needs a period: six times
	// MinPendingIdle (300ms).
	time.Sleep(1800 * time.Millisecond)
	if d := deliveries(t, h, id); d != 1 {
		t.Errorf("live entry was reclaimed: %d deliveries, want 1", d)
	}
	close(release)
	waitFor(t, 15*time.Second, "ack", func() bool { return h.settled() })
	if n := h.calls.count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times", n)
	}
}

// toggleSource fails every Read while failing is set.
type toggleSource struct {
	relay.StreamSource
	failing atomic.Bool
}

func (s *toggleSource) Read(ctx context.Context, n int) ([]stream.Message, error) {
	if s.failing.Load() {
		return nil, errors.New("read refused by the test")
	}
	return s.StreamSource.Read(ctx, n)
}

// Ping is the Engine's part of /readyz: consuming only while Run reads.
func TestPingReportsConsuming(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	src := &toggleSource{StreamSource: h.src}
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: src, State: h.state, Runner: runtime.NewFunc(nil), DLQ: h.dlqw,
		Stream: h.stream, Group: h.group, Consumer: "c1",
	}, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Ping(t.Context()); !errors.Is(err, relay.ErrNotConsuming) {
		t.Errorf("Ping before Run = %v, want ErrNotConsuming", err)
	}
	stop := h.run(e)
	waitFor(t, 5*time.Second, "consuming", func() bool { return e.Ping(t.Context()) == nil })
	src.failing.Store(true)
	waitFor(t, 5*time.Second, "not consuming while reads fail", func() bool { return errors.Is(e.Ping(t.Context()), relay.ErrNotConsuming) })
	src.failing.Store(false)
	waitFor(t, 10*time.Second, "consuming again", func() bool { return e.Ping(t.Context()) == nil })
	stop()
	if err := e.Ping(t.Context()); !errors.Is(err, relay.ErrNotConsuming) {
		t.Errorf("Ping after Run = %v, want ErrNotConsuming", err)
	}
}
