package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/redisschedule"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// This file holds what the package's tests share: the harness (one Engine
// on a real redis-server, with Go handlers), its timings, the app fixtures
// and the fault injectors that more than one test file uses. Each test
// lives in the file named after the code it tests: settle.go's in
// settle_test.go, and so on.

func TestMain(m *testing.M) { redistest.Main(m) }

// harness is one Engine on a real redis-server with Go handlers.
type harness struct {
	t        *testing.T
	rc       rueidis.Client
	stream   string
	group    string
	src      *redisstream.Source
	dlq      *redisdlq.Store
	state    *redisstate.Store
	calls    *apptest.Calls
	reg      *prometheus.Registry
	logs     *testutil.Buffer
	handlers map[string]runtime.HandlerFunc
	apps     *app.Set
	source   relay.StreamSource // what the engine reads through (src unless wrapped)
	last     string             // id of the last published entry
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
	minPendingIdle  time.Duration
	maxEventBytes   int
	maxConcurrency  int
	settleLinger    time.Duration
	maxWaiting      int
}

// fastConfig shrinks every timing docs/delivery.md fixes so tests take
// seconds; mods change single values.
func fastConfig(mods ...func(*timing)) relay.Config {
	tm := timing{backoff: []time.Duration{200 * time.Millisecond, 400 * time.Millisecond}, shutdownTimeout: 2 * time.Second,
		concurrencyWait: 200 * time.Millisecond, minPendingIdle: 300 * time.Millisecond}
	for _, m := range mods {
		m(&tm)
	}
	return relay.Config{
		MinPendingIdle:    tm.minPendingIdle,
		ReclaimInterval:   50 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond,
		Backoff:           tm.backoff,
		LeaseGrace:        500 * time.Millisecond,
		ConcurrencyWait:   tm.concurrencyWait,
		ShutdownTimeout:   tm.shutdownTimeout,
		WriteTimeout:      tm.writeTimeout,
		MaxEventBytes:     tm.maxEventBytes,
		MaxConcurrency:    tm.maxConcurrency,
		SettleLinger:      tm.settleLinger,
		MaxWaiting:        tm.maxWaiting,
	}
}

// reclaimOnly keeps no message for its next step's time: a message left
// pending comes back only with a reclaim, as after a crash, so a test sees
// the redeliveries that come before a retry is due.
func reclaimOnly(tm *timing) { tm.maxWaiting = -1 }

func settleLinger(d time.Duration) func(*timing) { return func(tm *timing) { tm.settleLinger = d } }

func maxEventBytes(n int) func(*timing) { return func(tm *timing) { tm.maxEventBytes = n } }

func maxConcurrency(n int) func(*timing) { return func(tm *timing) { tm.maxConcurrency = n } }

func writeTimeout(d time.Duration) func(*timing) { return func(tm *timing) { tm.writeTimeout = d } }

func backoff(ds ...time.Duration) func(*timing) { return func(tm *timing) { tm.backoff = ds } }

func shutdownTimeout(d time.Duration) func(*timing) {
	return func(tm *timing) { tm.shutdownTimeout = d }
}

func minPendingIdle(d time.Duration) func(*timing) {
	return func(tm *timing) { tm.minPendingIdle = d }
}

func newHarness(t *testing.T, templates map[string]string) *harness {
	t.Helper()
	rc := redistest.Client(t)
	h := &harness{
		t: t, rc: rc,
		stream: redistest.Name(t, "events"), group: "workers",
		calls: &apptest.Calls{}, reg: prometheus.NewRegistry(), logs: &testutil.Buffer{},
		handlers: map[string]runtime.HandlerFunc{},
		apps:     apptest.Load(t, templates),
	}
	h.src = redisstream.New(rc, h.stream, h.group, "c1", redisstream.WithBlock(50*time.Millisecond))
	h.source = h.src
	h.dlq = redisdlq.NewStore(rc, h.stream)
	h.state = redisstate.New(rc)
	if err := h.src.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return h
}

// handle registers fn as the handler "app/handler"; every run is recorded.
func (h *harness) handle(key string, fn runtime.HandlerFunc) {
	h.handlers[key] = func(ctx context.Context, req runtime.Request) error {
		h.calls.Add(req)
		if fn == nil {
			return nil
		}
		return fn(ctx, req)
	}
}

