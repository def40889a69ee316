package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
)

// failFinishes fails the settlements of h's store that record a success
// while down reports true, as Redis would while it is unreachable at the
// moment a handler completes, and counts them.
func failFinishes(h *harness, down func() bool) (tries *atomic.Int32) {
	tries = new(atomic.Int32)
	h.stateStore = &hookedState{StateStore: h.state, hook: func(_ context.Context, s invocation.Settlement) error {
		if !writes(s, invocation.Finish) {
			return nil
		}
		tries.Add(1)
		if down() {
			return errors.New("injected: connection refused")
		}
		return nil
	}}
	return tries
}

func TestSuccessSurvivesRedisBlinkAtFinish(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, retries: 0}
`})
	h.handle("users/events.created", nil)
	// A restart: the first two writes fail.
	var fails atomic.Int32
	fails.Store(2)
	failFinishes(h, func() bool { return fails.Add(-1) >= 0 })
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "ack", func() bool { return h.settled() })
	if n := h.calls.Count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok: a success must survive a transient failure to record it", got)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("a succeeded invocation was dead-lettered")
	}
}

// A success outlives an outage longer than one write's timeout: the worker
// keeps retrying the fenced write while it still holds the message,
// instead of letting the lease expire into a failed attempt (found by a
// fresh-user trial: the success was dead-lettered).
func TestSuccessSurvivesOutageLongerThanWriteTimeout(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, retries: 0, timeout: 20s}
`})
	h.handle("users/events.created", nil)
	// An outage longer than one write's timeout (200ms).
	until := time.Now().Add(1500 * time.Millisecond)
	tries := failFinishes(h, func() bool { return time.Now().Before(until) })
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "ack", h.settled)
	if n := h.calls.Count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok", got)
	}
	if es := h.dlqEntries(); len(es) != 0 {
		t.Errorf("a succeeded invocation was dead-lettered: %+v", es)
	}
	if n := tries.Load(); n < 3 {
		t.Errorf("Finish tried %d times; the outage was not exercised", n)
	}
}
