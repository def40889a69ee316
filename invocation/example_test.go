package invocation_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/invocation"
)

// One delivery of one invocation: claim, run, record the outcome.
func ExampleStore_Claim() {
	ctx := context.Background()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store := invocation.New(client)

	key := invocation.Key{Stream: "events", Group: "relay", MessageID: "1700000000000-0"}
	maxAttempts := invocation.DefaultRetries + 1
	c, err := store.Claim(ctx, key, "billing/charge", time.Minute, maxAttempts, invocation.Record{})
	if err != nil {
		log.Fatal(err) // fail closed: do not run the handler
	}
	if c.Status != invocation.Claimed {
		return // running elsewhere, not due, or already decided
	}
	if runHandler() == nil {
		err = store.Finish(ctx, c.Lease)
	} else if c.Lease.Attempt < maxAttempts {
		_, err = store.ScheduleRetry(ctx, c.Lease, invocation.Backoff(invocation.DefaultBackoff, c.Lease.Attempt))
	} else {
		err = store.Exhaust(ctx, c.Lease) // then write the DLQ entry and call MarkDLQ
	}
	if errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
		return // another delivery owns the invocation now
	}
	if err != nil {
		log.Fatal(err)
	}
}

func runHandler() error { return nil }
