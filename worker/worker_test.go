package worker_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// sweepingRunner counts Sweep calls of a Runner that is a Sweeper.
type sweepingRunner struct {
	relay.Runner
	sweeps atomic.Int32
}

func (s *sweepingRunner) Sweep(context.Context) error { s.sweeps.Add(1); return nil }

// workerApp has a rule and a schedule that fires every minute. Schedule
// dedup keys are not per stream, so each test names its schedule apart
// (tick-<n>) or another test's occurrence of the same minute would take its
// place.
func workerApp() string {
	return fmt.Sprintf(`
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}}
schedules:
  - {name: tick-%d, handler: jobs.tick, cron: "* * * * *"}
`, rand.Uint64())
}

// workerHarness runs a Worker over streams on a private redis-server.
type workerHarness struct {
	t       *testing.T
	cfg     worker.Config
	calls   *apptest.Calls
	logs    *testutil.Buffer
	reg     *prometheus.Registry
	runner  *sweepingRunner
	streams []string
}

func newWorkerHarness(t *testing.T, streams ...string) *workerHarness {
	t.Helper()
	h := &workerHarness{t: t, calls: &apptest.Calls{}, logs: &testutil.Buffer{}, reg: prometheus.NewRegistry()}
	for _, s := range streams {
		h.streams = append(h.streams, redistest.Name(t, s))
	}
	record := func(context.Context, runtime.Request) error { return nil }
	handlers := map[string]runtime.HandlerFunc{}
	for _, k := range []string{"users/events.created", "users/jobs.tick"} {
		handlers[k] = func(ctx context.Context, req runtime.Request) error { h.calls.Add(req); return record(ctx, req) }
	}
	h.runner = &sweepingRunner{Runner: runtime.NewFunc(handlers)}
	cfg := fastConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Metrics = h.reg
	h.cfg = worker.Config{
		Redis: redistest.Client(t), Streams: h.streams, Group: "workers", Consumer: "w1",
		Apps: worker.Static(apptest.Load(t, map[string]string{"users": workerApp()})), Runner: h.runner,
		StateDir: t.TempDir(), SweepInterval: 50 * time.Millisecond, Engine: cfg,
	}
	return h
}

// counter sums the counter name over every label set in h's registry.
func (h *workerHarness) counter(name string) float64 {
	return h.sum(name, func(m *dto.Metric) float64 { return m.GetCounter().GetValue() })
}

func (h *workerHarness) sum(name string, value func(*dto.Metric) float64) float64 {
	h.t.Helper()
	var sum float64
	for _, m := range testutil.Metrics(h.t, h.reg, name) {
		sum += value(m)
	}
	return sum
}

