package relay_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
)

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
	// Twenty heartbeats (50ms) per MinPendingIdle, so that a stall of a
	// loaded test machine is not taken for a dead worker;
	// TestFakesHeartbeatKeepsALongHandlerFromReclaim checks the production
	// timings exactly.
	idle := minPendingIdle(time.Second)
	h.start("c1", idle)
	id := h.publish("event", `{"event_name":"INSERT"}`)
	<-started
	h.start("c2", idle) // a second worker reclaiming every 50ms
	// Asserting that something does not happen needs a period: three
	// times MinPendingIdle.
	time.Sleep(3 * time.Second)
	if d := deliveries(t, h, id); d != 1 {
		t.Errorf("live entry was reclaimed: %d deliveries, want 1", d)
	}
	close(release)
	testutil.WaitFor(t, 15*time.Second, "ack", func() bool { return h.settled() })
	if n := h.calls.Count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times", n)
	}
}

func TestPendingGauges(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("keep it pending") })
	h.start("c1", backoff(time.Hour))
	h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "pending gauge", func() bool { return h.gauge("relay_pending_entries") == 2 })
	if age := h.gauge("relay_pending_oldest_age_seconds"); age < 0 || age > 60 {
		t.Errorf("oldest pending age = %vs", age)
	}
}