// blockUntil is a handler that runs until release is closed, or its
// context ends.
func blockUntil(release <-chan struct{}) runtime.HandlerFunc {
	return func(ctx context.Context, _ runtime.Request) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
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
		src = redisstream.New(h.rc, h.stream, h.group, consumer, redisstream.WithBlock(50*time.Millisecond))
	}
	var state relay.StateStore = h.state
	if h.stateStore != nil {
		state = h.stateStore
	}
	var runner relay.Runner = runtime.NewFunc(h.handlers)
	if h.runner != nil {
		runner = h.runner
	}
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: src, State: state, Runner: runner,
		Stream: h.stream, Group: h.group, Consumer: consumer,
	}, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	return h.run(e)
}

// runEngine runs e until stop is called or t ends; stop cancels it, waits
// for Run and fails t with Run's error.
func runEngine(t *testing.T, e *relay.Engine) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// run runs e until the test ends or stop is called, and shows the engine
// log when the test failed.
func (h *harness) run(e *relay.Engine) (stop func()) {
	stop = runEngine(h.t, e)
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

// publishOccurrence publishes through the real publish script.
func (h *harness) publishOccurrence(spec schedule.Spec, at time.Time) string {
	h.t.Helper()
	pub, err := redisschedule.NewPublisher(h.rc, h.stream)
	if err != nil {
		h.t.Fatal(err)
	}
	// Dedup keys are shared by every test on the server.
	h.rc.Do(context.Background(), h.rc.B().Del().Key(keys.ScheduleOccurrence(h.stream, spec.App, spec.Name, at)).Build())
	if ok, err := pub.Publish(context.Background(), spec, at); err != nil || !ok {
		h.t.Fatalf("publish occurrence: %v %v", ok, err)
	}
	entries, err := h.rc.Do(context.Background(), h.rc.B().Xrevrange().Key(h.stream).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil || len(entries) != 1 {
		h.t.Fatalf("read back the occurrence: %v %v", entries, err)
	}
	h.last = entries[0].ID
	return h.last
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

const usersApp = `
image: relay.local/busybox:latest
events:
  - handler: events.created
    pattern:
      event_name: [INSERT]
      table_name: [users]
    timeout: 5s
`

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

// hookedState is a StateStore whose settlements a test can fail or hold:
// hook sees each settlement of a Settle call before the store does, and
// an error it returns is that settlement's result, which then never
// reaches the store. It keeps the store's ClaimVoider.
type hookedState struct {
	relay.StateStore
	hook func(ctx context.Context, s invocation.Settlement) error
}

func (h *hookedState) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	out := make([]invocation.SettleResult, len(ss))
	var pass []invocation.Settlement
	var at []int
	for i, s := range ss {
		if err := h.hook(ctx, s); err != nil {
			out[i].Err = err
			continue
		}
		pass, at = append(pass, s), append(at, i)
	}
	if len(pass) > 0 {
		for k, r := range h.StateStore.Settle(ctx, pass) {
			out[at[k]] = r
		}
	}
	return out
}

func (h *hookedState) Void(ctx context.Context, l invocation.Lease) error {
	return h.StateStore.(relay.ClaimVoider).Void(ctx, l)
}

// writes reports whether s has a transition of kind k.
func writes(s invocation.Settlement, k invocation.TransitionKind) bool {
	for _, t := range s.Transitions {
		if t.Kind == k {
			return true
		}
	}
	return false
}

// writesEntry reports whether s writes a dead-letter entry.
func writesEntry(s invocation.Settlement) bool {
	return writes(s, invocation.Exhaust) || writes(s, invocation.DeadLetter)
}

// failDeadLetters fails the settlements of h's store that write a
// dead-letter entry for which fail returns true, as a DLQ that cannot be
// written to would, and returns how many it failed.
func failDeadLetters(h *harness, fail func(e dlq.Entry) bool) (failed *atomic.Int32) {
	failed = new(atomic.Int32)
	h.stateStore = &hookedState{StateStore: h.state, hook: func(_ context.Context, s invocation.Settlement) error {
		for _, t := range s.Transitions {
			if t.Entry != nil && fail(*t.Entry) {
				failed.Add(1)
				return errors.New("injected: DLQ unavailable")
			}
		}
		return nil
	}}
	return failed
}

type runnerFunc func(context.Context, runtime.Request) (runtime.Result, error)

func (f runnerFunc) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	return f(ctx, req)
}
