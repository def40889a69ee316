package relay_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
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
				cfg.MaxConcurrency, cfg.Limiter, cfg.Metrics = 8, limiter, prometheus.NewRegistry()
				e, err := relay.NewEngine(h.apps, relay.Components{
					Source: stream.New(h.rc, h.stream, h.group, "c1", stream.WithBlock(50*time.Millisecond)),
					State:  h.state, Runner: runner, DLQ: h.dlqw, Stream: h.stream, Group: h.group, Consumer: "c1",
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
			waitFor(t, 20*time.Second, "all handled", func() bool { return done.Load() == 2*each && a.settled() && b.settled() })
			if got := peak.Load(); got != c.wantPeak {
				t.Errorf("peak concurrent invocations = %d, want %d", got, c.wantPeak)
			}
		})
	}
	if _, err := relay.NewLimiter(0); err == nil {
		t.Error("NewLimiter(0) succeeded")
	}
}