// run runs a Worker of h.cfg until the test ends; stop stops it and
// returns Run's error.
func (h *workerHarness) run() (w *worker.Worker, stop func() error) {
	h.t.Helper()
	w, err := worker.New(h.cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	var result error
	stopped := false
	stop = func() error {
		if !stopped {
			stopped = true
			cancel()
			result = <-done
		}
		return result
	}
	h.t.Cleanup(func() { _ = stop() })
	h.t.Cleanup(func() {
		if h.t.Failed() {
			h.t.Logf("worker log:\n%s", h.logs.String())
		}
	})
	return w, stop
}

// TestWorkerRunsStreamsAndSchedules: one Worker consumes two streams with
// one app, runs the app's schedule (its latest occurrence, caught up at
// start, published into the first stream), acknowledges and retains every
// message, keeps cluster stats per stream, and labels metrics by stream.
func TestWorkerRunsStreamsAndSchedules(t *testing.T) {
	h := newWorkerHarness(t, "orders", "payments")
	w, stop := h.run()
	rc := h.cfg.Redis
	ids := map[string]string{}
	for _, s := range h.streams {
		id, err := redisstream.New(rc, s, "workers", "producer").Publish(t.Context(), map[string]string{"event": `{"event_name":"INSERT"}`})
		if err != nil {
			t.Fatal(err)
		}
		ids[s] = id
	}
	testutil.WaitFor(t, 10*time.Second, "both events and the tick", func() bool {
		return h.calls.Count("users/events.created") == 2 && h.calls.Count("users/jobs.tick") >= 1
	})
	for _, s := range h.streams {
		testutil.WaitFor(t, 10*time.Second, s+" acknowledged", func() bool {
			n, _, err := redisstream.New(rc, s, "workers", "probe").Pending(t.Context())
			return err == nil && n == 0
		})
		// The Worker pairs XACK and retention: the state is retained.
		testutil.WaitFor(t, 5*time.Second, s+" retained", func() bool {
			st, err := redisstate.New(rc).Get(t.Context(), invocation.Key{Stream: s, Group: "workers", MessageID: ids[s]})
			return err == nil && st["__terminal"] == "1" && st["users/events.created"] == "ok"
		})
	}
	if err := w.Ready(t.Context()); err != nil {
		t.Errorf("Ready while running: %v", err)
	}
	if w.Apps() == nil || w.Apps().Get("users") == nil {
		t.Error("Apps() does not return the loaded apps")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := w.Ready(t.Context()); err == nil || !strings.Contains(err.Error(), "consuming "+h.streams[0]) {
		t.Errorf("Ready after the stop = %v, want the engines named as not consuming", err)
	}
	// The occurrence went to the first stream.
	c, err := redisstats.Read(t.Context(), rc, h.streams[0], "workers")
	if err != nil || c.Received != 1 || c.Successes < 2 {
		t.Errorf("stats of %s = %+v, %v; want 1 event received and 2+ successes (the event and the tick)", h.streams[0], c, err)
	}
	// The feed relay console tails has the event's outcome.
	feed, err := redisstats.ReadFeed(t.Context(), rc, h.streams[1], "workers", "0", 10, 0)
	if err != nil || len(feed) != 1 || feed[0].MessageID != ids[h.streams[1]] || feed[0].Outcome != "succeeded" ||
		feed[0].Consumer != "w1" || feed[0].Handler != "events.created" {
		t.Errorf("feed of %s = %+v, %v; want the event's success", h.streams[1], feed, err)
	}
	labelled := map[string]bool{}
	for _, m := range testutil.Metrics(t, h.reg, "relay_events_received_total") {
		for _, l := range m.GetLabel() {
			if l.GetName() == "stream" && m.GetCounter().GetValue() == 1 {
				labelled[l.GetValue()] = true
			}
		}
	}
	if !labelled[h.streams[0]] || !labelled[h.streams[1]] {
		t.Errorf("relay_events_received_total by stream = %v, want 1 for each of %v", labelled, h.streams)
	}
}

// tallyState counts the settlements of the Engine it wraps that write a
// dead-letter entry, once each has returned. It keeps the store's
// ClaimVoider.
type tallyState struct {
	relay.StateStore
	writes atomic.Int64
}

func (d *tallyState) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	res := d.StateStore.Settle(ctx, ss)
	for _, s := range ss {
		for _, t := range s.Transitions {
			if t.Entry != nil {
				d.writes.Add(1)
			}
		}
	}
	return res
}

func (d *tallyState) Void(ctx context.Context, l invocation.Lease) error {
	return d.StateStore.(relay.ClaimVoider).Void(ctx, l)
}

// TestWorkerWrapsComponentsAndRetainsDLQMarkers: WrapComponents sees the
// parts the Worker built and the Engine uses what it returns; the marker
// of a written dead-letter entry is in the invocation state and lives as
// long as it (Config.Retention), with no key of its own beside the queue;
// no entry is written for a message no longer pending.
func TestWorkerWrapsComponentsAndRetainsDLQMarkers(t *testing.T) {
	h := newWorkerHarness(t, "orders")
	h.cfg.Engine.Retention = time.Hour
	var wrapped []*tallyState
	h.cfg.WrapComponents = func(c relay.Components) relay.Components {
		if _, ok := c.State.(*redisstate.Store); !ok {
			t.Errorf("WrapComponents got State %T, want the Worker's *redisstate.Store", c.State)
		}
		if c.Source == nil || c.State == nil || c.Stream != h.streams[0] || c.Consumer != "w1" {
			t.Errorf("WrapComponents got incomplete components %+v", c)
		}
		d := &tallyState{StateStore: c.State}
		wrapped = append(wrapped, d)
		c.State = d
		return c
	}
	_, stop := h.run()
	defer stop()
	rc := h.cfg.Redis
	id, err := redisstream.New(rc, h.streams[0], "workers", "producer").Publish(t.Context(), map[string]string{"event": `{not json`})
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the malformed event dead-lettered", func() bool {
		return len(wrapped) == 1 && wrapped[0].writes.Load() == 1
	})
	testutil.WaitFor(t, 10*time.Second, "the malformed event acknowledged", func() bool {
		summary, err := rc.Do(t.Context(), rc.B().Xpending().Key(h.streams[0]).Group("workers").Build()).ToArray()
		if err != nil || len(summary) == 0 {
			return false
		}
		n, err := summary[0].AsInt64()
		return err == nil && n == 0
	})
	key := invocation.Key{Stream: h.streams[0], Group: "workers", MessageID: id}
	hash := keys.Invocation(key.Stream, key.Group, key.MessageID)
	st, err := rc.Do(t.Context(), rc.B().Hgetall().Key(hash).Build()).AsStrMap()
	malformed := dlq.MalformedName + "/" + dlq.MalformedName
	if err != nil || !strings.HasSuffix(st[malformed], ":dlq") || st[invocation.DLQField(malformed)] == "" {
		t.Errorf("state of the dead-lettered message = %v, %v; want its marker and entry id", st, err)
	}
	ttl, err := rc.Do(t.Context(), rc.B().Pttl().Key(hash).Build()).AsInt64()
	if err != nil || ttl <= 0 || ttl > time.Hour.Milliseconds() {
		t.Errorf("PTTL of the state holding the marker = %dms, %v; want at most the state retention, 1h", ttl, err)
	}
	if others, err := rc.Do(t.Context(), rc.B().Keys().Pattern("relay:*"+h.streams[0]+"*:dlq:*").Build()).AsStrSlice(); err != nil || len(others) != 0 {
		t.Errorf("keys beside the queue = %v, %v; want none", others, err)
	}
	// The message is acknowledged: no entry of it is written any more.
	late := dlq.Entry{OriginalID: id, Group: "workers", Consumer: "w1", Event: "{}", Reason: "late",
		App: "orders", Handler: "events.late", HandlerAttempts: 1}
	l := invocation.Lease{Key: key, Field: "orders/events.late", Attempt: 1, Token: "late"}
	res := wrapped[0].Settle(t.Context(), []invocation.Settlement{{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: l, Entry: &late}}}})
	if !errors.Is(res[0].Err, invocation.ErrTerminal) {
		t.Errorf("dead-letter settlement for an acknowledged message = %v; want invocation.ErrTerminal", res[0].Err)
	}
	if n, err := redisdlq.NewStore(rc, h.streams[0]).Len(t.Context()); err != nil || n != 1 {
		t.Errorf("%d DLQ entries, %v; want the one", n, err)
	}
}

