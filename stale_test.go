package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// staleApp has one handler per way a delivery ends: m.ok succeeds, m.retry
// fails with retries left, m.last fails its only attempt, m.slow holds the
// one concurrency slot and m.held waits for it.
const staleApp = "image: x\nevents:\n" +
	"  - {handler: m.ok, pattern: {k: [ok]}}\n" +
	"  - {handler: m.retry, retries: 2, pattern: {k: [retry]}}\n" +
	"  - {handler: m.last, retries: 0, pattern: {k: [last]}}\n" +
	"  - {handler: m.slow, pattern: {k: [slow]}}\n" +
	"  - {handler: m.held, pattern: {k: [held]}}\n"

// startRetention runs an Engine of h with one concurrency slot, a long
// slot wait and the invocation retention (0: relay.DeleteOnAck).
func startRetention(h *harness, retention time.Duration) {
	h.t.Helper()
	cfg := fastConfig(maxConcurrency(1))
	cfg.ConcurrencyWait = 20 * time.Second
	cfg.Retention = retention
	if retention == 0 {
		cfg.Retention = relay.DeleteOnAck
	}
	cfg.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.Metrics = prometheus.NewRegistry()
	var state relay.StateStore = h.state
	if h.stateStore != nil {
		state = h.stateStore
	}
	e, err := relay.NewEngine(h.apps, relay.Components{
		Source: h.src, State: state, Runner: runtime.NewFunc(h.handlers),
		Stream: h.stream, Group: h.group, Consumer: "c1",
	}, cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	h.run(e)
}

// hashOf returns the invocation hash of message id and its PTTL.
func (h *harness) hashOf(id string) (map[string]string, int64) {
	h.t.Helper()
	key := invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}
	m, err := h.state.Get(context.Background(), key)
	if err != nil {
		h.t.Fatal(err)
	}
	hash := fmt.Sprintf("relay:invocation:%s:%s:%s", h.stream, h.group, id)
	pttl, err := h.rc.Do(context.Background(), h.rc.B().Pttl().Key(hash).Build()).AsInt64()
	if err != nil {
		h.t.Fatal(err)
	}
	return m, pttl
}

// settleElsewhere acknowledges message id as another worker's settlement
// does, with the retention.
func (h *harness) settleElsewhere(id string, retention time.Duration) {
	h.t.Helper()
	key := invocation.Key{Stream: h.stream, Group: h.group, MessageID: id}
	if r := h.state.Settle(context.Background(), []invocation.Settlement{{Key: key, Ack: true, Retention: retention}}); r[0].Err != nil {
		h.t.Fatalf("settle %s: %v", id, r[0].Err)
	}
}

// TestStaleDeliveryRecordsNothing: a delivery whose handler is running when
// another worker acknowledges the message finishes, fails or exhausts
// afterwards, with retention 0 and on: its outcome is refused, no
// dead-letter entry is written, the handler does not run again and the
// state stays as the acknowledgement left it, deleted or retained
// (docs/delivery.md#invocation-state).
func TestStaleDeliveryRecordsNothing(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		for _, kind := range []string{"ok", "retry", "last"} {
			t.Run(fmt.Sprintf("%s/retention %v", kind, retention), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, map[string]string{"a": staleApp})
				started, release := make(chan struct{}), make(chan struct{})
				h.handle("a/m."+kind, func(ctx context.Context, _ runtime.Request) error {
					close(started)
					<-release
					if kind == "ok" {
						return nil
					}
					return errors.New("boom")
				})
				startRetention(h, retention)
				id := h.publish("event", `{"k":"`+kind+`"}`)
				waitClosed(t, started, "the handler to start")
				h.settleElsewhere(id, retention)
				before, ttl := h.hashOf(id)
				close(release)
				testutil.WaitFor(t, 10*time.Second, "the stale outcome to be refused", func() bool {
					return strings.Contains(h.logs.String(), "the message is no longer pending in the consumer group")
				})
				time.Sleep(300 * time.Millisecond) // a few reclaim rounds
				after, ttlAfter := h.hashOf(id)
				if fmt.Sprint(before) != fmt.Sprint(after) || (retention == 0) != (ttlAfter == -2) || ttlAfter > ttl {
					t.Errorf("state %v (PTTL %d) after the stale outcome, was %v (PTTL %d)", after, ttlAfter, before, ttl)
				}
				if n := h.calls.Count("a/m." + kind); n != 1 {
					t.Errorf("handler ran %d times, want 1", n)
				}
				if es := h.dlqEntries(); len(es) != 0 {
					t.Errorf("dead-letter entries %v, want none", es)
				}
				if n := h.pending(); n != 0 {
					t.Errorf("%d pending, want 0", n)
				}
			})
		}
	}
}

