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

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestFailingRuleWithoutRetriesIsDeadLetteredOnce(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": billingApp})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("card declined") })
	h.handle("billing/charges.audit", nil)
	h.start("c1")
	event := `{"kind":"charge","amount":12}`
	id := h.publish("event", event)
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })

	// The failing handler must not stop the other matched handler.
	if n := h.calls.Count("billing/charges.audit"); n != 1 {
		t.Errorf("audit ran %d times, want 1", n)
	}
	if n := h.calls.Count("billing/charges.fail"); n != 1 {
		t.Errorf("fail ran %d times, want 1 (retries: 0)", n)
	}
	e := h.dlqEntries()[0]
	if e.App != "billing" || e.Handler != "charges.fail" || e.HandlerAttempts != 1 || e.OriginalID != id ||
		e.Event != event || !strings.Contains(e.Reason, "card declined") || e.Deliveries < 1 {
		t.Errorf("entry = %+v", e)
	}
	testutil.WaitFor(t, 2*time.Second, "retention", func() bool { return h.hash(id)["__terminal"] != "" })
	st := h.hash(id)
	if st["billing/charges.audit"] != "ok" || !strings.HasPrefix(st["billing/charges.fail"], "exhausted:1:") || !strings.HasSuffix(st["billing/charges.fail"], ":dlq") {
		t.Errorf("state = %v", st)
	}
	// Nothing more happens afterwards.
	time.Sleep(500 * time.Millisecond)
	if len(h.dlqEntries()) != 1 || h.calls.Count("billing/charges.fail") != 1 {
		t.Errorf("after ack: %d DLQ entries, %d runs", len(h.dlqEntries()), h.calls.Count("billing/charges.fail"))
	}
}

func TestRetriesThenSucceeds(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	var mu sync.Mutex
	var times []time.Time
	h.handle("users/events.created", func(_ context.Context, req runtime.Request) error {
		mu.Lock()
		times = append(times, time.Now())
		mu.Unlock()
		if req.Attempt < 3 {
			return fmt.Errorf("attempt %d fails", req.Attempt)
		}
		return nil
	})
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 10*time.Second, "ack after retries", func() bool { return h.settled() && h.calls.Count("users/events.created") == 3 })
	runs := h.calls.Get("users/events.created")
	for i, r := range runs {
		if r.Attempt != i+1 {
			t.Errorf("run %d had attempt %d", i, r.Attempt)
		}
	}
	// Each retry waited at least its backoff (200ms, then 400ms).
	mu.Lock()
	defer mu.Unlock()
	if d := times[1].Sub(times[0]); d < 200*time.Millisecond {
		t.Errorf("second attempt after %s, before the 200ms backoff", d)
	}
	if d := times[2].Sub(times[1]); d < 400*time.Millisecond {
		t.Errorf("third attempt after %s, before the 400ms backoff", d)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("a retried success was dead-lettered")
	}
	if got := h.counter("relay_retries_total"); got != 2 {
		t.Errorf("retries_total = %v, want 2", got)
	}
	if h.hash(id)["users/events.created"] != "ok" {
		t.Errorf("state = %v", h.hash(id))
	}
}

func TestExhaustsAfterItsAttemptsAndDeadLettersWithCount(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: relay.local/busybox:latest
events:
  - handler: events.created
    pattern: {event_name: [INSERT]}
    retries: 2
`})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("boom") })
	h.start("c1", backoff(50*time.Millisecond))
	h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "dead letter", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })
	if n := h.calls.Count("users/events.created"); n != 3 {
		t.Errorf("ran %d times, want 3 (retries: 2)", n)
	}
	if e := h.dlqEntries()[0]; e.HandlerAttempts != 3 {
		t.Errorf("handler_attempts = %d, want 3", e.HandlerAttempts)
	}
}

// docs/delivery.md#attempts-retries-backoff: a rule without retries gets
// the default of 4, so 5 attempts in all, each a real run, before its
// message is dead-lettered.
func TestRuleWithoutRetriesGetsFiveAttempts(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}}
`})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("boom") })
	h.start("c1", backoff(20*time.Millisecond))
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 20*time.Second, "dead letter", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })
	runs := h.calls.Get("users/events.created")
	if len(runs) != 5 {
		t.Fatalf("ran %d times, want 5 (default retries 4)", len(runs))
	}
	for i, r := range runs {
		if r.Attempt != i+1 {
			t.Errorf("run %d was attempt %d", i+1, r.Attempt)
		}
	}
	if e := h.dlqEntries()[0]; e.HandlerAttempts != 5 || e.OriginalID != id {
		t.Errorf("entry = %+v, want handler_attempts 5 for %s", e, id)
	}
}

