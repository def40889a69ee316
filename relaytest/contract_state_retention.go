package relaytest

import (
	"maps"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about a message that left its group's PEL
// (docs/delivery.md#invocation-state): a stale delivery, one that claimed
// before another worker acknowledged the message and held its lease in
// memory, changes nothing afterwards with any retention; a message never
// delivered is as inert; a Cleared settlement applies the retention only
// once the message left; and a message delivered again by a rewound group
// is inert while its state is retained and handled afresh once that is
// gone (docs/delivery.md#replaying-and-reused-message-ids).

// staleAfterAck claims two invocations, finishes one, lets another worker
// acknowledge the message with retention and then plays the stale
// delivery: every transition with its leases, and new claims, must be
// inert.
func staleAfterAck(t *testing.T, s *stateSuite, retention time.Duration) {
	ctx := t.Context()
	done := s.claim(t, field, time.Hour, 3)
	s.finish(t, done.Lease)
	live := s.claim(t, otherField, time.Hour, 3)
	s.ack(t, s.key, retention)
	s.wantPending(t, "after the ack", s.key, false)
	before := s.h.State(t, s.key)
	for _, f := range []string{field, otherField, "never/claimed"} {
		if got := s.claim(t, f, time.Hour, 3); got.Status != invocation.Terminal {
			t.Errorf("claim %s after the ack = %+v, want terminal", f, got)
		}
		probe := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: f, Lease: time.Hour, MaxAttempts: 3, Probe: true})
		if probe.Err != nil || probe.Status != invocation.Terminal {
			t.Errorf("probe %s after the ack = %+v, %v; want terminal", f, probe.Claim, probe.Err)
		}
	}
	rec := invocation.Record{Fields: []string{"recorded/late"}, Complete: true}
	if got := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: "first/late", Lease: time.Hour, MaxAttempts: 3, Record: rec}); got.Err != nil || got.Status != invocation.Terminal {
		t.Errorf("recording claim after the ack = %+v, %v; want terminal", got.Claim, got.Err)
	}
	s.wantAllStale(t, live.Lease, invocation.ErrTerminal)
	s.wantAllStale(t, done.Lease, invocation.ErrTerminal)
	s.wantErr(t, "ack again", invocation.ErrTerminal, s.settleOne(t, invocation.Settlement{Key: s.key, Ack: true, Retention: retention}).Err)
	if _, err := s.h.Store.Pin(ctx, s.key, "__schedule", "late"); !isTerminal(err) {
		t.Errorf("pin after the ack: %v, want ErrTerminal", err)
	}
	if u, err := s.h.Store.Unfinished(ctx, s.key); err != nil || len(u.Fields) != 0 || u.Complete {
		t.Errorf("unfinished after the ack = %+v, %v; want nothing", u, err)
	}
	if after := s.h.State(t, s.key); !maps.Equal(after, before) {
		t.Errorf("the stale delivery changed the state from %v to %v", before, after)
	}
	if got := s.h.DeadLetters(t, s.key); len(got) != 0 {
		t.Errorf("the stale delivery wrote entries: %+v", got)
	}
	// The other message, still pending, is unaffected.
	if c := s.claimOf(t, s.other, field, time.Hour, 3); c.Status != invocation.Claimed {
		t.Errorf("claim of a pending message = %+v; want claimed", c)
	}
}

func stateStaleDeliveryAfterAck(t *testing.T, s *stateSuite) { staleAfterAck(t, s, time.Hour) }

func stateStaleDeliveryAfterAckWithoutRetention(t *testing.T, s *stateSuite) {
	staleAfterAck(t, s, 0)
}

// stateAckedWithoutState: a message acknowledged before any state was
// written (a delivery held in a slot wait) is inert too, and the ack's
// retention creates nothing for it.
func stateAckedWithoutState(t *testing.T, s *stateSuite) {
	s.ack(t, s.key, time.Hour)
	if state := s.h.State(t, s.key); len(state) != 0 {
		t.Errorf("the ack of a message without state created %v", state)
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Fatalf("claim after the ack = %+v, want terminal", got)
	}
	s.wantAllStale(t, invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "late"}, invocation.ErrTerminal)
	if s.h.Redeliver == nil {
		return
	}
	s.runsAgain(t, "(the retention of a missing hash creates none)")
}

