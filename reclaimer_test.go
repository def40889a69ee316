package relay_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// TestReclaimTakesOnlyWhatItCanStart: entries orphaned by a dead consumer
// are reclaimed only as message slots free up (2 × MAX_CONCURRENCY, plus
// the one entry that waits for a slot), not all at once: the rest stay with
// the dead consumer, idle, for any worker to take. Every entry is still
// handled exactly once in the end.
func TestReclaimTakesOnlyWhatItCanStart(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
concurrency: 2
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 30s}
`})
	ctx := context.Background()
	const n = 30
	for i := range n {
		h.publish("event", fmt.Sprintf(`{"event_name":"INSERT","n":%d}`, i))
	}
	dead := redisstream.New(h.rc, h.stream, h.group, "dead")
	if msgs, err := dead.Read(ctx, n); err != nil || len(msgs) != n {
		t.Fatalf("dead consumer read %d, %v; want %d", len(msgs), err, n)
	}

	var started atomic.Int64
	release := make(chan struct{})
	h.handle("users/events.created", func(ctx context.Context, _ runtime.Request) error {
		started.Add(1)
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	// MAX_CONCURRENCY 2: two handlers run, two more messages wait for an
	// invocation slot (a minute of concurrency wait) and one reclaimed entry
	// for a message slot, so the worker holds five.
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: h.src, State: h.state, Runner: runtime.NewFunc(h.handlers),
		Stream: h.stream, Group: h.group, Consumer: "c1",
	}, relay.Config{MaxConcurrency: 2, ConcurrencyWait: time.Minute,
		MinPendingIdle: 300 * time.Millisecond, ReclaimInterval: 50 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond, ShutdownTimeout: 2 * time.Second,
		Logger:  slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Metrics: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	h.run(e)
	testutil.WaitFor(t, 10*time.Second, "two handlers running", func() bool { return started.Load() == 2 })

	// Asserting that something does not happen needs a period: ten
	// reclaim intervals, past MinPendingIdle.
	for deadline := time.Now().Add(500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		if owned := owners(t, h)["c1"]; owned > 5 {
			t.Fatalf("c1 owns %d PEL entries with 4 message slots", owned)
		}
	}
	if got := owners(t, h)["dead"]; got < n-5 {
		t.Errorf("dead consumer still owns %d entries, want at least %d", got, n-5)
	}

	close(release)
	testutil.WaitFor(t, 20*time.Second, "every entry handled and acknowledged", func() bool { return h.settled() })
	if got := h.calls.Count("users/events.created"); got != n {
		t.Errorf("handler ran %d times for %d entries", got, n)
	}
	if started.Load() != n {
		t.Errorf("%d handler starts, want %d", started.Load(), n)
	}
	// The retention is written by the script that acknowledges (the
	// settlement), so it is there once the entries are settled.
	testutil.WaitFor(t, 5*time.Second, "the last entry's state retained", func() bool { return h.hash(h.last)["__terminal"] == "1" })
	if st := h.hash(h.last); st["users/events.created"] != "ok" {
		t.Errorf("state of the last entry = %v, want ok and retained", st)
	}
}

// owners counts the group's PEL entries per consumer.
func owners(t *testing.T, h *harness) map[string]int64 {
	t.Helper()
	summary, err := h.rc.Do(context.Background(), h.rc.B().Xpending().Key(h.stream).Group(h.group).Build()).ToArray()
	if err != nil || len(summary) < 4 {
		t.Fatalf("XPENDING: %v", err)
	}
	out := map[string]int64{}
	rows, _ := summary[3].ToArray()
	for _, r := range rows {
		f, err := r.AsStrSlice()
		if err != nil || len(f) != 2 {
			t.Fatalf("XPENDING consumer row: %v", err)
		}
		var c int64
		if _, err := fmt.Sscan(f[1], &c); err != nil {
			t.Fatal(err)
		}
		out[f[0]] = c
	}
	return out
}

func TestMissingPayloadIsCountedNotRunNotDeadLettered(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	ctx := context.Background()
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	// Another consumer read it and died; then the entry was deleted.
	other := redisstream.New(h.rc, h.stream, h.group, "dead", redisstream.WithBlock(50*time.Millisecond))
	if msgs, err := other.Read(ctx, 10); err != nil || len(msgs) != 1 {
		t.Fatalf("read = %v, %v", msgs, err)
	}
	// The dead consumer had claimed an invocation: its hash is pending,
	// without a TTL.
	key := invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}
	if r := h.state.Claim(ctx, []invocation.ClaimRequest{{Key: key, Field: "users/events.created", Lease: time.Minute, MaxAttempts: 5}}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	if ttl := h.ttl(id); ttl >= 0 {
		t.Fatalf("pending hash has TTL %s", ttl)
	}
	if err := h.rc.Do(ctx, h.rc.B().Xdel().Key(h.stream).Id(id).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.start("c1")
	testutil.WaitFor(t, 5*time.Second, "missing payload counted", func() bool { return h.counter("relay_missing_payload_total") == 1 })
	testutil.WaitFor(t, 2*time.Second, "PEL cleared", func() bool { return h.settled() })
	if h.calls.Count("users/events.created") != 0 || len(h.dlqEntries()) != 0 {
		t.Error("missing payload ran a handler or wrote a DLQ entry")
	}
	// Leaving the PEL switches the hash to retention; it must not leak.
	testutil.WaitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" && h.ttl(id) > 0 })
	time.Sleep(300 * time.Millisecond)
	if got := h.counter("relay_missing_payload_total"); got != 1 {
		t.Errorf("missing_payload_total = %v, want 1", got)
	}
}