// docs/delivery.md#attempts-retries-backoff: the PEL delivery count is
// diagnostic only. A rule with retries: 0 allows one attempt; deliveries
// that run nothing (the runtime is unavailable) must not use it up, so the
// handler still runs once, and its DLQ entry reports both counts apart.
func TestDeliveryCountIsNotTheRetryDriver(t *testing.T) {
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, retries: 0}
`})
	var down atomic.Bool
	down.Store(true)
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("boom") })
	h.unavailableWhile(&down, "image x not found")
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 5*time.Second, "three deliveries", func() bool { return deliveries(t, h, id) >= 3 })
	if h.calls.Count("users/events.created") != 0 || len(h.dlqEntries()) != 0 || h.pending() != 1 {
		t.Fatal("deliveries without a run ran the handler, dead-lettered or acknowledged the message")
	}
	down.Store(false)
	testutil.WaitFor(t, 10*time.Second, "dead letter", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })
	if runs := h.calls.Get("users/events.created"); len(runs) != 1 || runs[0].Attempt != 1 {
		t.Errorf("runs = %+v, want exactly attempt 1", runs)
	}
	if e := h.dlqEntries()[0]; e.HandlerAttempts != 1 || e.Deliveries < 3 {
		t.Errorf("entry handler_attempts %d, deliveries %d; want 1 and at least 3", e.HandlerAttempts, e.Deliveries)
	}
}

func TestRedeliveryBeforeNextAttemptAtDoesNotRun(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", func(context.Context, runtime.Request) error { return errors.New("fail") })
	// A long backoff with a short reclaim threshold: the message is
	// redelivered many times before its retry is due.
	h.start("c1", backoff(time.Hour), reclaimOnly)
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "first attempt", func() bool { return h.calls.Count("users/events.created") == 1 })
	testutil.WaitFor(t, 5*time.Second, "retry recorded", func() bool {
		return strings.HasPrefix(h.hash(id)["users/events.created"], "next_attempt_at:")
	})
	// Let several reclaims redeliver it (MinPendingIdle is 300ms).
	before := deliveries(t, h, id)
	testutil.WaitFor(t, 5*time.Second, "redeliveries", func() bool { return deliveries(t, h, id) >= before+2 })
	if n := h.calls.Count("users/events.created"); n != 1 {
		t.Errorf("handler ran %d times; a redelivery before next_attempt_at must skip it", n)
	}
	if h.pending() != 1 {
		t.Error("message with a pending retry was acknowledged")
	}
	// docs/delivery.md#invocation-state: however long it stays pending,
	// the state of a pending message has no TTL.
	if ttl := h.ttl(id); ttl != -1*time.Millisecond {
		t.Errorf("state of a pending message has TTL %s, want none", ttl)
	}
}

func TestUnavailableAppKeepsMessagePending(t *testing.T) {
	h := newHarness(t, map[string]string{
		// Valid pattern, invalid elsewhere: the app is unavailable but its
		// rule still matches, so the message must stay pending.
		"broken": `
image: relay.local/busybox:latest
concurrency: 0
events:
  - handler: events.created
    pattern: {event_name: [INSERT]}