// stateUndeliveredMessageIsInert: a message that is in no PEL, never
// delivered or never added, is as inert as one acknowledged: its claims
// are Terminal and its settlements ErrTerminal, and nothing is written,
// no dead-letter entry either.
func stateUndeliveredMessageIsInert(t *testing.T, s *stateSuite) {
	never := invocation.Key{Stream: s.key.Stream, Group: s.key.Group, MessageID: "1-1"}
	if got := s.claimOf(t, never, field, time.Hour, 3); got.Status != invocation.Terminal || !got.NotPending {
		t.Errorf("claim of a message never delivered = %+v, want terminal and NotPending", got)
	}
	s.wantAllStale(t, invocation.Lease{Key: never, Field: field, Attempt: 1, Token: "never"}, invocation.ErrTerminal)
	s.wantErr(t, "ack of a message never delivered", invocation.ErrTerminal,
		s.settleOne(t, invocation.Settlement{Key: never, Ack: true, Retention: time.Hour}).Err)
	s.wantErr(t, "stateless ack of a message never delivered", invocation.ErrTerminal,
		s.settleOne(t, invocation.Settlement{Key: never, Ack: true, Stateless: true}).Err)
	if state := s.h.State(t, never); len(state) != 0 {
		t.Errorf("state of a message never delivered = %v, want none", state)
	}
	if got := s.h.DeadLetters(t, never); len(got) != 0 {
		t.Errorf("entries of a message never delivered: %+v", got)
	}
}

// stateClearedRefusedWhilePending: the state of a pending message is live,
// so a Cleared settlement is refused, with either retention, and changes
// nothing.
func stateClearedRefusedWhilePending(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	for _, retention := range []time.Duration{0, time.Hour} {
		if err := s.clear(t, s.key, retention); err == nil || isContractErr(err) {
			t.Errorf("cleared settlement (%v) of a pending message: %v, want an error", retention, err)
		}
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Running || !got.RunningUntil.Equal(c.Lease.Deadline) {
		t.Errorf("claim after the refused settlements = %+v, want still running", got)
	}
	if state := s.h.State(t, s.key); state["__terminal"] != "" {
		t.Errorf("state after the refused settlements = %v, want it not retained", state)
	}
	s.wantPending(t, "after the refused settlements", s.key, true)
}

// stateClearedRetainsOnceTheMessageLeft: once the message's PEL reference
// is cleared, a Cleared settlement retains its state (or deletes it, at
// retention 0) and creates none where there is none.
func stateClearedRetainsOnceTheMessageLeft(t *testing.T, s *stateSuite) {
	for _, c := range []struct {
		key       invocation.Key
		retention time.Duration
	}{{s.key, time.Hour}, {s.other, 0}} {
		s.claimOf(t, c.key, field, time.Hour, 3)
		s.h.Ack(t, c.key)
		if err := s.clear(t, c.key, c.retention); err != nil {
			t.Fatalf("cleared settlement (%v): %v", c.retention, err)
		}
		state := s.h.State(t, c.key)
		if c.retention > 0 && (state["__terminal"] != "1" || state[field] == "") {
			t.Errorf("state after a cleared settlement (%v) = %v, want it retained", c.retention, state)
		}
		if c.retention == 0 && len(state) != 0 {
			t.Errorf("state after a cleared settlement at retention 0 = %v, want none", state)
		}
		if got := s.claimOf(t, c.key, field, time.Hour, 3); got.Status != invocation.Terminal {
			t.Errorf("claim after a cleared settlement = %+v, want terminal", got)
		}
	}
	stateless := s.h.Deliver(t)
	s.h.Ack(t, stateless)
	if err := s.clear(t, stateless, time.Hour); err != nil {
		t.Fatalf("cleared settlement of a message without state: %v", err)
	}
	if state := s.h.State(t, stateless); len(state) != 0 {
		t.Errorf("a cleared settlement created state %v", state)
	}
}

// finishAndSettle runs one invocation of key to success and settles the
// message, with the ack, with retention.
func (s *stateSuite) finishAndSettle(t *testing.T, retention time.Duration) {
	t.Helper()
	c := s.claim(t, field, time.Hour, 3)
	if r := s.settleOne(t, invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(c.Lease)}, Ack: true, Retention: retention}); r.Err != nil {
		t.Fatalf("finish with the ack: %v", r.Err)
	}
}

func stateRedeliveredWhileRetained(t *testing.T, s *stateSuite) {
	s.needRedeliver(t)
	s.finishAndSettle(t, time.Hour)
	s.h.Redeliver(t, s.key)
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
		t.Errorf("claim of a rewound message with retained state = %+v, want terminal (nothing runs again)", got)
	}
	if got := s.transit(t, finish(invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "rewound"})); !isTerminal(got.Err) {
		t.Errorf("transition on a rewound message with retained state: %v, want ErrTerminal", got.Err)
	}
	// Its redelivery is acknowledged again, without transitions.
	s.ack(t, s.key, time.Hour)
	s.wantPending(t, "the rewound message after its ack", s.key, false)
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

func stateSecondRetentionDoesNotExtendTTL(t *testing.T, s *stateSuite) {
	s.needRedeliver(t)
	s.finishAndSettle(t, s.h.Short)
	if err := s.clear(t, s.key, time.Hour); err != nil {
		t.Fatal(err)
	}
	s.h.Advance(t, 2*s.h.Short)
	s.runsAgain(t, "after the first TTL ran out (a second retention must not extend it)")
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
