package relay_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// Two Engines (two streams of one worker) sharing a Limiter of 2 slots
// never run more than 2 invocations at once, and the app's concurrency of
// 1 holds across both streams.
func TestSharedLimiterBoundsEnginesTogether(t *testing.T) {
	for _, c := range []struct {
		name     string
		app      string
		slots    int
		wantPeak int64
	}{
		{"global bound", usersApp + "concurrency: 8\n", 2, 2},
		{"app bound", usersApp + "concurrency: 1\n", 8, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := newHarness(t, map[string]string{"users": c.app})
			b := newHarness(t, map[string]string{"users": c.app})
			var running, peak, done atomic.Int64
			handler := func(ctx context.Context, _ runtime.Request) error {
				n := running.Add(1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(30 * time.Millisecond)
				running.Add(-1)
				done.Add(1)
				return nil
			}
			runner := runtime.NewFunc(map[string]runtime.HandlerFunc{"users/events.created": handler})
			limiter, err := relay.NewLimiter(c.slots)
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range []*harness{a, b} {
				cfg := fastConfig()
				cfg.Limiter, cfg.Metrics = limiter, prometheus.NewRegistry() // MaxConcurrency: the Limiter's
				e, err := relay.NewEngine(h.apps, relay.Components{
					Source: redisstream.New(h.rc, h.stream, h.group, "c1", redisstream.WithBlock(50*time.Millisecond)),
					State:  h.state, Runner: runner, Stream: h.stream, Group: h.group, Consumer: "c1",
				}, cfg)
				if err != nil {
					t.Fatal(err)
				}
				h.run(e)
			}
			const each = 8
			for range each {
				a.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
				b.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
			}
			testutil.WaitFor(t, 20*time.Second, "all handled", func() bool { return done.Load() == 2*each && a.settled() && b.settled() })
			if got := peak.Load(); got != c.wantPeak {
				t.Errorf("peak concurrent invocations = %d, want %d", got, c.wantPeak)
			}
		})
	}
	if _, err := relay.NewLimiter(0); err == nil {
		t.Error("NewLimiter(0) succeeded")
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
	testutil.WaitFor(t, 5*time.Second, "a concurrency wait", func() bool { return h.counter("relay_concurrency_waits_total") >= 1 })
	testutil.WaitFor(t, 5*time.Second, "blocked invocation released", func() bool {
		return strings.Contains(h.logs.String(), "no concurrency slot within the wait")
	})
	// Released means left pending, not acked: the blocked message comes
	// back through a reclaim while the slot is still taken.
	testutil.WaitFor(t, 5*time.Second, "blocked message redelivered", func() bool {
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
	testutil.WaitFor(t, 10*time.Second, "both acked", func() bool { return h.settled() })
	if maxCur != 1 {
		t.Errorf("app with concurrency 1 ran %d at once", maxCur)
	}
	// The blocked message was replayed and ran once, as attempt 1.
	runs := map[string]int{}
	for _, r := range h.calls.Get("a/m.slow") {
		runs[r.MessageID]++
		if r.Attempt != 1 {
			t.Errorf("message %s ran as attempt %d; a blocked invocation must not be charged", r.MessageID, r.Attempt)
		}
	}
	if len(runs) != 2 || runs[first] != 1 || runs[second] != 1 {
		t.Errorf("runs per message = %v, want one each for %s and %s", runs, first, second)
	}
}

// docs/delivery.md#concurrency-and-heartbeat: an app's effective concurrency is
// min(concurrency, MAX_CONCURRENCY). An app allowing 8 on an Engine of
// MaxConcurrency 2 runs 2 at once; a third message waits for a slot.
func TestMaxConcurrencyCapsAnAppsConcurrency(t *testing.T) {
	h := newHarness(t, map[string]string{
		"a": "image: x\nconcurrency: 8\nevents:\n  - {handler: m.slow, pattern: {k: [v]}}\n",
	})
	var running, peak atomic.Int64
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	h.handle("a/m.slow", func(context.Context, runtime.Request) error {
		n := running.Add(1)
		for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
		}
		<-release
		running.Add(-1)
		return nil
	})
	h.start("c1", maxConcurrency(2))
	// Registered after start, so it runs before the engine's stop waits
	// for the blocked handlers.
	t.Cleanup(unblock)
	for range 4 {
		h.publish("event", `{"k":"v"}`)
	}
	testutil.WaitFor(t, 5*time.Second, "two running and another waiting", func() bool {
		return running.Load() == 2 && h.counter("relay_concurrency_waits_total") >= 1
	})
	if got := peak.Load(); got != 2 {
		t.Errorf("peak while blocked = %d, want 2", got)
	}
	unblock()
	testutil.WaitFor(t, 10*time.Second, "all acked", func() bool { return h.settled() && h.calls.Count("a/m.slow") == 4 })
	if got := peak.Load(); got != 2 {
		t.Errorf("peak concurrent invocations = %d, want 2 (MaxConcurrency)", got)
	}
}
