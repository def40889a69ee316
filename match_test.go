package relay_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
)

func TestDispatchOrderIsAppNameThenDeclaration(t *testing.T) {
	h := newHarness(t, map[string]string{
		"zeta":  "image: x\nevents:\n  - {handler: m.z1, pattern: {k: [v]}}\n",
		"alpha": "image: x\nevents:\n  - {handler: m.a2, pattern: {k: [v]}}\n  - {handler: m.a1, pattern: {k: [{exists: true}]}}\n",
	})
	var mu sync.Mutex
	var order []string
	rec := func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		order = append(order, req.App+"/"+req.Handler)
		mu.Unlock()
		return nil
	}
	for _, k := range []string{"zeta/m.z1", "alpha/m.a2", "alpha/m.a1"} {
		h.handle(k, rec)
	}
	h.start("c1")
	h.publish("event", `{"k":"v"}`)
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { return h.settled() })
	mu.Lock()
	defer mu.Unlock()
	if got := strings.Join(order, ","); got != "alpha/m.a2,alpha/m.a1,zeta/m.z1" {
		t.Errorf("order = %s", got)
	}
}

func TestUnreadableTemplateHoldsEveryMessage(t *testing.T) {
	h := newHarness(t, map[string]string{
		"orders": "image: x\nevents:\n  - {handler: o.created, pattern: {t: [order]}}\n  - {handler: o.other, pattern: {t: [other]\n",
		"users":  usersApp,
	})
	if got := h.apps.Incomplete(); len(got) != 1 || got[0] != "orders" {
		t.Fatalf("Incomplete = %v", got)
	}
	h.handle("users/events.created", nil)
	h.start("c1")
	unmatched := h.publish("event", `{"t":"order"}`)
	matched := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	// A malformed message matches no rule, readable or not: it is still
	// dead-lettered and acknowledged at once.
	malformed := h.publish("event", `not json`)
	testutil.WaitFor(t, 5*time.Second, "the available app ran", func() bool { return h.calls.Count("users/events.created") == 1 })
	testutil.WaitFor(t, 5*time.Second, "redeliveries", func() bool { return deliveries(t, h, unmatched) >= 2 && deliveries(t, h, matched) >= 2 })
	if h.pending() != 2 {
		t.Errorf("pending = %d; with an unreadable template nothing matched or unmatched may be acknowledged, a malformed message must be", h.pending())
	}
	if es := h.dlqEntries(); len(es) != 1 || es[0].OriginalID != malformed || es[0].Deliveries != 1 {
		t.Errorf("DLQ entries = %+v, want the malformed message's, written at its first delivery", es)
	}
	if h.calls.Count("users/events.created") != 1 {
		t.Error("a succeeded invocation ran again while its message was held")
	}
	if !strings.Contains(h.logs.String(), "apps have rules that could not be read") {
		t.Error("no startup error names the incomplete app")
	}
}

func TestRuleWithBadHandlerStillMatchesAndHolds(t *testing.T) {
	h := newHarness(t, map[string]string{"orders": "image: x\nevents:\n  - {handler: nodot, pattern: {t: [order]}}\n"})
	if len(h.apps.Incomplete()) != 0 || h.apps.Get("orders").Available() {
		t.Fatal("a readable pattern with a bad handler should be complete but unavailable")
	}
	h.start("c1")
	id := h.publish("event", `{"t":"order"}`)
	testutil.WaitFor(t, 5*time.Second, "redelivery", func() bool { return deliveries(t, h, id) >= 2 })
	if h.pending() != 1 || h.counter("relay_events_unmatched_total") != 0 {
		t.Error("an event matching an unavailable app's rule was treated as unmatched")
	}
}

// docs/delivery.md#from-entry-to-acknowledgement: an unavailable app holds
// only the messages its rules match. Events it does not match are handled
// as if it were not there: acknowledged after the available app's run, or
// as unmatched.
func TestUnavailableAppHoldsOnlyWhatItMatches(t *testing.T) {
	h := newHarness(t, map[string]string{
		"broken": "image: x\nconcurrency: 0\nevents:\n  - {handler: events.deleted, pattern: {event_name: [DELETE]}}\n",
		"users":  usersApp,
	})
	if h.apps.Get("broken").Available() || len(h.apps.Incomplete()) != 0 {
		t.Fatal("the broken app should be readable but unavailable")
	}
	h.handle("broken/events.deleted", nil)
	h.handle("users/events.created", nil)
	h.start("c1")
	h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	h.publish("event", `{"event_name":"UPDATE"}`)
	testutil.WaitFor(t, 5*time.Second, "both acknowledged", func() bool { return h.settled() })
	if h.calls.Count("users/events.created") != 1 || h.calls.Count("broken/events.deleted") != 0 {
		t.Errorf("runs: users %d (want 1), broken %d (want 0)", h.calls.Count("users/events.created"), h.calls.Count("broken/events.deleted"))
	}
	if n := h.counter("relay_events_unmatched_total"); n != 1 {
		t.Errorf("unmatched = %v, want 1", n)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("an event was dead-lettered")
	}
}

