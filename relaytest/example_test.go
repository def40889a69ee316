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
	claim := func() invocation.Claim {
		return store.Claim(ctx, []invocation.ClaimRequest{
			{Key: key, Field: "billing/invoices.charge", Lease: time.Minute, MaxAttempts: 2},
		})[0].Claim
	}

	first := claim()
	fmt.Println(first.Status, first.Lease.Attempt, first.Lease.Deadline.UTC().Format(time.TimeOnly))

	clock.Advance(2 * time.Minute) // the worker died mid-run
	second := claim()
	fmt.Println(second.Status, second.Lease.Attempt, second.Lost)

	// The first worker comes back and settles its success: refused.
	res := store.Settle(ctx, []invocation.Settlement{{Key: key, Ack: true,
		Transitions: []invocation.Transition{{Kind: invocation.Finish, Lease: first.Lease}}}})
	fmt.Println(errors.Is(res[0].Err, invocation.ErrStale))

	clock.Advance(2 * time.Minute) // attempt 2 expires too: that was the last
	last := claim()
	fmt.Println(last.Status, last.Lease.Attempt)
	// Output:
	// claimed 1 10:01:00
	// claimed 2 1
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