// TestWorkerSweepsTheRunnerOnce: a Runner that is a Sweeper is swept at
// start and then every sweep interval, once per interval whatever the
// number of streams.
func TestWorkerSweepsTheRunnerOnce(t *testing.T) {
	h := newWorkerHarness(t, "a", "b", "c")
	h.cfg.SweepInterval = 200 * time.Millisecond
	start := time.Now()
	_, stop := h.run()
	testutil.WaitFor(t, 5*time.Second, "repeated sweeps", func() bool { return h.runner.sweeps.Load() >= 3 })
	_ = stop()
	// Sweeps per stream would be three at start alone and three per tick.
	if n, max := h.runner.sweeps.Load(), int32(time.Since(start)/(200*time.Millisecond))+1; n > max {
		t.Errorf("%d sweeps in %s: more than one per interval", n, time.Since(start))
	}
}

func TestWorkerRefusesToRunWithoutApps(t *testing.T) {
	h := newWorkerHarness(t, "events")
	empty, _ := app.NewSet()
	h.cfg.Apps = worker.Static(empty)
	w, err := worker.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); !errors.Is(err, worker.ErrNoApps) {
		t.Errorf("Run with no apps = %v, want ErrNoApps", err)
	}
	if err := w.Run(t.Context()); !errors.Is(err, worker.ErrRan) {
		t.Errorf("second Run = %v, want ErrWorkerRan", err)
	}
}

