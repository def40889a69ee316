package redisstate_test

import (
	"context"
	"errors"
	"log"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
)

// One delivery of one invocation: claim, run, settle the outcome.
func ExampleStore_Claim() {
	ctx := context.Background()
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	store := redisstate.New(client)

	key := invocation.Key{Stream: "events", Group: "relay", MessageID: "1700000000000-0"}
	maxAttempts := invocation.DefaultRetries + 1
	r := store.Claim(ctx, []invocation.ClaimRequest{
		{Key: key, Field: "billing/charge", Lease: time.Minute, MaxAttempts: maxAttempts},
	})[0]
	if r.Err != nil {
		log.Fatal(r.Err) // fail closed: do not run the handler
	}
	if r.Status != invocation.Claimed {
		return // running elsewhere, not due, or already decided
	}
	// The message's only invocation: a success or an exhaustion ends it,
	// so the same settlement acknowledges the message.
	st := invocation.Settlement{Key: key, Retention: invocation.DefaultRetention}
	switch {
	case runHandler() == nil:
		st.Transitions = []invocation.Transition{{Kind: invocation.Finish, Lease: r.Lease}}
		st.Ack = true
	case r.Lease.Attempt < maxAttempts:
		st.Transitions = []invocation.Transition{{Kind: invocation.Retry, Lease: r.Lease,
			Backoff: invocation.Backoff(invocation.DefaultBackoff, r.Lease.Attempt)}}
	default:
		st.Transitions = []invocation.Transition{{Kind: invocation.Exhaust, Lease: r.Lease, Entry: &dlq.Entry{
			OriginalID: key.MessageID, Group: key.Group, Consumer: "worker-1", Event: `{"id":1}`,
			Reason: "exit code 1", App: "billing", Handler: "charge", Deliveries: 5,
			HandlerAttempts: r.Lease.Attempt, Timestamp: time.Now(),
		}}}
		st.Ack = true
	}
	err = store.Settle(ctx, []invocation.Settlement{st})[0].Err
	if errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
		return // another delivery owns the invocation now
	}
	if err != nil {
		log.Fatal(err)
	}
}

func runHandler() error { return nil }