// TestRedeliveryDrivesInvocationsTheEventNoLongerMatches: an event is
// classified at its first delivery. Its rule's now() cutoff passes while
// the failed invocation waits for its retry; the redelivery must still run
// the retry rather than acknowledge the message as unmatched and drop the
// invocation (docs/delivery.md#outcomes: a message is acknowledged only
// when every outcome is terminal).
func TestRedeliveryDrivesInvocationsTheEventNoLongerMatches(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.recent, pattern: {at: [{gt: "now()-1s"}]}, retries: 1}
`})
	var failed atomic.Bool
	h.handle("users/events.recent", func(context.Context, runtime.Request) error {
		if !failed.Swap(true) {
			return &runtime.ExitError{Code: 1}
		}
		return nil
	})
	// The retry is due after the cutoff has passed.
	h.start("c1", backoff(1500*time.Millisecond))
	id := h.publish("event", fmt.Sprintf(`{"at":%q}`, time.Now().UTC().Format(time.RFC3339Nano)))
	testutil.WaitFor(t, 10*time.Second, "the message settled", h.settled)

	runs := h.calls.Get("users/events.recent")
	if len(runs) != 2 || runs[1].Attempt != 2 {
		t.Fatalf("runs = %+v, want attempts 1 and 2", runs)
	}
	if got := h.hash(id)["users/events.recent"]; got != "ok" {
		t.Errorf("state = %q, want ok", got)
	}
	if ttl := h.ttl(id); ttl <= 0 {
		t.Errorf("state TTL after the ack = %v, want the retention TTL", ttl)
	}
	wantNeitherUnmatchedNorDLQ(t, h)
}

// wantNeitherUnmatchedNorDLQ fails t if a redelivery was taken for an
// unmatched event or anything was dead-lettered.
func wantNeitherUnmatchedNorDLQ(t *testing.T, h *harness) {
	t.Helper()
	if n := h.counter("relay_events_unmatched_total"); n != 0 {
		t.Errorf("relay_events_unmatched_total = %v, want 0: a redelivery was taken for an unmatched event", n)
	}
	if es := h.dlqEntries(); len(es) != 0 {
		t.Errorf("DLQ entries: %+v, want none", es)
	}
}

// TestUnfinishedInvocationOfARemovedHandlerIsDeadLettered: a handler (or its
// whole app) is removed from the templates while one of its invocations
// waits for a retry. It cannot run any more, and acknowledging the message
// without it would lose the event: the restarted worker dead-letters it,
// attributed to the removed handler, and acknowledges the message. The
// other invocation of the message, finished already, does not run again.
func TestUnfinishedInvocationOfARemovedHandlerIsDeadLettered(t *testing.T) {
	const before = `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}}
  - {handler: h.two, pattern: {kind: [x]}, retries: 3}