`,
		"users": usersApp,
	})
	h.handle("broken/events.created", nil)
	h.handle("users/events.created", nil)
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "available app ran", func() bool { return h.calls.Count("users/events.created") == 1 })
	testutil.WaitFor(t, 5*time.Second, "redelivery", func() bool { return deliveries(t, h, id) >= 2 })
	if h.pending() != 1 {
		t.Error("message matched by an unavailable app was acknowledged")
	}
	if h.calls.Count("broken/events.created") != 0 || len(h.dlqEntries()) != 0 {
		t.Error("unavailable app ran or was dead-lettered")
	}
	// The unavailable app's invocation is recorded with no attempt used, so
	// a redelivery that no longer matches its rule still drives it. A
	// redelivery in progress holds it running:<deadline>:1 between its
	// claim and giving the attempt back: wait for the record.
	var st map[string]string
	testutil.WaitFor(t, 5*time.Second, "the unavailable invocation recorded as due", func() bool {
		st = h.hash(id)
		return strings.HasPrefix(st["broken/events.created"], "next_attempt_at:")
	})
	if st["users/events.created"] != "ok" || attemptsUsed(t, st["broken/events.created"]) != 0 {
		t.Errorf("state = %v", st)
	}
	if h.calls.Count("users/events.created") != 1 {
		t.Error("the succeeded invocation ran again on redelivery")
	}
}

func TestRuntimeUnavailableChargesNoAttempt(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	var down atomic.Bool
	down.Store(true)
	h.handle("users/events.created", nil)
	h.unavailableWhile(&down, "image relay.local/busybox:latest not found")
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "several unavailable deliveries", func() bool { return deliveries(t, h, id) >= 3 })
	if h.pending() != 1 || len(h.dlqEntries()) != 0 {
		t.Fatal("an unavailable app's message was acknowledged or dead-lettered")
	}
	if v := h.hash(id)["users/events.created"]; attemptsUsed(t, v) > 0 {
		t.Errorf("unavailability charged an attempt: %q", v)
	}
	down.Store(false)
	testutil.WaitFor(t, 10*time.Second, "run once available", func() bool { return h.settled() })
	if runs := h.calls.Get("users/events.created"); len(runs) != 1 || runs[0].Attempt != 1 {
		t.Errorf("runs = %+v, want exactly attempt 1", runs)
	}
}

// flakyClaims fails Claim while broken is set, as a Redis outage would.
type flakyClaims struct {
	relay.StateStore
	broken atomic.Bool
}

func (f *flakyClaims) Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult {
	if f.broken.Load() {
		out := make([]invocation.ClaimResult, len(reqs))
		for i := range out {
			out[i].Err = errors.New("injected: state store unreachable")
		}
		return out
	}
	return f.StateStore.Claim(ctx, reqs)
}

// brokenClaimsHarness is a harness of the users app, not started, whose
// claims fail until the test clears flaky.broken.
func brokenClaimsHarness(t *testing.T) (*harness, *flakyClaims) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	flaky := &flakyClaims{StateStore: h.state}
	flaky.broken.Store(true)
	h.stateStore = flaky
	return h, flaky
}

func TestClaimErrorFailsClosed(t *testing.T) {
	h, flaky := brokenClaimsHarness(t)
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "claim failure logged", func() bool {
		return strings.Contains(h.logs.String(), "claim failed; handler not run")
	})
	if h.calls.Count("users/events.created") != 0 {
		t.Fatal("handler ran although its claim failed")
	}
	if h.pending() != 1 {
		t.Fatal("message acknowledged although its claim failed")
	}
	flaky.broken.Store(false)
	testutil.WaitFor(t, 10*time.Second, "run after recovery", func() bool { return h.settled() })
	if runs := h.calls.Get("users/events.created"); len(runs) != 1 || runs[0].Attempt != 1 {
		t.Errorf("runs after recovery = %+v, want one first attempt", runs)
	}
	if h.hash(id)["users/events.created"] != "ok" {
		t.Errorf("state = %v", h.hash(id))
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
			h.calls.Add(req) // it ran, then the runtime lost track of it
			return runtime.Result{}, fmt.Errorf("wait task: %w: connection closed", runtime.ErrOutcomeUnknown)
		}
		return inner.Run(ctx, req)
	})
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 5*time.Second, "first run", func() bool { return h.calls.Count("users/events.created") == 1 })
	if v := h.hash(id)["users/events.created"]; !strings.HasPrefix(v, "running:") {
		t.Fatalf("after an unknown outcome the claim must be kept, got %q", v)
	}
	// The lease (200ms timeout + 500ms grace) expires and counts: the
	// next run is attempt 2.
	testutil.WaitFor(t, 10*time.Second, "ack", func() bool { return h.settled() })
	runs := h.calls.Get("users/events.created")
	if len(runs) != 2 || runs[1].Attempt != 2 {
		t.Errorf("runs = %d (last attempt %d), want 2 with the second as attempt 2", len(runs), runs[len(runs)-1].Attempt)
	}
}

// docs/delivery.md#dead-letter-queue: the entry is written before the
// XACK, in one step with it; while it cannot be written the message stays
// pending, and a redelivery writes it. The settlements that write an
// entry fail for longer than a delivery's writes are retried, so the
// entry can only come from a redelivery.
func TestDLQWriteFailureKeepsMessagePendingUntilWritten(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": `
image: x
events:
  - {handler: charges.fail, pattern: {kind: [charge]}, retries: 0, timeout: 200ms}
  - {handler: charges.audit, pattern: {kind: [charge]}}
