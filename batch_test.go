package relay_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// callRecorder notes the message ids of each Settle call of the store it
// wraps, sorted. It keeps the store's ClaimVoider.
type callRecorder struct {
	relay.StateStore
	mu    sync.Mutex
	calls [][]string
}

func (c *callRecorder) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	ids := make([]string, len(ss))
	for i, s := range ss {
		ids[i] = s.Key.MessageID
	}
	slices.Sort(ids)
	c.mu.Lock()
	c.calls = append(c.calls, ids)
	c.mu.Unlock()
	return c.StateStore.Settle(ctx, ss)
}

func (c *callRecorder) Void(ctx context.Context, l invocation.Lease) error {
	return c.StateStore.(relay.ClaimVoider).Void(ctx, l)
}

func (c *callRecorder) seen() [][]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.calls)
}

// recordSettles makes h's store a callRecorder.
func recordSettles(h *harness) *callRecorder {
	rec := &callRecorder{StateStore: h.state}
	h.stateStore = rec
	return rec
}

// settleApp's concurrency lets a read's messages run at once: one that
// waits for a slot settles in a batch of its own.
const settleApp = `
image: x
concurrency: 8
events:
  - {handler: orders.ok, pattern: {kind: [ok]}}
  - {handler: orders.slow, pattern: {kind: [slow]}}
  - {handler: orders.fail, pattern: {kind: [fail]}}
`

// inOneCall reports whether one of calls holds every id of want.
func inOneCall(calls [][]string, want []string) bool {
	return slices.ContainsFunc(calls, func(c []string) bool {
		for _, id := range want {
			if !slices.Contains(c, id) {
				return false
			}
		}
		return true
	})
}

// callsHolding is how many of calls hold an id of want, or len(calls)+1
// when some id of want is in none.
func callsHolding(calls [][]string, want []string) int {
	n, seen := 0, map[string]bool{}
	for _, c := range calls {
		holds := false
		for _, id := range c {
			if slices.Contains(want, id) {
				holds, seen[id] = true, true
			}
		}
		if holds {
			n++
		}
	}
	if len(seen) < len(want) {
		return len(calls) + 1
	}
	return n
}

func sorted(ids ...string) []string {
	ids = slices.Clone(ids)
	slices.Sort(ids)
	return ids
}

// TestReadSettlesInOneCall (docs/delivery.md#batched-transitions): the
// messages of one read are settled in one StateStore call, those whose
// last attempts succeed with those that were dead-lettered or matched
// nothing, as soon as every one has: the linger, a minute here, is not
// waited for. The read of one entry at start settles alone.
func TestReadSettlesInOneCall(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": settleApp})
	rec := recordSettles(h)
	h.handle("shop/orders.ok", nil)
	h.handle("shop/orders.fail", func(context.Context, runtime.Request) error { return runtime.Permanent(errors.New("declined")) })
	first := h.publish("event", `{"kind":"ok"}`)
	var oks []string
	for range 4 {
		oks = append(oks, h.publish("event", `{"kind":"ok"}`))
	}
	fail := h.publish("event", `{"kind":"fail"}`)
	none := h.publish("event", `{"kind":"none"}`)
	h.start("c1", settleLinger(time.Minute), writeTimeout(5*time.Minute))
	testutil.WaitFor(t, 10*time.Second, "every message settled", h.settled)
	// The first read takes one entry (the stream was idle), the next the
	// rest, while the first is still in flight: they may share a call. A
	// delivery goroutine the scheduler starts late may miss its read's
	// call (a loaded machine does that), so the rest take two at most:
	// never one call each, and the minute's linger is not waited for.
	if calls, want := rec.seen(), sorted(append(slices.Clone(oks), fail, none)...); callsHolding(calls, want) > 2 {
		t.Errorf("Settle calls %v; want %v in one call, or two at most", calls, want)
	}
	for _, id := range append(oks, first) {
		if st := h.hash(id); st["shop/orders.ok"] != "ok" || st["__terminal"] != "1" {
			t.Errorf("state of %s = %v; want ok, retained", id, st)
		}
	}
	if es := h.dlqEntries(); len(es) != 1 || es[0].OriginalID != fail {
		t.Errorf("DLQ entries %+v; want the failed message's", es)
	}
}

// TestSlowHandlerDoesNotHoldItsReadsSettlements: a message of the read
// whose handler runs long does not hold the others' acknowledgements; it
// settles on its own once it ends.
func TestSlowHandlerDoesNotHoldItsReadsSettlements(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": settleApp})
	rec := recordSettles(h)
	release := make(chan struct{})
	h.handle("shop/orders.ok", nil)
	h.handle("shop/orders.slow", blockUntil(release))
	first := h.publish("event", `{"kind":"ok"}`) // read alone
	var oks []string
	for range 3 {
		oks = append(oks, h.publish("event", `{"kind":"ok"}`))
	}
	slow := h.publish("event", `{"kind":"slow"}`)
	h.start("c1", settleLinger(time.Minute), writeTimeout(5*time.Minute))
	testutil.WaitFor(t, 10*time.Second, "all but the slow message settled", func() bool { return h.pending() == 1 })
	if calls := rec.seen(); !inOneCall(calls, sorted(oks...)) || slices.ContainsFunc(calls, func(c []string) bool { return slices.Contains(c, slow) }) {
		t.Errorf("Settle calls while the slow handler runs: %v; want %v in one call, without %s", calls, sorted(oks...), slow)
	}
	close(release)
	testutil.WaitFor(t, 10*time.Second, "every message settled", h.settled)
	if calls := rec.seen(); !slices.Equal(calls[len(calls)-1], []string{slow}) {
		t.Errorf("Settle calls: %v; want the slow message's settlement on its own last", calls)
	}
	_ = first
}

// TestUnmatchedMessagesOfAReadAreAckedTogether: messages of one read that
// match no rule have no invocation state; they are acknowledged in the
// same call as the read's other settlements, here without waiting for the
// minute-long linger.
func TestUnmatchedMessagesOfAReadAreAckedTogether(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": settleApp})
	rec := recordSettles(h)
	h.handle("shop/orders.ok", nil)
	first := h.publish("event", `{"kind":"none"}`) // read alone
	var none []string
	for range 4 {
		none = append(none, h.publish("event", `{"kind":"none"}`))
	}
	ok := h.publish("event", `{"kind":"ok"}`)
	h.start("c1", settleLinger(time.Minute), writeTimeout(5*time.Minute))
	testutil.WaitFor(t, 10*time.Second, "every message settled", h.settled)
	if calls, want := rec.seen(), sorted(append(slices.Clone(none), ok)...); !inOneCall(calls, want) {
		t.Errorf("Settle calls %v; want %v together", calls, want)
	}
	for _, id := range append(none, first) {
		if st := h.hash(id); len(st) != 0 {
			t.Errorf("state of unmatched %s = %v; want none", id, st)
		}
	}
}
