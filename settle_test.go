package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// lostReplies applies each settlement of h's store that acknowledges and
// then, the first time for each message, fails as if its reply was lost
// (the worker crashed, the connection broke): the settlement applied, and
// the Engine does not know it.
func lostReplies(h *harness) *atomic.Int32 {
	var mu sync.Mutex
	lost := map[string]bool{}
	n := new(atomic.Int32)
	h.stateStore = &hookedState{StateStore: h.state, hook: func(ctx context.Context, s invocation.Settlement) error {
		mu.Lock()
		defer mu.Unlock()
		if !s.Ack || lost[s.Key.MessageID] {
			return nil
		}
		lost[s.Key.MessageID] = true
		if r := h.state.Settle(ctx, []invocation.Settlement{s}); r[0].Err != nil {
			return r[0].Err
		}
		n.Add(1)
		return errors.New("injected: reply lost after the settlement applied")
	}}
	return n
}

// docs/delivery.md#dead-letter-queue: the DLQ entry is written in one step
// with the acknowledgement, so a settlement whose reply was lost and that
// is tried again leaves one entry and runs no handler again.
func TestDLQWriteIsIdempotentAcrossALostReply(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("declined") })
	h.handle("billing/charges.audit", nil)
	lost := lostReplies(h)
	h.start("c1")
	h.publish("event", `{"kind":"charge"}`)
	testutil.WaitFor(t, 10*time.Second, "acked", func() bool { return h.settled() })
	if lost.Load() != 1 {
		t.Fatalf("%d replies lost, want 1: the case was not exercised", lost.Load())
	}
	if n := len(h.dlqEntries()); n != 1 {
		t.Errorf("%d DLQ entries after a settlement whose reply was lost, want 1", n)
	}
	if h.calls.Count("billing/charges.fail") != 1 || h.calls.Count("billing/charges.audit") != 1 {
		t.Errorf("handlers ran again: fail %d, audit %d", h.calls.Count("billing/charges.fail"), h.calls.Count("billing/charges.audit"))
	}
}

// settlements records every settlement h's store is given.
func settlements(h *harness) func() []invocation.Settlement {
	var mu sync.Mutex
	var all []invocation.Settlement
	h.stateStore = &hookedState{StateStore: h.state, hook: func(_ context.Context, s invocation.Settlement) error {
		mu.Lock()
		all = append(all, s)
		mu.Unlock()
		return nil
	}}
	return func() []invocation.Settlement {
		mu.Lock()
		defer mu.Unlock()
		return append([]invocation.Settlement(nil), all...)
	}
}

// TestLastTransitionSettlesTheMessage: the last transition of a message,
// after terminal ones, is written with its acknowledgement and retention
// in one step, whether it records a success or a dead letter; one that
// ran before another handler of the message was written before that one
// ran.
func TestLastTransitionSettlesTheMessage(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}}
  - {handler: events.audited, pattern: {event_name: [INSERT]}}
  - {handler: events.failed, pattern: {event_name: [FAIL]}, retries: 0}
`})
	seen := settlements(h)
	h.handle("users/events.created", nil)
	h.handle("users/events.audited", nil)
	h.handle("users/events.failed", func(context.Context, runtime.Request) error { return errors.New("no") })
	h.start("c1")
	ok := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "settled", h.settled)
	shapes := func(id string) []string {
		var out []string
		for _, s := range seen() {
			if s.Key.MessageID != id {
				continue
			}
			shape := ""
			for _, tr := range s.Transitions {
				shape += tr.Kind.String() + " " + tr.Lease.Field + ", "
			}
			if s.Ack {
				shape += "ack"
			}
			out = append(out, shape)
		}
		return out
	}
	if got, want := fmt.Sprint(shapes(ok)), "[finish users/events.created,  finish users/events.audited, ack]"; got != want {
		t.Fatalf("settlements of %s = %s; want %s: the first success before the second ran, the second with the ack", ok, got, want)
	}
	st := h.hash(ok)
	if st["users/events.created"] != "ok" || st["users/events.audited"] != "ok" || st["__terminal"] != "1" {
		t.Errorf("state = %v, want both ok and retained", st)
	}
	failed := h.publish("event", `{"event_name":"FAIL"}`)
	testutil.WaitFor(t, 10*time.Second, "settled", h.settled)
	if got, want := fmt.Sprint(shapes(failed)), "[exhaust users/events.failed, ack]"; got != want {
		t.Errorf("settlements of a dead-lettered message = %s; want %s", got, want)
	}
}

// docs/delivery.md#outcomes: no message is acknowledged while any of its
// invocations is running. Here one invocation's attempt is leased to
// another worker (a live running lease in the state) while the message's
// other invocation succeeds: every delivery leaves the message pending and
// never runs the leased invocation a second time.
func TestRunningInvocationElsewhereHoldsTheAck(t *testing.T) {
	h := newHarness(t, map[string]string{"a": `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}}
  - {handler: h.two, pattern: {kind: [x]}}
