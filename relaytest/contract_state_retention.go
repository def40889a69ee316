//go:build relaytest_port
package relaytest

import (
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about a message that left its group's PEL
// (docs/delivery.md#invocation-state): a stale delivery, one that claimed
// before another worker acknowledged the message and held its lease in
// memory, changes nothing afterwards with any retention, and a message
// delivered again by a rewound group is inert while its state is retained
// and handled afresh once that is gone
// (docs/delivery.md#replaying-and-reused-message-ids).

// staleAfterAck claims two invocations, finishes one, lets another worker
// settle the message with retention and then plays the stale delivery:
// every transition with its leases, and new claims, must be inert.
func staleAfterAck(t *testing.T, s *stateSuite, retention time.Duration) {
	ctx := t.Context()
	done := s.claim(t, field, time.Hour, 3)
	if err := s.h.Store.Finish(ctx, done.Lease); err != nil {
		t.Fatal(err)
	}
	live := s.claim(t, otherField, time.Hour, 3)
	s.settle(t, s.key, retention)
	for _, f := range []string{field, otherField, "never/claimed"} {
		if got := s.claim(t, f, time.Hour, 3); got.Status != invocation.Terminal {
			t.Errorf("claim %s after the ack = %+v, want terminal", f, got)
		}
	}
	rec := invocation.Record{Fields: []string{"recorded/late"}, Complete: true}
	if got, err := s.h.Store.Claim(ctx, s.key, "first/late", time.Hour, 3, rec); err != nil || got.Status != invocation.Terminal {
		t.Errorf("recording claim after the ack = %+v, %v; want terminal", got, err)
	}
	s.wantAllStale(t, live.Lease, invocation.ErrTerminal)
	s.wantAllStale(t, done.Lease, invocation.ErrTerminal)
	if _, err := s.h.Store.Pin(ctx, s.key, "__schedule", "late"); !isTerminal(err) {
		t.Errorf("pin after the ack: %v, want ErrTerminal", err)
	}
	if u, err := s.h.Store.Unfinished(ctx, s.key); err != nil || len(u.Fields) != 0 || u.Complete {
		t.Errorf("unfinished after the ack = %+v, %v; want nothing", u, err)
	}
	// The other message, still pending, is unaffected.
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Errorf("claim after the stale transitions = %+v, want terminal", got)
	}
	if c, err := s.h.Store.Claim(ctx, s.other, field, time.Hour, 3, invocation.Record{}); err != nil || c.Status != invocation.Claimed {
		t.Errorf("claim of a pending message = %+v, %v; want claimed", c, err)
	}
}

func stateStaleDeliveryAfterAck(t *testing.T, s *stateSuite) { staleAfterAck(t, s, time.Hour) }

func stateStaleDeliveryAfterAckWithoutRetention(t *testing.T, s *stateSuite) {
	staleAfterAck(t, s, 0)
}

// stateAckedWithoutState: a message acknowledged before any state was
// written (a delivery held in a slot wait) is inert too, and Retain
// creates nothing for it.
func stateAckedWithoutState(t *testing.T, s *stateSuite) {
	s.settle(t, s.key, time.Hour)
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Fatalf("claim after the ack = %+v, want terminal", got)
	}
	s.wantAllStale(t, invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "late"}, invocation.ErrTerminal)
	if s.h.Redeliver == nil {
		return
	}
	s.runsAgain(t, "(Retain of a missing hash creates none)")
}

// stateRetainRefusedWhilePending: the state of a pending message is live,
// so Retain refuses it, with either retention, and changes nothing.
func stateRetainRefusedWhilePending(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	for _, retention := range []time.Duration{0, time.Hour} {
		if err := s.h.Store.Retain(t.Context(), s.key, retention); err == nil || isContractErr(err) {
			t.Errorf("retain (%v) of a pending message: %v, want an error", retention, err)
		}
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Running || !got.RunningUntil.Equal(c.Lease.Deadline) {
		t.Errorf("claim after the refused retains = %+v, want still running", got)
	}
}

// finishAndSettle runs one invocation of key to success and settles the
// message with retention.
func (s *stateSuite) finishAndSettle(t *testing.T, retention time.Duration) {
	t.Helper()
	c := s.claim(t, field, time.Hour, 3)
	if err := s.h.Store.Finish(t.Context(), c.Lease); err != nil {
		t.Fatal(err)
	}
	s.settle(t, s.key, retention)
}

func stateRedeliveredWhileRetained(t *testing.T, s *stateSuite) {
	s.needRedeliver(t)
	s.finishAndSettle(t, time.Hour)
	s.h.Redeliver(t, s.key)
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Errorf("claim of a rewound message with retained state = %+v, want terminal (nothing runs again)", got)
	}
}

func stateRedeliveredAfterDeletion(t *testing.T, s *stateSuite) {
	s.needRedeliver(t)
	s.finishAndSettle(t, 0)
	s.runsAgain(t, "after its state was deleted with the ack")
}

func stateRetentionExpires(t *testing.T, s *stateSuite) {
	s.needRedeliver(t)
	s.finishAndSettle(t, s.h.Short)
	s.h.Advance(t, 2*s.h.Short)
	s.runsAgain(t, "after the retention TTL ran out")
}

func stateRetainDoesNotExtendTTL(t *testing.T, s *stateSuite) {
	s.needRedeliver(t)
	s.finishAndSettle(t, s.h.Short)
	if err := s.h.Store.Retain(t.Context(), s.key, time.Hour); err != nil {
		t.Fatal(err)
	}
	s.h.Advance(t, 2*s.h.Short)
	s.runsAgain(t, "after the first TTL ran out (a second Retain must not extend it)")
}

// runsAgain delivers s.key's message again and expects a claim to start
// attempt 1: it is handled as new, its state being gone.
func (s *stateSuite) runsAgain(t *testing.T, when string) {
	t.Helper()
	s.h.Redeliver(t, s.key)
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Claimed || got.Lease.Attempt != 1 {
		t.Errorf("claim of the message delivered again %s = %+v, want attempt 1", when, got)
	}
}
