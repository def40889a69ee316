package relay_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
)

// blinkingFinish fails the first n Finish calls, as a Redis restart would
// at the moment a handler completes.
type blinkingFinish struct {
	relay.StateStore
	n atomic.Int32
}

func (b *blinkingFinish) Finish(ctx context.Context, l invocation.Lease) error {
	if b.n.Add(-1) >= 0 {
		return errors.New("injected: connection refused")
	}
	return b.StateStore.Finish(ctx, l)
}

func TestSuccessSurvivesRedisBlinkAtFinish(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, retries: 0}
`})
	h.handle("users/events.created", nil)
	blink := &blinkingFinish{StateStore: h.state}
	blink.n.Store(2)
	h.stateStore = blink
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "ack", func() bool { return h.settled() })
	if n := h.calls.count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok: a success must survive a transient failure to record it", got)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("a succeeded invocation was dead-lettered")
	}
}

// failingFinishFor fails every Finish until a deadline, as a Redis outage
// longer than one write's timeout would.
type failingFinishFor struct {
	relay.StateStore
	until time.Time
	tries atomic.Int32
}

func (f *failingFinishFor) Finish(ctx context.Context, l invocation.Lease) error {
	f.tries.Add(1)
	if time.Now().Before(f.until) {
		return errors.New("injected: connection refused")
	}
	return f.StateStore.Finish(ctx, l)
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
	down := &failingFinishFor{StateStore: h.state, until: time.Now().Add(1500 * time.Millisecond)}
	h.stateStore = down
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "ack", h.settled)
	if n := h.calls.count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok", got)
	}
	if es := h.dlqEntries(); len(es) != 0 {
		t.Errorf("a succeeded invocation was dead-lettered: %+v", es)
	}
	if n := down.tries.Load(); n < 3 {
		t.Errorf("Finish tried %d times; the outage was not exercised", n)
	}
}