`
	for name, after := range map[string]map[string]string{
		"rule removed": {"a": "image: x\nevents:\n  - {handler: h.one, pattern: {kind: [x]}}\n"},
		"app removed":  {"other": "image: x\nevents:\n  - {handler: h.one, pattern: {kind: [y]}}\n"},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, map[string]string{"a": before})
			h.handle("a/h.one", nil)
			h.handle("a/h.two", func(context.Context, runtime.Request) error { return errors.New("transient") })
			stop := h.start("c1", backoff(300*time.Millisecond))
			id := h.publish("event", `{"kind":"x"}`)
			testutil.WaitFor(t, 5*time.Second, "h.two's first attempt", func() bool { return h.calls.Count("a/h.two") == 1 })
			stop()
			if h.pending() != 1 {
				t.Fatalf("pending after the first worker stopped = %d, want 1", h.pending())
			}

			h.apps = apptest.Load(t, after)
			h.reg = prometheus.NewRegistry()
			h.start("c1")
			testutil.WaitFor(t, 10*time.Second, "the message settled", h.settled)

			es := h.dlqEntries()
			if len(es) != 1 {
				t.Fatalf("DLQ entries: %+v, want one for a/h.two", es)
			}
			e := es[0]
			if e.OriginalID != id || e.App != "a" || e.Handler != "h.two" || e.HandlerAttempts != 1 ||
				!strings.Contains(e.Reason, "no longer declares handler") {
				t.Errorf("DLQ entry = %+v, want a/h.two of %s after 1 attempt, reason naming the removed handler", e, id)
			}
			if n := h.calls.Count("a/h.one"); n != 1 {
				t.Errorf("a/h.one ran %d times, want 1: it had succeeded", n)
			}
			if n := h.calls.Count("a/h.two"); n != 1 {
				t.Errorf("a/h.two ran %d times, want 1: it was removed", n)
			}
			if ttl := h.ttl(id); ttl <= 0 {
				t.Errorf("state TTL after the ack = %v, want the retention TTL", ttl)
			}
		})
	}
}

// TestInvocationThatWaitedForASlotSurvivesTheCutoff: a first delivery that
// gave up waiting for a concurrency slot, or whose attempt was given back,
// leaves its invocation recorded, uncharged; its redelivery after the
// rule's now() cutoff still runs it instead of acknowledging the message as
// unmatched (found by a hostile trial).
func TestInvocationThatWaitedForASlotSurvivesTheCutoff(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
concurrency: 1
events:
  - {handler: events.recent, pattern: {at: [{gt: "now()-1s"}]}, retries: 0}
`})
	var slow atomic.Bool
	h.handle("users/events.recent", func(ctx context.Context, req runtime.Request) error {
		if !slow.Swap(true) {
			// Holds the only slot past the other message's first wait,
			// which itself outlasts the cutoff.
			time.Sleep(2500 * time.Millisecond)
		}
		return nil
	})
	h.start("c1", func(tm *timing) { tm.concurrencyWait = 1200 * time.Millisecond })
	at := time.Now().UTC().Format(time.RFC3339Nano)
	first := h.publish("event", fmt.Sprintf(`{"at":%q,"n":1}`, at))
	second := h.publish("event", fmt.Sprintf(`{"at":%q,"n":2}`, at))
	testutil.WaitFor(t, 15*time.Second, "both messages settled", h.settled)

	ran := map[string]int{}
	for _, r := range h.calls.Get("users/events.recent") {
		ran[r.MessageID]++
		if r.Attempt != 1 {
			t.Errorf("%s ran attempt %d, want 1: waiting charged nothing", r.MessageID, r.Attempt)
		}
	}
	if ran[first] != 1 || ran[second] != 1 {
		t.Errorf("runs per message = %v, want one each of %s and %s", ran, first, second)
	}
	wantNeitherUnmatchedNorDLQ(t, h)
}

// TestShutdownRecordsWhatItDoesNotStart: a graceful stop abandons the
// running handler and starts none of the message's later invocations; each
// stays recorded with no attempt used, so the redelivery drives them even
// past the rules' now() cutoff. An invocation whose rule was removed
// meanwhile, never charged an attempt, is dropped with its rule, as an
// event arriving after the change would be unmatched: no DLQ entry, no
// message left pending forever (both found by a hostile trial).
func TestShutdownRecordsWhatItDoesNotStart(t *testing.T) {
	const before = `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}}
  - {handler: h.two, pattern: {kind: [x]}}
`
	h := newHarness(t, map[string]string{"a": before})
	h.handle("a/h.one", func(ctx context.Context, _ runtime.Request) error {
		<-ctx.Done() // abandoned at the shutdown timeout
		return ctx.Err()
	})
	h.handle("a/h.two", nil)
	stop := h.start("c1", shutdownTimeout(200*time.Millisecond))
	id := h.publish("event", `{"kind":"x"}`)
	testutil.WaitFor(t, 5*time.Second, "h.one running", func() bool { return h.calls.Count("a/h.one") == 1 })
	stop()
	st := h.hash(id)
	for _, f := range []string{"a/h.one", "a/h.two"} {
		if !strings.HasPrefix(st[f], "next_attempt_at:") || attemptsUsed(t, st[f]) != 0 {
			t.Errorf("%s after the stop = %q, want recorded with no attempt used", f, st[f])
		}
	}

	// h.one removed, h.two's rule no longer matching the event.
	h.apps = apptest.Load(t, map[string]string{"a": "image: x\nevents:\n  - {handler: h.two, pattern: {kind: [y]}}\n"})
	h.reg = prometheus.NewRegistry()
	h.start("c1")
	testutil.WaitFor(t, 10*time.Second, "the message settled", h.settled)
	if n := h.calls.Count("a/h.two"); n != 1 {
		t.Errorf("h.two ran %d times, want 1: recorded, it runs though the event no longer matches", n)
	}
	if n := h.calls.Count("a/h.one"); n != 1 {
		t.Errorf("h.one ran %d times, want only the abandoned run", n)
	}
	if es := h.dlqEntries(); len(es) != 0 {
		t.Errorf("DLQ entries: %+v, want none", es)
	}
}