// TestStaleDeliveryClaimsNothing: a first delivery waiting for the
// concurrency slot when another worker acknowledges its message then
// claims nothing and runs nothing, and no state appears, with retention 0
// and on; its invocation is Gone (the message is no longer pending), not
// Done.
func TestStaleDeliveryClaimsNothing(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		t.Run(fmt.Sprintf("retention %v", retention), func(t *testing.T) {
			t.Parallel()
			h := newHarness(t, map[string]string{"a": staleApp})
			started, release := make(chan struct{}), make(chan struct{})
			h.handle("a/m.slow", func(ctx context.Context, _ runtime.Request) error {
				close(started)
				<-release
				return nil
			})
			h.handle("a/m.held", nil)
			startRetention(h, retention)
			h.publish("event", `{"k":"slow"}`)
			waitClosed(t, started, "the slow handler to start")
			held := h.publish("event", `{"k":"held"}`)
			testutil.WaitFor(t, 10*time.Second, "the second message to be read", func() bool { return h.pending() == 2 })
			h.settleElsewhere(held, retention)
			close(release)
			testutil.WaitFor(t, 10*time.Second, "both messages to be settled", func() bool {
				return h.settled() && strings.Contains(h.logs.String(), "message acknowledged") &&
					strings.Contains(h.logs.String(), "message no longer pending in the consumer group; nothing to acknowledge")
			})
			if n := h.calls.Count("a/m.held"); n != 0 {
				t.Errorf("the acknowledged message's handler ran %d times, want 0", n)
			}
			if m, pttl := h.hashOf(held); len(m) != 0 || pttl != -2 {
				t.Errorf("state %v (PTTL %d) of the acknowledged message, want none", m, pttl)
			}
			if es := h.dlqEntries(); len(es) != 0 {
				t.Errorf("dead-letter entries %v, want none", es)
			}
		})
	}
}

func waitClosed(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
	}
}

// TestRewindAndReusedIDs: an acknowledged message delivered again — the
// group rewound with XGROUP SETID, destroyed and re-created from 0, or the
// stream re-created with the same id — runs nothing while its state is
// retained, and runs again when the retention is 0
// (docs/delivery.md#replaying-and-reused-message-ids).
func TestRewindAndReusedIDs(t *testing.T) {
	again := map[string]string{
		"setid":    `redis.call('XGROUP', 'SETID', KEYS[1], ARGV[1], '0')`,
		"recreate": `redis.call('XGROUP', 'DESTROY', KEYS[1], ARGV[1]); redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')`,
		"reused id": `redis.call('DEL', KEYS[1]); redis.call('XADD', KEYS[1], ARGV[2], 'event', ARGV[3]);` +
			` redis.call('XGROUP', 'CREATE', KEYS[1], ARGV[1], '0')`,
	}
	for how, script := range again {
		for _, retention := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%s/retention %v", how, retention), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, map[string]string{"a": staleApp})
				h.handle("a/m.ok", nil)
				startRetention(h, retention)
				const event = `{"k":"ok"}`
				id := h.publish("event", event)
				testutil.WaitFor(t, 10*time.Second, "the message to be settled", h.settled)
				err := h.rc.Do(context.Background(), h.rc.B().Eval().Script(script).Numkeys(1).Key(h.stream).
					Arg(h.group, id, event).Build()).Error()
				if err != nil && !rueidis.IsRedisNil(err) {
					t.Fatalf("deliver again (%s): %v", how, err)
				}
				testutil.WaitFor(t, 10*time.Second, "the message to be settled again", func() bool {
					return h.settled() && strings.Count(h.logs.String(), "message acknowledged") >= 2
				})
				want := 1 // retained state: acknowledged again, nothing runs
				if retention == 0 {
					want = 2 // no state: handled as new
				}
				if n := h.calls.Count("a/m.ok"); n != want {
					t.Errorf("handler ran %d times, want %d", n, want)
				}
			})
		}
	}
}

// pauseDeadLetter holds the first settlement of h's store that writes a
// dead-letter entry until release is closed, after closing writing: a
// delivery stalled between finding an invocation exhausted and writing its
// entry.
func pauseDeadLetter(h *harness) (writing, release chan struct{}) {
	writing, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.stateStore = &hookedState{StateStore: h.state, hook: func(_ context.Context, s invocation.Settlement) error {
		if writesEntry(s) {
			once.Do(func() {
				close(writing)
				<-release
			})
		}
		return nil
	}}
	return writing, release
}

// TestStaleDeliveryWritesNoDLQEntry: a delivery that found an invocation
// exhausted (a failed last attempt, a malformed message) and is about to
// write its dead-letter entry when its message leaves the PEL (its
// reference cleared, as a missing payload's is, or acknowledged elsewhere)
// writes no entry, with retention 0 and on: once the message has left the
// PEL a stale delivery can write no DLQ entry
// (docs/delivery.md#invocation-state).
func TestStaleDeliveryWritesNoDLQEntry(t *testing.T) {
	for _, event := range []string{`{"k":"last"}`, `not json`} {
		for _, retention := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%s/retention %v", event, retention), func(t *testing.T) {
				t.Parallel()
				h := newHarness(t, map[string]string{"a": staleApp})
				h.handle("a/m.last", func(context.Context, runtime.Request) error { return errors.New("boom") })
				writing, release := pauseDeadLetter(h)
				startRetention(h, retention)
				id := h.publish("event", event)
				waitClosed(t, writing, "the dead-letter write")
				h.settleElsewhere(id, retention)
				before, ttl := h.hashOf(id)
				close(release)
				testutil.WaitFor(t, 10*time.Second, "the stale write to end", func() bool {
					return strings.Contains(h.logs.String(), "the message is no longer pending in the consumer group")
				})
				time.Sleep(300 * time.Millisecond) // a few reclaim rounds
				if es := h.dlqEntries(); len(es) != 0 {
					t.Errorf("dead-letter entries %+v written after the message left the PEL, want none", es)
				}
				after, ttlAfter := h.hashOf(id)
				if fmt.Sprint(before) != fmt.Sprint(after) || (retention == 0) != (ttlAfter == -2) || ttlAfter > ttl {
					t.Errorf("state %v (PTTL %d) after the stale delivery, was %v (PTTL %d)", after, ttlAfter, before, ttl)
				}
			})
		}
	}
}