`})
	h.handle("billing/charges.fail", func(context.Context, runtime.Request) error { return errors.New("declined") })
	h.handle("billing/charges.audit", nil)
	failed := failDeadLetters(h, func(e dlq.Entry) bool { return e.Deliveries < 2 })
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"kind":"charge"}`)
	testutil.WaitFor(t, 5*time.Second, "a failed write", func() bool { return failed.Load() > 0 })
	if h.pending() != 1 || len(h.dlqEntries()) != 0 {
		t.Fatal("message acknowledged, or an entry written, although the DLQ entry could not be written")
	}
	testutil.WaitFor(t, 10*time.Second, "written on redelivery, then acked", func() bool { return h.settled() })
	es := h.dlqEntries()
	if len(es) != 1 || es[0].OriginalID != id || es[0].Deliveries < 2 {
		t.Errorf("DLQ entries = %+v, want 1 of %s, written on a redelivery", es, id)
	}
	if n := h.calls.Count("billing/charges.fail"); n != 1 {
		t.Errorf("exhausted handler ran %d times, want 1", n)
	}
}

// docs/delivery.md#outcomes: a message is dead-lettered and acknowledged
// when all its unfinished invocations are exhausted, not before. One
// invocation exhausts at once while the other waits for its retry: the
// message stays pending until that retry succeeds, then is acknowledged
// with the one DLQ entry.
func TestExhaustedInvocationWaitsForTheOthersRetry(t *testing.T) {
	h := newHarness(t, map[string]string{"a": `
image: x
events:
  - {handler: h.fail, pattern: {kind: [x]}, retries: 0}
  - {handler: h.retry, pattern: {kind: [x]}, retries: 1}
`})
	h.handle("a/h.fail", func(context.Context, runtime.Request) error { return errors.New("no") })
	h.handle("a/h.retry", func(_ context.Context, req runtime.Request) error {
		if req.Attempt == 1 {
			return errors.New("not yet")
		}
		return nil
	})
	// The retry is due 2s after the first attempt; reclaims come every
	// 300ms, so the message is redelivered while h.fail is exhausted and
	// h.retry not due.
	h.start("c1", backoff(2*time.Second), reclaimOnly)
	id := h.publish("event", `{"kind":"x"}`)
	testutil.WaitFor(t, 5*time.Second, "h.fail exhausted, h.retry not due, then a redelivery or an ack", func() bool {
		st := h.hash(id)
		return strings.HasPrefix(st["a/h.fail"], "exhausted:") && strings.HasPrefix(st["a/h.retry"], "next_attempt_at:") &&
			(deliveries(t, h, id) >= 2 || h.settled())
	})
	if h.pending() != 1 {
		t.Fatal("message acknowledged while one of its invocations waits for a retry")
	}
	if st := h.hash(id); !strings.HasPrefix(st["a/h.retry"], "next_attempt_at:") {
		t.Fatalf("h.retry ran before its backoff: %v", st)
	}
	if ttl := h.ttl(id); ttl != -1*time.Millisecond {
		t.Errorf("state of the pending message has TTL %s, want none", ttl)
	}
	testutil.WaitFor(t, 10*time.Second, "ack after the retry", func() bool { return h.settled() })
	if n, m := h.calls.Count("a/h.fail"), h.calls.Count("a/h.retry"); n != 1 || m != 2 {
		t.Errorf("runs: h.fail %d (want 1), h.retry %d (want 2)", n, m)
	}
	es := h.dlqEntries()
	if len(es) != 1 || es[0].Handler != "h.fail" || es[0].OriginalID != id {
		t.Errorf("DLQ entries = %+v, want one for h.fail", es)
	}
	if st := h.hash(id); st["a/h.retry"] != "ok" || !strings.HasSuffix(st["a/h.fail"], ":dlq") {
		t.Errorf("state = %v", st)
	}
}

