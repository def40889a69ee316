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

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// failingAck fails the first Ack of each id, as if the worker crashed
// after the DLQ write and before the XACK.
type failingAck struct {
	relay.StreamSource
	mu     sync.Mutex
	failed map[string]bool
}

func (f *failingAck) Ack(ctx context.Context, ids ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, id := range ids {
		if !f.failed[id] {
			f.failed[id] = true
			return errors.New("injected: crash before XACK")
		}
	}
	return f.StreamSource.Ack(ctx, ids...)
}

func TestDLQWriteIsIdempotentAcrossCrashBeforeAck(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("declined") })
	h.handle("billing/charges.audit", nil)
	h.source = &failingAck{StreamSource: h.src, failed: map[string]bool{}}
	h.start("c1")
	h.publish("event", `{"kind":"charge"}`)
	testutil.WaitFor(t, 10*time.Second, "ack on redelivery", func() bool { return h.settled() })
	if n := len(h.dlqEntries()); n != 1 {
		t.Errorf("%d DLQ entries after a crash between DLQ write and ack, want 1", n)
	}
	if h.calls.Count("billing/charges.fail") != 1 || h.calls.Count("billing/charges.audit") != 1 {
		t.Errorf("handlers ran again on redelivery: fail %d, audit %d", h.calls.Count("billing/charges.fail"), h.calls.Count("billing/charges.audit"))
	}
}

// countingSettler counts the calls of each Settler method.
type countingSettler struct {
	relay.Settler
	settles, finishSettles atomic.Int32
}

func (c *countingSettler) Settle(ctx context.Context, key invocation.Key, ttl time.Duration) (error, error) {
	c.settles.Add(1)
	return c.Settler.Settle(ctx, key, ttl)
}

func (c *countingSettler) FinishSettle(ctx context.Context, l invocation.Lease, ttl time.Duration) error {
	c.finishSettles.Add(1)
	return c.Settler.FinishSettle(ctx, l, ttl)
}

// TestLastSuccessSettlesTheMessage: the success of a message's last
// invocation, after terminal ones, is recorded with its acknowledgement and
// retention in one step (Settler.FinishSettle); a message whose last
// invocation fails and is dead-lettered is settled afterwards (Settle).
func TestLastSuccessSettlesTheMessage(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}}
  - {handler: events.audited, pattern: {event_name: [INSERT]}}
  - {handler: events.failed, pattern: {event_name: [FAIL]}, retries: 0}
`})
	cs := &countingSettler{Settler: h.state}
	h.settler = cs
	h.handle("users/events.created", nil)
	h.handle("users/events.audited", nil)
	h.handle("users/events.failed", func(context.Context, runtime.Request) error { return errors.New("no") })
	h.start("c1")
	ok := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "settled", h.settled)
	if n, m := cs.finishSettles.Load(), cs.settles.Load(); n != 1 || m != 0 {
		t.Fatalf("FinishSettle %d, Settle %d; want the second invocation's success to settle the message alone", n, m)
	}
	st := h.hash(ok)
	if st["users/events.created"] != "ok" || st["users/events.audited"] != "ok" || st["__terminal"] != "1" {
		t.Errorf("state = %v, want both ok and retained", st)
	}
	h.publish("event", `{"event_name":"FAIL"}`)
	testutil.WaitFor(t, 10*time.Second, "settled", h.settled)
	if n, m := cs.finishSettles.Load(), cs.settles.Load(); n != 1 || m != 1 {
		t.Errorf("after a dead-lettered message: FinishSettle %d, Settle %d; want 1, 1", n, m)
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
	h.start("c1")
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

// brokenAck fails every Ack while broken is set, counting the calls.
type brokenAck struct {
	relay.StreamSource
	broken atomic.Bool
	calls  atomic.Int32
}

func (b *brokenAck) Ack(ctx context.Context, ids ...string) error {
	if b.broken.Load() {
		b.calls.Add(1)
		return errors.New("injected: XACK failed")
	}
	return b.StreamSource.Ack(ctx, ids...)
}

// brokenRetain fails every Retain, as a crash between XACK and Retain
// would leave it.
type brokenRetain struct {
	relay.StateStore
	calls atomic.Int32
}

func (b *brokenRetain) Retain(context.Context, invocation.Key, time.Duration) error {
	b.calls.Add(1)
	return errors.New("injected: retain failed")
}

// docs/delivery.md#invocation-state: the state is switched to terminal
// retention only after its message left the PEL. While the XACK fails the
// hash stays as it is, with no TTL; once the XACK succeeds it is retained.
func TestStateIsRetainedOnlyAfterTheAck(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	src := &brokenAck{StreamSource: h.src}
	src.broken.Store(true)
	h.source = src
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "failed acks", func() bool { return src.calls.Load() >= 3 })
	if st := h.hash(id); st["users/events.created"] != "ok" || st["__terminal"] != "" {
		t.Errorf("state while the XACK fails = %v; want ok, not retained", st)
	}
	if ttl := h.ttl(id); ttl != -1*time.Millisecond {
		t.Errorf("state TTL while the XACK fails = %s; want none", ttl)
	}
	if h.pending() != 1 {
		t.Error("message left the PEL although every XACK failed")
	}
	src.broken.Store(false)
	testutil.WaitFor(t, 10*time.Second, "acked and retained", func() bool { return h.settled() && h.hash(id)["__terminal"] != "" })
	if ttl := h.ttl(id); ttl <= 0 {
		t.Errorf("retained state TTL = %s, want the retention", ttl)
	}
	if n := h.calls.Count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// docs/delivery.md#invocation-state: a hash left un-retained after its
// message's XACK (a crash in the ACK→retain window) is leaked, never
// expired early: no TTL, its outcome kept.
func TestStateLeftUnretainedIsLeakedNotExpired(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	store := &brokenRetain{StateStore: h.state}
	h.stateStore = store
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "acked, retention given up", func() bool {
		return h.settled() && strings.Contains(h.logs.String(), "the state is leaked, not expired")
	})
	if store.calls.Load() == 0 {
		t.Fatal("Retain was never called")
	}
	if st := h.hash(id); st["users/events.created"] != "ok" || st["__terminal"] != "" {
		t.Errorf("leaked state = %v; want ok, not retained", st)
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
					dead := stream.New(h.rc, h.stream, h.group, "dead", stream.WithBlock(50*time.Millisecond))
					if msgs, err := dead.Read(t.Context(), 10); err != nil || len(msgs) != 1 {
						t.Fatalf("read = %v, %v", msgs, err)
					}
					key := invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}
					if _, err := h.state.Claim(t.Context(), key, "a/m.ok", time.Minute, 5, invocation.Record{}); err != nil {
						t.Fatal(err)
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
