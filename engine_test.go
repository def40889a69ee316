package relay_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

func TestNewValidates(t *testing.T) {
	apps := apptest.Load(t, map[string]string{"users": usersApp})
	_, err := relay.NewEngine(apps, relay.Components{}, relay.Config{MaxConcurrency: -1, MinPendingIdle: -1})
	if err == nil {
		t.Fatal("NewEngine accepted missing components")
	}
	for _, want := range []string{"Components.Source is required", "Components.Stream is required", "Config.MaxConcurrency: must be >= 0", "Config.MinPendingIdle"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	// The same mistakes read the same on every run, in Components' order.
	if i, j := strings.Index(err.Error(), "Components.Source"), strings.Index(err.Error(), "Components.Consumer"); i < 0 || j < i {
		t.Errorf("error %q does not list the missing components in field order", err)
	}
	for range 20 {
		if _, again := relay.NewEngine(apps, relay.Components{}, relay.Config{MaxConcurrency: -1, MinPendingIdle: -1}); again.Error() != err.Error() {
			t.Fatalf("the same mistakes gave %q, then %q", err, again)
		}
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
		Source: src, State: h.state, Runner: runtime.NewFunc(nil),
		Stream: h.stream, Group: h.group, Consumer: "c1",
	}, fastConfig())
	if err != nil {
		t.Fatal(err)
	}
	if err := e.Ping(t.Context()); !errors.Is(err, relay.ErrNotConsuming) {
		t.Errorf("Ping before Run = %v, want ErrNotConsuming", err)
	}
	stop := h.run(e)
	testutil.WaitFor(t, 5*time.Second, "consuming", func() bool { return e.Ping(t.Context()) == nil })
	src.failing.Store(true)
	testutil.WaitFor(t, 5*time.Second, "not consuming while reads fail", func() bool { return errors.Is(e.Ping(t.Context()), relay.ErrNotConsuming) })
	src.failing.Store(false)
	testutil.WaitFor(t, 10*time.Second, "consuming again", func() bool { return e.Ping(t.Context()) == nil })
	stop()
	if err := e.Ping(t.Context()); !errors.Is(err, relay.ErrNotConsuming) {
		t.Errorf("Ping after Run = %v, want ErrNotConsuming", err)
	}
}

// NewEngine refuses a Go app whose handler has no function, naming it and
// every function no rule names; a function nothing names alone is only a
// warning (docs/embedding.md#go-handlers).
func TestNewEngineChecksGoHandlers(t *testing.T) {
	apps := apptest.Load(t, map[string]string{"orders": "runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [placed]}}\n  - {handler: orders.charge, pattern: {type: [charge]}}\n"})
	ok := func(context.Context, runtime.Request) error { return nil }
	c := relay.Components{
		Source: relaytest.NewStream().Consumer("c1"), State: relaytest.NewStateStore(),
		Stream: "events", Group: "g", Consumer: "c1",
	}
	c.Runner = runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.placed": ok, "orders/orders.chrage": ok})
	_, err := relay.NewEngine(apps, c, relay.Config{})
	if err == nil || !strings.Contains(err.Error(), "no Go function registered for orders/orders.charge;") ||
		!strings.Contains(err.Error(), "named by no rule or schedule: orders/orders.chrage") {
		t.Errorf("NewEngine = %v, want it to name the missing orders.charge and the unused orders.chrage", err)
	}
	logs := &testutil.Buffer{}
	c.Runner = runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.placed": ok, "orders.charge": ok, "orders/orders.refund": ok})
	if _, err := relay.NewEngine(apps, c, relay.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}); err != nil {
		t.Errorf("NewEngine with an extra function = %v, want a warning only", err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "orders/orders.refund") {
		t.Errorf("no warning names the unused function:\n%s", logs.String())
	}
}

// onlyRun wraps a Runner forwarding Run alone, as a naive wrapper does.
type onlyRun struct{ relay.Runner }

// A Runner wrapper that hides runtime.HandlerChecker turns off the start
// check of Go handlers: a missing function then fails its attempts at run
// time. NewEngine warns, naming the Go apps (docs/embedding.md#go-handlers).
func TestNewEngineWarnsWhenGoHandlersCannotBeChecked(t *testing.T) {
	apps := apptest.Load(t, map[string]string{"orders": "runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [placed]}}\n"})
	ok := func(context.Context, runtime.Request) error { return nil }
	c := relay.Components{
		Source: relaytest.NewStream().Consumer("c1"), State: relaytest.NewStateStore(),
		Stream: "events", Group: "g", Consumer: "c1",
		Runner: onlyRun{runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.plaecd": ok})},
	}
	logs := &testutil.Buffer{}
	e, err := relay.NewEngine(apps, c, relay.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "runtime.HandlerChecker") ||
		!strings.Contains(logs.String(), "apps=[orders]") {
		t.Errorf("no warning says the Go handlers of orders are not checked:\n%s", logs.String())
	}
	before := strings.Count(logs.String(), "HandlerChecker")
	e.SetApps(apps)
	if n := strings.Count(logs.String(), "HandlerChecker"); n != before {
		t.Errorf("warned again on SetApps:\n%s", logs.String())
	}
	// A runtime.Func checks its handlers itself: no warning.
	logs = &testutil.Buffer{}
	c.Runner = runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.placed": ok})
	if _, err := relay.NewEngine(apps, c, relay.Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}); err != nil || strings.Contains(logs.String(), "HandlerChecker") {
		t.Errorf("a Func: %v\n%s", err, logs.String())
	}
}
