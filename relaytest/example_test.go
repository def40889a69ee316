package relaytest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/relaytest"
)

// A lease that expires counts as a failed attempt, and its owner is fenced
// out: stepped through on a ManualClock, without waiting.
func ExampleStateStore() {
	ctx := context.Background()
	clock := relaytest.NewManualClock(time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC))
	store := relaytest.NewStateStore(relaytest.WithClock(clock))
	key := invocation.Key{Stream: "events", Group: "workers", MessageID: "1700000000000-0"}

	first, _ := store.Claim(ctx, key, "billing/invoices.charge", time.Minute, 2, invocation.Record{})
	fmt.Println(first.Status, first.Lease.Attempt, first.Lease.Deadline.UTC().Format(time.TimeOnly))

	clock.Advance(2 * time.Minute) // the worker died mid-run
	second, _ := store.Claim(ctx, key, "billing/invoices.charge", time.Minute, 2, invocation.Record{})
	fmt.Println(second.Status, second.Lease.Attempt)

	err := store.Finish(ctx, first.Lease) // the first worker comes back
	fmt.Println(errors.Is(err, invocation.ErrStale))

	clock.Advance(2 * time.Minute) // attempt 2 expires too: that was the last
	last, _ := store.Claim(ctx, key, "billing/invoices.charge", time.Minute, 2, invocation.Record{})
	fmt.Println(last.Status, last.Lease.Attempt)
	// Output:
	// claimed 1 10:01:00
	// claimed 2
	// true
	// exhausted 2
}

// Consumer-group delivery in memory: read, let the entry go idle, reclaim it
// from another consumer, acknowledge it.
func ExampleStream() {
	ctx := context.Background()
	clock := relaytest.NewManualClock(time.UnixMilli(1_700_000_000_000))
	s := relaytest.NewStream(relaytest.WithClock(clock))
	c1, c2 := s.Consumer("worker-1"), s.Consumer("worker-2")

	id, _ := s.Publish(ctx, map[string]string{"event": `{"type":"signup"}`})
	msgs, _ := c1.Read(ctx, 10)
	fmt.Println(id, len(msgs), msgs[0].Deliveries)

	clock.Advance(time.Minute) // worker-1 stalls
	msgs, _, _, _ = c2.Reclaim(ctx, time.Minute, 10)
	fmt.Println(msgs[0].ID, msgs[0].Deliveries, s.Pending()[0].Consumer)

	_ = c2.Ack(ctx, id)
	fmt.Println(s.IsPending(id), s.Lag())
	// Output:
	// 1700000000000-0 1 1
	// 1700000000000-0 2 worker-2
	// false 0
}