func TestTwoAppsBothExhaustWriteOneEntryEach(t *testing.T) {
	h := newHarness(t, map[string]string{
		"a": `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}, retries: 0}
  - {handler: h.two, pattern: {kind: [x]}, retries: 0}
`,
		"b": `
image: x
events:
  - {handler: h.one, pattern: {kind: [{prefix: "x"}]}, retries: 0}
`,
	})
	fail := func(context.Context, runtime.Request) error { return errors.New("no") }
	h.handle("a/h.one", fail)
	h.handle("a/h.two", fail)
	h.handle("b/h.one", fail)
	h.start("c1")
	h.publish("event", `{"kind":"x"}`)
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { return h.settled() })
	got := map[string]int{}
	for _, e := range h.dlqEntries() {
		got[e.App+"/"+e.Handler]++
	}
	want := map[string]int{"a/h.one": 1, "a/h.two": 1, "b/h.one": 1}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("DLQ entries by invocation = %v, want %v", got, want)
	}
}

// docs/delivery.md#dead-letter-queue: a redelivery skips entries already
// written (their :dlq marker) and writes only the missing ones.
func TestRedeliveryWritesOnlyTheMissingDLQEntries(t *testing.T) {
	h := newHarness(t, map[string]string{"a": `
image: x
events:
  - {handler: h.one, pattern: {kind: [x]}, retries: 0, timeout: 200ms}
  - {handler: h.two, pattern: {kind: [x]}, retries: 0, timeout: 200ms}
`})
	fail := func(context.Context, runtime.Request) error { return errors.New("no") }
	h.handle("a/h.one", fail)
	h.handle("a/h.two", fail)
	// h.one's entry is written on the first delivery, before h.two runs;
	// h.two's cannot be written until a redelivery.
	failed := failDeadLetters(h, func(e dlq.Entry) bool { return e.Handler == "h.two" && e.Deliveries < 2 })
	h.start("c1", writeTimeout(200*time.Millisecond))
	id := h.publish("event", `{"kind":"x"}`)
	testutil.WaitFor(t, 10*time.Second, "written on redelivery, then acked", func() bool { return h.settled() && len(h.dlqEntries()) >= 2 })
	if failed.Load() == 0 {
		t.Fatal("h.two's entry was never refused: the redelivery was not exercised")
	}
	got := map[string][]dlq.Entry{}
	for _, e := range h.dlqEntries() {
		got[e.App+"/"+e.Handler] = append(got[e.App+"/"+e.Handler], e)
	}
	if len(got) != 2 || len(got["a/h.one"]) != 1 || len(got["a/h.two"]) != 1 || got["a/h.one"][0].OriginalID != id || got["a/h.two"][0].OriginalID != id {
		t.Fatalf("DLQ entries = %+v, want one each for a/h.one and a/h.two: the redelivery must skip h.one, whose entry is marked written", got)
	}
	if d := got["a/h.two"][0].Deliveries; d < 2 {
		t.Errorf("h.two's entry has deliveries %d; it can only have been written on a redelivery", d)
	}
	if h.calls.Count("a/h.one") != 1 || h.calls.Count("a/h.two") != 1 {
		t.Errorf("runs: h.one %d, h.two %d, want 1 each", h.calls.Count("a/h.one"), h.calls.Count("a/h.two"))
	}
}