// A handler with no Go function fails New, for apps built in Go and for
// apps from templates (runtime: go) in a directory or an fs.FS alike,
// naming every missing and unused one, and Run when a template changed
// after New; a function nothing names is no reason to refuse
// (docs/embedding.md#go-handlers).
func TestWorkerRefusesHandlersWithoutFunctions(t *testing.T) {
	h := newWorkerHarness(t, "events")
	ok := func(context.Context, runtime.Request) error { return nil }
	h.cfg.Runner = runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.placed": ok, "orders/orders.plaecd": ok})
	pattern := apptest.One(t, "x", "runtime: go\nevents:\n  - {handler: h.x, pattern: {type: [x]}}\n").Rules[0].Pattern
	set, err := app.NewSet(&app.App{Name: "orders", Rules: []app.Rule{{Handler: "orders.placed", Pattern: pattern}, {Handler: "orders.charge", Pattern: pattern}}})
	if err != nil {
		t.Fatal(err)
	}
	h.cfg.Apps = worker.Static(set)
	_, err = worker.New(h.cfg)
	if err == nil || !strings.Contains(err.Error(), "no Go function registered for orders/orders.charge;") ||
		!strings.Contains(err.Error(), "named by no rule or schedule: orders/orders.plaecd") {
		t.Errorf("New = %v, want it to name the missing orders.charge and the unused orders.plaecd", err)
	}

	const charge = "runtime: go\nevents:\n  - {handler: orders.charge, pattern: {type: [x]}}\n"
	root := testutil.AppsRoot(t, map[string]string{"orders": charge})
	for name, src := range map[string]worker.AppSource{
		"template.Dir": template.Dir(root),
		"template.FS":  template.FS(os.DirFS(root), "."),
	} {
		h.cfg.Apps = src
		if _, err := worker.New(h.cfg); err == nil || !strings.Contains(err.Error(), "worker: New: ") ||
			!strings.Contains(err.Error(), "no Go function registered for orders/orders.charge") {
			t.Errorf("New with %s = %v, want it to name the missing orders.charge", name, err)
		}
	}

	// A template edited between New and Run: Run checks again.
	placed := filepath.Join(root, "orders", app.TemplateFile)
	if err := os.WriteFile(placed, []byte("runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [x]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	h.cfg.Apps = template.Dir(root)
	w, err := worker.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(placed, []byte(charge), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "no Go function registered for orders/orders.charge") {
		t.Errorf("Run = %v, want it to name the missing orders.charge", err)
	}
}

// countingSource counts the Loads of an AppSource.
type countingSource struct {
	worker.AppSource
	loads atomic.Int32
}

func (c *countingSource) Load(ctx context.Context) (*app.Set, error) {
	c.loads.Add(1)
	return c.AppSource.Load(ctx)
}

// TestWorkerServesAppsFromAnFS: a Worker serves the apps of an fs.FS (an
// embed.FS in a service's binary) and a reload, which finds the same
// files, changes nothing and logs no change.
func TestWorkerServesAppsFromAnFS(t *testing.T) {
	h := newWorkerHarness(t, "events")
	fsys := fstest.MapFS{"apps/users/template.yaml": {Data: []byte("runtime: go\nevents:\n  - {handler: events.created, pattern: {event_name: [INSERT]}}\n")}}
	src := &countingSource{AppSource: template.FS(fsys, "apps")}
	h.cfg.Apps = src
	h.cfg.ReloadInterval = 20 * time.Millisecond
	w, stop := h.run()
	testutil.WaitFor(t, 5*time.Second, "the apps served", func() bool { return w.Apps() != nil })
	first := w.Apps()
	rc := h.cfg.Redis
	if err := rc.Do(t.Context(), rc.B().Xadd().Key(h.streams[0]).Id("*").FieldValue().FieldValue("event", `{"event_name":"INSERT"}`).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the handler run", func() bool { return h.calls.Count("users/events.created") == 1 })
	w.Reload()
	loads := src.loads.Load() // New's, Run's and the reloads' so far
	testutil.WaitFor(t, 5*time.Second, "two reloads more", func() bool { return src.loads.Load() >= loads+2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if w.Apps() != first {
		t.Error("a reload of an fs.FS replaced the apps served, which did not change")
	}
	if strings.Contains(h.logs.String(), "app changed") || strings.Count(h.logs.String(), "app loaded") != 1 {
		t.Errorf("log of reloads of unchanged files:\n%s", h.logs)
	}
}

func TestNewValidates(t *testing.T) {
	_, err := worker.New(worker.Config{Streams: []string{"a", "a"}, Engine: relay.Config{MinPendingIdle: -1},
		RetentionInterval: 1, DLQRetention: 1, StreamRetention: -2 * time.Hour, MemoryCheckInterval: worker.Disabled})
	for _, want := range []string{"Config.Redis is required", "Config.Group is required", "Config.Apps is required",
		"Config.Runner is required", `"a" is empty or listed twice`,
		"Config.RetentionInterval: must be 0 (the default) or at least 1ms, got 1ns",
		"Config.DLQRetention: must be 0 (the default), Disabled (off) or at least 1ms, got 1ns",
		"Config.StreamRetention: must be 0 (the default), Disabled (off) or at least 1ms, got -2h0m0s"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New error %v does not say %q", err, want)
		}
	}
	h := newWorkerHarness(t, "events")
	h.cfg.Engine.MinPendingIdle = -time.Second
	if _, err := worker.New(h.cfg); err == nil || !strings.Contains(err.Error(), "Config.MinPendingIdle") {
		t.Errorf("New with a bad engine setting = %v, want it named", err)
	}
}

// healthyPinger is a Runner whose Ping answers at once, as a reachable
// containerd does, unless its context has already ended.
type healthyPinger struct{ relay.Runner }

func (healthyPinger) Ping(ctx context.Context) error { return ctx.Err() }

// TestWorkerReadyBlamesOnlyWhatHangs: a Redis that hangs until Ready's
// deadline must not make the Runner look unreachable as well (/readyz
// said "runner: ... deadline exceeded" of a healthy containerd).
func TestWorkerReadyBlamesOnlyWhatHangs(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	h := newWorkerHarness(t, "events")
	h.cfg.Redis = redistest.Connect(t, srv.Addr)
	h.cfg.Runner = healthyPinger{h.runner}
	w, err := worker.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	err = w.Ready(ctx)
	if err == nil || !strings.Contains(err.Error(), "redis: ") {
		t.Fatalf("Ready with Redis hung = %v, want redis named", err)
	}
	if strings.Contains(err.Error(), "runner") {
		t.Errorf("Ready with Redis hung = %v: the runner answered, it must not be named", err)
	}
}

// hidingSource wraps a StreamSource by embedding the interface, which
// hides every optional capability of the Worker's source.
type hidingSource struct{ relay.StreamSource }

// A wrapper that hides the source's optional capabilities is refused by
// New, naming what it hides (docs/embedding.md#wrapping-the-parts).
func TestWorkerRefusesWrappersThatHideCapabilities(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.WrapComponents = func(c relay.Components) relay.Components {
		c.Source = hidingSource{c.Source}
		return c
	}
	_, err := worker.New(h.cfg)
	for _, want := range []string{"hides relay.GroupEnsurer", "hides relay.PendingReporter", "hides relay.Pinger"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New = %v, want it to say %q", err, want)
		}
	}
}

// A stream that does not exist at start is named at WARN (a misspelled
// stream would otherwise wait forever in silence), or refused under
// RequireStreams.
func TestWorkerNamesAMissingStream(t *testing.T) {
	h := newWorkerHarness(t, "ordres")
	h.cfg.RequireStreams = true
	w, err := worker.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); err == nil || !strings.Contains(err.Error(), "stream "+h.streams[0]+" does not exist") {
		t.Errorf("Run with RequireStreams = %v, want it to name the missing stream", err)
	}

	h.cfg.RequireStreams = false
	h.cfg.Engine.Metrics = prometheus.NewRegistry()
	_, stop := h.run()
	defer stop()
	want := `level=WARN msg="stream does not exist; creating it empty with the consumer group: check its name if events were expected" stream=` + h.streams[0]
	testutil.WaitFor(t, 10*time.Second, "the warning", func() bool { return strings.Contains(h.logs.String(), want) })
}

// pingCounter wraps the Worker's source keeping every capability (it
// embeds the *redisstream.Source) and counts the readiness pings it sees.
type pingCounter struct {
	*redisstream.Source
	pings atomic.Int32
}

func (p *pingCounter) Ping(ctx context.Context) error {
	p.pings.Add(1)
	return p.Source.Ping(ctx)
}

// New refuses a source wrapper that hides relay.Pinger because readiness
// asks the stream through it; so Ready must ask the wrapped source, not
// the one the Worker built (docs/embedding.md#wrapping-the-parts).
func TestWorkerReadyPingsTheWrappedSource(t *testing.T) {
	h := newWorkerHarness(t, "events")
	var pc *pingCounter
	h.cfg.WrapComponents = func(c relay.Components) relay.Components {
		pc = &pingCounter{Source: c.Source.(*redisstream.Source)}
		c.Source = pc
		return c
	}
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "the worker ready", func() bool { return w.Ready(t.Context()) == nil })
	if pc.pings.Load() == 0 {
		t.Error("Ready succeeded without pinging the wrapped source")
	}
}

// TestWorkerMaxConcurrencyIsWorkerGlobal: Engine.MaxConcurrency
// (MAX_CONCURRENCY) bounds the invocations of every stream of the worker
// together, not each stream's: with 2 slots and an app allowing 8, two
// streams with three blocked messages each run 2 at once
// (docs/delivery.md#concurrency-and-heartbeat).
func TestWorkerMaxConcurrencyIsWorkerGlobal(t *testing.T) {
	h := newWorkerHarness(t, "a", "b")
	var running, peak, done atomic.Int64
	release := make(chan struct{})
	h.cfg.Runner = runtime.NewFunc(map[string]runtime.HandlerFunc{
		"users/events.created": func(ctx context.Context, _ runtime.Request) error {
			n := running.Add(1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			defer done.Add(1)
			defer running.Add(-1)
			select {
			case <-release:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		},
	})
	h.cfg.Apps = worker.Static(apptest.Load(t, map[string]string{"users": "image: x\nconcurrency: 8\nevents:\n  - {handler: events.created, pattern: {event_name: [INSERT]}}\n"}))
	h.cfg.Engine.MaxConcurrency = 2
	_, stop := h.run()
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	t.Cleanup(unblock)
	rc := h.cfg.Redis
	for _, s := range h.streams {
		for range 3 {
			if _, err := redisstream.New(rc, s, "workers", "producer").Publish(t.Context(), map[string]string{"event": `{"event_name":"INSERT"}`}); err != nil {
				t.Fatal(err)
			}
		}
	}
	testutil.WaitFor(t, 10*time.Second, "two running and another waiting for a slot", func() bool {
		return running.Load() >= 2 && h.counter("relay_concurrency_waits_total") >= 1
	})
	if got := peak.Load(); got != 2 {
		t.Errorf("peak concurrent invocations over both streams = %d, want 2", got)
	}
	unblock()
	testutil.WaitFor(t, 20*time.Second, "every message handled and acknowledged", func() bool {
		if done.Load() != 6 {
			return false
		}
		for _, s := range h.streams {
			n, _, err := redisstream.New(rc, s, "workers", "w1").Pending(t.Context())
			if err != nil || n != 0 {
				return false
			}
		}
		return true
	})
	if got := peak.Load(); got != 2 {
		t.Errorf("peak concurrent invocations over both streams = %d, want 2 (MaxConcurrency)", got)
	}
	if err := stop(); err != nil {
		t.Error(err)
	}
}

// TestUnusableStateDirStopsRunBeforeStart: a state directory that cannot
// hold the schedule outbox of the apps' schedules stops Run before the
// worker starts, with an error naming the setting; nothing is consumed and
// "worker started" is never logged.
func TestUnusableStateDirStopsRunBeforeStart(t *testing.T) {
	t.Parallel()
	h := newWorkerHarness(t, "events")
	file := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	h.cfg.StateDir = file
	w, err := worker.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = w.Run(t.Context())
	if err == nil || !strings.Contains(err.Error(), "Config.StateDir") || !strings.Contains(err.Error(), "cannot hold the schedule outbox") {
		t.Fatalf("Run = %v, want the state directory refused", err)
	}
	if strings.Contains(h.logs.String(), "worker started") {
		t.Errorf("logged worker started before refusing the state directory:\n%s", h.logs)
	}
}
