package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// flakyClaims fails Claim while broken is set, as a Redis outage would.
type flakyClaims struct {
	relay.StateStore
	broken atomic.Bool
}

func (f *flakyClaims) Claim(ctx context.Context, key invocation.Key, field string, lease time.Duration, max int) (invocation.Claim, error) {
	if f.broken.Load() {
		return invocation.Claim{}, errors.New("injected: state store unreachable")
	}
	return f.StateStore.Claim(ctx, key, field, lease, max)
}

func TestClaimErrorFailsClosed(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	flaky := &flakyClaims{StateStore: h.state}
	flaky.broken.Store(true)
	h.stateStore = flaky
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 5*time.Second, "claim failure logged", func() bool {
		return strings.Contains(h.logs.String(), "claim failed; handler not run")
	})
	if h.calls.count("users/events.created") != 0 {
		t.Fatal("handler ran although its claim failed")
	}
	if h.pending() != 1 {
		t.Fatal("message acknowledged although its claim failed")
	}
	flaky.broken.Store(false)
	waitFor(t, 10*time.Second, "run after recovery", func() bool { return h.settled() })
	if runs := h.calls.get("users/events.created"); len(runs) != 1 || runs[0].Attempt != 1 {
		t.Errorf("runs after recovery = %+v, want one first attempt", runs)
	}
	if h.hash(id)["users/events.created"] != "ok" {
		t.Errorf("state = %v", h.hash(id))
	}
}

func TestRuntimeUnavailableChargesNoAttempt(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	var down atomic.Bool
	down.Store(true)
	h.handle("users/events.created", nil)
	inner := runtime.NewFunc(h.handlers)
	h.runner = runnerFunc(func(ctx context.Context, req runtime.Request) (runtime.Result, error) {
		if down.Load() {
			return runtime.Result{}, fmt.Errorf("image relay.local/busybox:latest not found: %w", runtime.ErrUnavailable)
		}
		return inner.Run(ctx, req)
	})
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	waitFor(t, 5*time.Second, "several unavailable deliveries", func() bool { return deliveries(t, h, id) >= 3 })
	if h.pending() != 1 || len(h.dlqEntries()) != 0 {
		t.Fatal("an unavailable app's message was acknowledged or dead-lettered")
	}
	if v := h.hash(id)["users/events.created"]; attemptsUsed(t, v) > 0 {
		t.Errorf("unavailability charged an attempt: %q", v)
	}
	down.Store(false)
	waitFor(t, 10*time.Second, "run once available", func() bool { return h.settled() })
	if runs := h.calls.get("users/events.created"); len(runs) != 1 || runs[0].Attempt != 1 {
		t.Errorf("runs = %+v, want exactly attempt 1", runs)
	}
}

type runnerFunc func(context.Context, runtime.Request) (runtime.Result, error)

func (f runnerFunc) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	return f(ctx, req)
}

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
	waitFor(t, 10*time.Second, "ack", func() bool { return h.settled() })
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

func TestOutcomeUnknownKeepsTheLease(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 200ms}
`})
	var lost atomic.Bool
	lost.Store(true)
	h.handle("users/events.created", nil)
	inner := runtime.NewFunc(h.handlers)
	h.runner = runnerFunc(func(ctx context.Context, req runtime.Request) (runtime.Result, error) {
		if lost.CompareAndSwap(true, false) {
			h.calls.add(req) // it ran, then the runtime lost track of it
			return runtime.Result{}, fmt.Errorf("wait task: %w: connection closed", runtime.ErrOutcomeUnknown)
		}
		return inner.Run(ctx, req)
	})
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT"}`)
	waitFor(t, 5*time.Second, "first run", func() bool { return h.calls.count("users/events.created") == 1 })
	if v := h.hash(id)["users/events.created"]; !strings.HasPrefix(v, "running:") {
		t.Fatalf("after an unknown outcome the claim must be kept, got %q", v)
	}
	// The lease (200ms timeout + 500ms grace) expires and counts: the
	// next run is attempt 2.
	waitFor(t, 10*time.Second, "ack", func() bool { return h.settled() })
	runs := h.calls.get("users/events.created")
	if len(runs) != 2 || runs[1].Attempt != 2 {
		t.Errorf("runs = %d (last attempt %d), want 2 with the second as attempt 2", len(runs), runs[len(runs)-1].Attempt)
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
	waitFor(t, 10*time.Second, "ack", h.settled)
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