// slowClaims holds the reply of every Claim for delay, as a worker stalled
// or a reply held up would, until slow is cleared.
type slowClaims struct {
	relay.StateStore
	slow  atomic.Bool
	delay time.Duration
}

func (s *slowClaims) Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult {
	res := s.StateStore.Claim(ctx, reqs)
	if s.slow.Load() {
		time.Sleep(s.delay)
	}
	return res
}

// TestLateClaimIsGivenBack: a claim that took half the lease grace or
// more to come back is not run (its lease, counted from the claim's
// execution, might end before the run does, and another delivery charge
// the attempt while it runs): it is given back uncharged, the message
// stays pending, and a later delivery whose claim is prompt runs it as
// attempt 1 (docs/delivery.md#leases).
func TestLateClaimIsGivenBack(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	// The harness's lease grace is 500ms.
	slow := &slowClaims{StateStore: h.state, delay: 300 * time.Millisecond}
	slow.slow.Store(true)
	h.stateStore = slow
	h.start("c1")
	id := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 5*time.Second, "late claim given back", func() bool {
		return strings.Contains(h.logs.String(), "attempt given back before it ran")
	})
	if n := h.calls.Count("users/events.created"); n != 0 {
		t.Fatalf("handler ran %d times on a late claim", n)
	}
	if v := h.hash(id)["users/events.created"]; attemptsUsed(t, v) > 0 {
		t.Fatalf("the late claim charged an attempt: %q", v)
	}
	slow.slow.Store(false)
	testutil.WaitFor(t, 10*time.Second, "run once claims are prompt", func() bool { return h.settled() })
	if runs := h.calls.Get("users/events.created"); len(runs) != 1 || runs[0].Attempt != 1 {
		t.Errorf("runs = %+v, want exactly attempt 1", runs)
	}
}

// unavailableWhile makes h's runner fail every Run as the runtime being
// unavailable (runtime.ErrUnavailable, with msg) while down is set, and run
// h's handlers otherwise. Call it after the handlers are registered.
func (h *harness) unavailableWhile(down *atomic.Bool, msg string) {
	inner := runtime.NewFunc(h.handlers)
	h.runner = runnerFunc(func(ctx context.Context, req runtime.Request) (runtime.Result, error) {
		if down.Load() {
			return runtime.Result{}, fmt.Errorf("%s: %w", msg, runtime.ErrUnavailable)
		}
		return inner.Run(ctx, req)
	})
}

// TestRepeatedFailureLoggedOncePerWindow: a failure that hits message
// after message alike (every claim refused, as by a Redis out of memory)
// is logged once at its level; its repeats go to DEBUG, each still with
// its message, and handing the messages over once it is over loses none.
func TestRepeatedFailureLoggedOncePerWindow(t *testing.T) {
	h, flaky := brokenClaimsHarness(t)
	h.start("c1")
	const n = 20
	for range n {
		h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	}
	count := func(level string) int {
		return strings.Count(h.logs.String(), "level="+level+` msg="claim failed; handler not run, message left pending"`)
	}
	testutil.WaitFor(t, 10*time.Second, "every claim failure logged", func() bool {
		return count("ERROR")+count("DEBUG") >= n
	})
	if e := count("ERROR"); e != 1 {
		t.Errorf("%d claim failures at ERROR within the window, want 1; log:\n%s", e, h.logs.String())
	}
	flaky.broken.Store(false)
	testutil.WaitFor(t, 20*time.Second, "every message run once the claims succeed", func() bool {
		return h.calls.Count("users/events.created") == n && h.pending() == 0
	})
}