`})
	h.handle("a/h.one", nil)
	h.handle("a/h.two", nil)
	id := h.publish("event", `{"kind":"x"}`)
	leased := "running:" + strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + ":1:elsewhere"
	key := keys.Invocation(h.stream, h.group, id)
	if err := h.rc.Do(t.Context(), h.rc.B().Hset().Key(key).FieldValue().FieldValue("a/h.one", leased).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.start("c1", reclaimOnly)
	testutil.WaitFor(t, 5*time.Second, "three deliveries or an ack", func() bool { return deliveries(t, h, id) >= 3 || h.settled() })
	if h.pending() != 1 {
		t.Fatal("message acknowledged while one of its invocations was running elsewhere")
	}
	if n, m := h.calls.Count("a/h.one"), h.calls.Count("a/h.two"); n != 0 || m != 1 {
		t.Errorf("runs: h.one %d (leased elsewhere, want 0), h.two %d (want 1)", n, m)
	}
	if st := h.hash(id); st["a/h.one"] != leased || st["a/h.two"] != "ok" || st["__terminal"] != "" {
		t.Errorf("state = %v; want the lease untouched, h.two ok, not retained", st)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("a running invocation was dead-lettered")
	}
}

// brokenAcks fails every settlement of h's store that acknowledges while
// broken is set, counting them, as a Redis that refuses the XACK would.
func brokenAcks(h *harness) (broken *atomic.Bool, calls *atomic.Int32) {
	broken, calls = new(atomic.Bool), new(atomic.Int32)
	h.stateStore = &hookedState{StateStore: h.state, hook: func(_ context.Context, s invocation.Settlement) error {
		if s.Ack && broken.Load() {
			calls.Add(1)
			return errors.New("injected: XACK failed")
		}
		return nil
	}}
	return broken, calls
}

// docs/delivery.md#invocation-state: the state is switched to terminal
// retention only after its message left the PEL. While the XACK fails the
// hash stays as it is, with no TTL; once the XACK succeeds it is retained.
// (The XACK and the success it follows are one step: while it fails the
// success is not recorded either, and the attempt's lease holds.)
func TestStateIsRetainedOnlyAfterTheAck(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	broken, calls := brokenAcks(h)
	broken.Store(true)
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "failed acks", func() bool { return calls.Load() >= 3 })
	if st := h.hash(id); !strings.HasPrefix(st["users/events.created"], "running:") || st["__terminal"] != "" {
		t.Errorf("state while the XACK fails = %v; want the attempt's lease, not retained", st)
	}
	if ttl := h.ttl(id); ttl != -1*time.Millisecond {
		t.Errorf("state TTL while the XACK fails = %s; want none", ttl)
	}
	if h.pending() != 1 {
		t.Error("message left the PEL although every XACK failed")
	}
	broken.Store(false)
	testutil.WaitFor(t, 10*time.Second, "acked and retained", func() bool { return h.settled() && h.hash(id)["__terminal"] != "" })
	if ttl := h.ttl(id); ttl <= 0 {
		t.Errorf("retained state TTL = %s, want the retention", ttl)
	}
	if st := h.hash(id); st["users/events.created"] != "ok" {
		t.Errorf("state after the ack = %v; want ok", st)
	}
	if n := h.calls.Count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// docs/delivery.md#invocation-state: a hash left un-retained after its
// message left the PEL (here the retention of a missing payload, whose
// reference XAUTOCLAIM cleared, fails) is leaked, never expired early: no
// TTL, its fields kept, until the janitor retains it.
func TestStateLeftUnretainedIsLeakedNotExpired(t *testing.T) {
	h := newHarness(t, map[string]string{"a": staleApp})
	var calls atomic.Int32
	h.stateStore = &hookedState{StateStore: h.state, hook: func(_ context.Context, s invocation.Settlement) error {
		if s.Cleared {
			calls.Add(1)
			return errors.New("injected: retain failed")
		}
		return nil
	}}
	// Read by a consumer that died after its claim; then the entry was
	// deleted.
	id := h.publish("event", `{"k":"ok"}`)
	dead := redisstream.New(h.rc, h.stream, h.group, "dead", redisstream.WithBlock(50*time.Millisecond))
	if msgs, err := dead.Read(t.Context(), 10); err != nil || len(msgs) != 1 {
		t.Fatalf("read = %v, %v", msgs, err)
	}
	key := invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}
	if r := h.state.Claim(t.Context(), []invocation.ClaimRequest{{Key: key, Field: "a/m.ok", Lease: time.Minute, MaxAttempts: 5}}); r[0].Err != nil {
		t.Fatal(r[0].Err)
	}
	if err := h.rc.Do(t.Context(), h.rc.B().Xdel().Key(h.stream).Id(id).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.start("c1", writeTimeout(200*time.Millisecond))
	testutil.WaitFor(t, 5*time.Second, "reference cleared, retention given up", func() bool {
		return h.settled() && strings.Contains(h.logs.String(), "the state is leaked, not expired")
	})
	if calls.Load() == 0 {
		t.Fatal("the retention was never tried")
	}
	if st := h.hash(id); !strings.HasPrefix(st["a/m.ok"], "running:") || st["__terminal"] != "" {
		t.Errorf("leaked state = %v; want its field kept, not retained", st)
	}
	if ttl := h.ttl(id); ttl != -1*time.Millisecond {
		t.Errorf("leaked state TTL = %s; want none (PTTL -1)", ttl)
	}
}

// TestEveryAckPathAppliesTheRetention: a message that leaves the PEL by a
// dead letter, as a malformed message, or as a missing payload whose
// reference is cleared has its state switched to the configured
// retention, a reserved marker and that TTL, or, with retention 0,
// deleted with the XACK (docs/delivery.md#invocation-state).
func TestEveryAckPathAppliesTheRetention(t *testing.T) {
	for _, retention := range []time.Duration{0, 90 * time.Minute} {
		for _, path := range []string{"dead letter", "malformed", "missing payload"} {
			t.Run(fmt.Sprintf("%s/retention %v", path, retention), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, map[string]string{"a": staleApp})
				h.handle("a/m.last", func(context.Context, runtime.Request) error { return errors.New("boom") })
				var id string
				switch path {
				case "dead letter":
					id = h.publish("event", `{"k":"last"}`)
				case "malformed":
					id = h.publish("event", `not json`)
				case "missing payload":
					// Read by a consumer that died after its claim; then
					// the entry was deleted.
					id = h.publish("event", `{"k":"ok"}`)
					dead := redisstream.New(h.rc, h.stream, h.group, "dead", redisstream.WithBlock(50*time.Millisecond))
					if msgs, err := dead.Read(t.Context(), 10); err != nil || len(msgs) != 1 {
						t.Fatalf("read = %v, %v", msgs, err)
					}
					key := invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}
					if r := h.state.Claim(t.Context(), []invocation.ClaimRequest{{Key: key, Field: "a/m.ok", Lease: time.Minute, MaxAttempts: 5}}); r[0].Err != nil {
						t.Fatal(r[0].Err)
					}
					if err := h.rc.Do(t.Context(), h.rc.B().Xdel().Key(h.stream).Id(id).Build()).Error(); err != nil {
						t.Fatal(err)
					}
				}
				startRetention(h, retention)
				testutil.WaitFor(t, 10*time.Second, "the message to leave the PEL", h.settled)
				if path == "missing payload" {
					// XAUTOCLAIM cleared the reference; the retention is the
					// next step.
					testutil.WaitFor(t, 5*time.Second, "the retention", func() bool {
						st, pttl := h.hashOf(id)
						return pttl == -2 || st["__terminal"] != ""
					})
				}
				st, pttl := h.hashOf(id)
				switch {
				case retention == 0 && pttl != -2:
					t.Errorf("state %v (PTTL %dms) after the ack, want it deleted", st, pttl)
				case retention > 0 && (st["__terminal"] == "" || pttl > retention.Milliseconds() || pttl < (retention-time.Minute).Milliseconds()):
					t.Errorf("state %v (PTTL %dms) after the ack, want it retained for %s", st, pttl, retention)
				}
			})
		}
	}
}
