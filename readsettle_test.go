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

// batchRecorder is the harness's Store as Settler and BatchSettler, noting
// the message ids of each FinishSettleBatch call and of each FinishSettle.
type batchRecorder struct {
	*invocation.Store
	mu      sync.Mutex
	batches [][]string
	singles []string
}

func (b *batchRecorder) FinishSettle(ctx context.Context, l invocation.Lease, ttl time.Duration) error {
	b.mu.Lock()
	b.singles = append(b.singles, l.Key.MessageID)
	b.mu.Unlock()
	return b.Store.FinishSettle(ctx, l, ttl)
}

func (b *batchRecorder) FinishSettleBatch(ctx context.Context, ls []invocation.Lease, ttl time.Duration) []error {
	ids := make([]string, len(ls))
	for i, l := range ls {
		ids[i] = l.Key.MessageID
	}
	slices.Sort(ids)
	b.mu.Lock()
	b.batches = append(b.batches, ids)
	b.mu.Unlock()
	return b.Store.FinishSettleBatch(ctx, ls, ttl)
}

func (b *batchRecorder) calls() (batches [][]string, singles []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.batches), slices.Clone(b.singles)
}

const settleApp = `
image: x
events:
  - {handler: orders.ok, pattern: {kind: [ok]}}
  - {handler: orders.slow, pattern: {kind: [slow]}}
  - {handler: orders.fail, pattern: {kind: [fail]}}
`

// TestReadSettlesInOneCall (docs/delivery.md#batched-transitions): the
// messages of one read whose last attempts succeed are settled in one
// BatchSettler call, which goes as soon as every other message of the read
// has settled otherwise (a failed attempt, an unmatched event): the linger,
// a minute here, is not waited for. The read of one entry at start
// settles alone.
func TestReadSettlesInOneCall(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": settleApp})
	rec := &batchRecorder{Store: h.state}
	h.settler = rec
	h.handle("shop/orders.ok", nil)
	h.handle("shop/orders.fail", func(context.Context, runtime.Request) error { return runtime.Permanent(errors.New("declined")) })
	first := h.publish("event", `{"kind":"ok"}`)
	var oks []string
	for range 4 {
		oks = append(oks, h.publish("event", `{"kind":"ok"}`))
	}
	h.publish("event", `{"kind":"fail"}`)
	h.publish("event", `{"kind":"none"}`)
	h.start("c1", settleLinger(time.Minute), writeTimeout(5*time.Minute))
	testutil.WaitFor(t, 10*time.Second, "every message settled", h.settled)
	batches, singles := rec.calls()
	if !slices.Equal(singles, []string{first}) || len(batches) != 1 || !slices.Equal(batches[0], oks) {
		t.Errorf("FinishSettle calls %v and batches %v; want %s alone (a read of one) and %v in one batch", singles, batches, first, oks)
	}
	for _, id := range append(oks, first) {
		if st := h.hash(id); st["shop/orders.ok"] != "ok" || st["__terminal"] != "1" {
			t.Errorf("state of %s = %v; want ok, retained", id, st)
		}
	}
}

// TestSlowHandlerDoesNotHoldItsReadsSettlements: a message of the read
// whose handler runs long does not hold the others' acknowledgements for
// longer than the linger; it settles on its own once it ends.
func TestSlowHandlerDoesNotHoldItsReadsSettlements(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": settleApp})
	rec := &batchRecorder{Store: h.state}
	h.settler = rec
	release := make(chan struct{})
	h.handle("shop/orders.ok", nil)
	h.handle("shop/orders.slow", blockUntil(release))
	h.publish("event", `{"kind":"ok"}`) // read alone
	var oks []string
	for range 3 {
		oks = append(oks, h.publish("event", `{"kind":"ok"}`))
	}
	slow := h.publish("event", `{"kind":"slow"}`)
	h.start("c1", settleLinger(500*time.Millisecond))
	testutil.WaitFor(t, 10*time.Second, "all but the slow message settled", func() bool { return h.pending() == 1 })
	if batches, _ := rec.calls(); len(batches) != 1 || !slices.Equal(batches[0], oks) {
		t.Errorf("batches while the slow handler runs: %v; want %v", batches, oks)
	}
	close(release)
	testutil.WaitFor(t, 10*time.Second, "every message settled", h.settled)
	if batches, _ := rec.calls(); len(batches) != 2 || !slices.Equal(batches[1], []string{slow}) {
		t.Errorf("batches: %v; want the slow message's settlement on its own last", batches)
	}
}

// ackRecorder notes the ids of each Ack call of the source it wraps.
type ackRecorder struct {
	relay.StreamSource
	mu    sync.Mutex
	calls [][]string
}

func (a *ackRecorder) Ack(ctx context.Context, ids ...string) error {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	a.mu.Lock()
	a.calls = append(a.calls, sorted)
	a.mu.Unlock()
	return a.StreamSource.Ack(ctx, ids...)
}

func (a *ackRecorder) seen() [][]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}

// TestUnmatchedMessagesOfAReadAreAckedTogether: messages of one read that
// match no rule have no invocation state; they are acknowledged in one
// XACK once every other message of the read has settled, here without
// waiting for the minute-long linger.
func TestUnmatchedMessagesOfAReadAreAckedTogether(t *testing.T) {
	h := newHarness(t, map[string]string{"shop": settleApp})
	rec := &ackRecorder{StreamSource: h.src}
	h.source = rec
	h.handle("shop/orders.ok", nil)
	first := h.publish("event", `{"kind":"none"}`) // read alone
	var none []string
	for range 4 {
		none = append(none, h.publish("event", `{"kind":"none"}`))
	}
	ok := h.publish("event", `{"kind":"ok"}`)
	h.start("c1", settleLinger(time.Minute), writeTimeout(5*time.Minute))
	testutil.WaitFor(t, 10*time.Second, "every message settled", h.settled)
	calls := rec.seen()
	if len(calls) != 3 || !slices.Equal(calls[0], []string{first}) || !slices.Equal(calls[1], none) && !slices.Equal(calls[2], none) {
		t.Errorf("Ack calls %v; want [%s] alone, %v together, and %s (matched: Ack then Retain without a Settler)", calls, first, none, ok)
	}
}