// TestFailingClaimsPaceTheReads: while every claim fails, the worker reads
// new entries at a pace that backs off instead of moving the whole stream
// into the PEL, where they would only wait and cost Redis memory; once the
// claims succeed again every message runs.
func TestFailingClaimsPaceTheReads(t *testing.T) {
	h, flaky := brokenClaimsHarness(t)
	const n = 200
	for range n {
		h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	}
	h.start("c1")
	testutil.WaitFor(t, 10*time.Second, "a claim failure", func() bool {
		return strings.Contains(h.logs.String(), "claim failed; handler not run")
	})
	time.Sleep(300 * time.Millisecond)
	// Reads already under way when the first failure came, and a read or
	// two after the first delays: far from the whole stream. A slower
	// machine reads fewer, never more.
	if p := h.pending(); p > n/2 {
		t.Errorf("%d of %d entries moved into the PEL while every claim failed; want the reads paced", p, n)
	}
	flaky.broken.Store(false)
	testutil.WaitFor(t, 30*time.Second, "every message run once the claims succeed", func() bool {
		return h.calls.Count("users/events.created") == n && h.pending() == 0
	})
}

// TestLostAttemptIsLoggedWhenCharged (docs/observability.md#logs): the
// "attempt lost" line is written when the claim charges the lost attempt,
// while the attempt that follows runs, not when that attempt ends.
func TestLostAttemptIsLoggedWhenCharged(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": `
image: x
events:
  - {handler: orders.charge, pattern: {kind: [charge]}}
`})
	release := make(chan struct{})
	h.handle("shop/orders.charge", blockUntil(release))
	id := h.publish("event", `{"kind":"charge"}`)
	// A dead worker read the entry and claimed attempt 1; its lease has
	// expired.
	dead := redisstream.New(h.rc, h.stream, h.group, "dead")
	if _, err := dead.Read(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	expired := fmt.Sprintf("running:%d:1:deadtoken", time.Now().Add(-time.Minute).UnixMilli())
	key := keys.Invocation(h.stream, h.group, id)
	if err := h.rc.Do(t.Context(), h.rc.B().Hset().Key(key).FieldValue().FieldValue("shop/orders.charge", expired).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.start("c1")
	testutil.WaitFor(t, 10*time.Second, "attempt 2 running", func() bool { return h.calls.Count("shop/orders.charge") == 1 })
	testutil.WaitFor(t, 5*time.Second, "the attempt lost line while attempt 2 runs", func() bool {
		return strings.Contains(h.logs.String(), "attempt lost")
	})
	line := ""
	for _, l := range strings.Split(h.logs.String(), "\n") {
		if strings.Contains(l, "attempt lost") {
			line = l
		}
	}
	for _, want := range []string{"app=shop", "handler=orders.charge", "lost_attempt=1", "message_id=" + id} {
		if !strings.Contains(line, want) {
			t.Errorf("attempt lost line %q lacks %s", line, want)
		}
	}
	close(release)
	testutil.WaitFor(t, 10*time.Second, "settled", h.settled)
	if n := strings.Count(h.logs.String(), "attempt lost"); n != 1 {
		t.Errorf("%d attempt lost lines, want 1", n)
	}
	if runs := h.calls.Get("shop/orders.charge"); len(runs) != 1 || runs[0].Attempt != 2 {
		t.Errorf("runs = %+v, want attempt 2 alone", runs)
	}
}
