package relaytest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/relaytest"
)

// TestSettler: what finish_settle.lua and settle.lua do on Redis, the
// Settler does on the fakes. A last success whose lease holds settles its
// message (acknowledged, state retained or deleted); a stale lease, or a
// message no longer pending, changes nothing; a batch answers for each
// lease on its own.
func TestSettler(t *testing.T) {
	ctx := context.Background()
	src := relaytest.NewStream()
	c := src.Consumer("w")
	state := relaytest.NewStateStore(relaytest.WithPending(func(k invocation.Key) bool { return src.IsPending(k.MessageID) }))
	s := relaytest.NewSettler(c, state)
	claim := func() invocation.Lease {
		t.Helper()
		id, err := src.Publish(ctx, map[string]string{"event": "{}"})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Read(ctx, 1); err != nil {
			t.Fatal(err)
		}
		cl, err := state.Claim(ctx, invocation.Key{Stream: "events", Group: "g", MessageID: id}, "app/h", time.Minute, 3, invocation.Record{Complete: true})
		if err != nil || cl.Status != invocation.Claimed {
			t.Fatalf("claim: %+v, %v", cl, err)
		}
		return cl.Lease
	}

	kept, deleted, stale, gone := claim(), claim(), claim(), claim()
	stale.Token = "someone-else"
	if err := c.Ack(ctx, gone.Key.MessageID); err != nil {
		t.Fatal(err)
	}
	errs := s.FinishSettleBatch(ctx, []invocation.Lease{kept, stale, gone}, time.Hour)
	if errs[0] != nil || !errors.Is(errs[1], invocation.ErrStale) || !errors.Is(errs[2], invocation.ErrTerminal) {
		t.Fatalf("batch of a live lease, a stale one and one of a message acknowledged since: %v", errs)
	}
	if src.IsPending(kept.Key.MessageID) || !src.IsPending(stale.Key.MessageID) {
		t.Errorf("after the batch: the settled message pending %v (want false), the stale lease's %v (want true)",
			src.IsPending(kept.Key.MessageID), src.IsPending(stale.Key.MessageID))
	}
	if got := state.Get(kept.Key); got["app/h"] != "ok" || got["__terminal"] != "1" {
		t.Errorf("settled state %v, want ok and retained", got)
	}
	if ttl, ok := state.TTL(kept.Key); !ok || ttl <= 0 || ttl > time.Hour {
		t.Errorf("settled state's TTL %s, %v; want within an hour", ttl, ok)
	}
	if got := state.Get(stale.Key); got["app/h"] == "ok" || got["__terminal"] != "" {
		t.Errorf("a stale lease changed the state: %v", got)
	}

	// Retention 0 deletes the state with the acknowledgement.
	if err := s.FinishSettle(ctx, deleted, 0); err != nil {
		t.Fatal(err)
	}
	if got := state.Get(deleted.Key); len(got) != 0 || src.IsPending(deleted.Key.MessageID) {
		t.Errorf("retention 0: state %v left, pending %v", got, src.IsPending(deleted.Key.MessageID))
	}

	// Settle acknowledges a pending message and retains its state; on one
	// no longer pending it changes nothing.
	if ackErr, retainErr := s.Settle(ctx, stale.Key, time.Hour); ackErr != nil || retainErr != nil {
		t.Fatal(ackErr, retainErr)
	}
	if src.IsPending(stale.Key.MessageID) || state.Get(stale.Key)["__terminal"] != "1" {
		t.Errorf("Settle: pending %v, state %v; want acknowledged and retained", src.IsPending(stale.Key.MessageID), state.Get(stale.Key))
	}
	if ackErr, retainErr := s.Settle(ctx, gone.Key, 0); ackErr != nil || retainErr != nil || len(state.Get(gone.Key)) == 0 {
		t.Errorf("Settle of a message acknowledged elsewhere: %v, %v, state %v; want nothing changed", ackErr, retainErr, state.Get(gone.Key))
	}
	if err := s.FinishSettle(ctx, kept, time.Hour); !errors.Is(err, invocation.ErrTerminal) {
		t.Errorf("FinishSettle again after the settlement: %v, want ErrTerminal", err)
	}
}
