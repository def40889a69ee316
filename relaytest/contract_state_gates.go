package relaytest

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// The cases of a claim's gate (invocation.Gate, docs/flow-control.md): the
// limits a StateStore holds for every worker of a consumer group.

// gated claims f of key with gate and returns the result, failing the
// test on an error.
func (s *stateSuite) gated(t *testing.T, key invocation.Key, lease time.Duration, gate invocation.Gate) invocation.Claim {
	t.Helper()
	r := s.claimReq(t, invocation.ClaimRequest{Key: key, Field: field, Lease: lease, MaxAttempts: 3, Gate: gate})
	if r.Err != nil {
		t.Fatalf("gated claim of %s: %v", key.MessageID, r.Err)
	}
	return r.Claim
}

// wantStatus fails the test unless c has status want.
func wantStatus(t *testing.T, what string, c invocation.Claim, want invocation.Status) {
	t.Helper()
	if c.Status != want {
		t.Fatalf("%s: status %v, want %v (%+v)", what, c.Status, want, c)
	}
}

// wantRecordedDue asserts that field of key's message, which had no
// state before a gate deferred its claim, is recorded due with no attempt
// used, as Record records a message's other invocations, so that a
// redelivery finds it unfinished.
func (s *stateSuite) wantRecordedDue(t *testing.T, what string, key invocation.Key) {
	t.Helper()
	v := s.h.State(t, key)[field]
	var ms int64
	var token string
	if n, _ := fmt.Sscanf(v, "next_attempt_at:%d:0:%s", &ms, &token); n != 2 {
		t.Errorf("%s: %s = %q, want next_attempt_at:<now>:0:<token>", what, field, v)
	}
	u, err := s.h.Store.Unfinished(t.Context(), key)
	if err != nil || !slices.Contains(u.Fields, field) {
		t.Errorf("%s: Unfinished = %+v, %v; want %s listed", what, u, err, field)
	}
}

// stateGateSlots: a gate with slots lets that many attempts of its slot
// key run at once; the next claim is Throttled by "concurrency", with the
// end of the earliest lease as its time, writing nothing; another slot key
// is not held up; and a Finish with the gate gives its slot back.
func stateGateSlots(t *testing.T, s *stateSuite) {
	third := s.h.Deliver(t)
	gate := invocation.Gate{Slots: 2, SlotKey: "customer-1"}
	before := s.h.Now(t)
	first := s.gated(t, s.key, time.Minute, gate)
	wantStatus(t, "first claim", first, invocation.Claimed)
	wantStatus(t, "second claim", s.gated(t, s.other, 2*time.Minute, gate), invocation.Claimed)
	c := s.gated(t, third, time.Minute, gate)
	wantStatus(t, "third claim", c, invocation.Throttled)
	if c.Limit != invocation.LimitConcurrency {
		t.Errorf("throttled by %q, want %q", c.Limit, invocation.LimitConcurrency)
	}
	checkBetween(t, "throttled claim's time (the first lease's end)", c.NextAttemptAt, before.Add(time.Minute), s.h.Now(t).Add(time.Minute))
	s.wantRecordedDue(t, "throttled", third)

	other := s.gated(t, third, time.Minute, invocation.Gate{Slots: 2, SlotKey: "customer-2"})
	wantStatus(t, "claim of another slot key", other, invocation.Claimed)
	s.release(t, other.Lease) // given back without the gate: customer-2's slot stays until its lease ends

	s.apply(t, "finish with the gate", invocation.Transition{Kind: invocation.Finish, Lease: first.Lease, Gate: gate})
	wantStatus(t, "claim after a slot was given back", s.gated(t, third, time.Minute, gate), invocation.Claimed)
}

// stateGateSlotLapsesWithTheLease: the slot of an attempt whose worker
// died comes back when its lease ends, without any transition.
func stateGateSlotLapsesWithTheLease(t *testing.T, s *stateSuite) {
	gate := invocation.Gate{Slots: 1, SlotKey: "k"}
	wantStatus(t, "claim", s.gated(t, s.key, s.h.Short, gate), invocation.Claimed)
	wantStatus(t, "claim while the slot is held", s.gated(t, s.other, time.Minute, gate), invocation.Throttled)
	s.h.Advance(t, s.h.Short)
	wantStatus(t, "claim once the holder's lease ended", s.gated(t, s.other, time.Minute, gate), invocation.Claimed)
}

// stateGateSlotsFollowTheTransitions: Retry and Release with the gate give
// the slot back; a stale transition gives nothing back.
func stateGateSlotsFollowTheTransitions(t *testing.T, s *stateSuite) {
	third := s.h.Deliver(t)
	gate := invocation.Gate{Slots: 1, SlotKey: "k"}
	a := s.gated(t, s.key, time.Minute, gate)
	wantStatus(t, "claim", a, invocation.Claimed)
	stale := a.Lease
	stale.Token = "not-the-token"
	if r := s.transit(t, invocation.Transition{Kind: invocation.Finish, Lease: stale, Gate: gate}); !isContractErr(r.Err) {
		t.Fatalf("stale finish: %v, want ErrStale", r.Err)
	}
	wantStatus(t, "claim after a stale finish", s.gated(t, s.other, time.Minute, gate), invocation.Throttled)

	s.apply(t, "retry with the gate", invocation.Transition{Kind: invocation.Retry, Lease: a.Lease, Backoff: time.Hour, Gate: gate})
	b := s.gated(t, s.other, time.Minute, gate)
	wantStatus(t, "claim after a retry", b, invocation.Claimed)
	s.apply(t, "release with the gate", invocation.Transition{Kind: invocation.Release, Lease: b.Lease, Gate: gate})
	wantStatus(t, "claim after a release", s.gated(t, third, time.Minute, gate), invocation.Claimed)
}

// stateGateThrottleChargesNothing: a claim throttled while the previous
// attempt's lease has expired neither charges that lost attempt nor
// changes the field; the claim that passes the gate charges it, once.
func stateGateThrottleChargesNothing(t *testing.T, s *stateSuite) {
	gate := invocation.Gate{Slots: 1, SlotKey: "k"}
	holder := s.gated(t, s.other, s.h.Short+time.Hour, gate)
	wantStatus(t, "holder's claim", holder, invocation.Claimed)
	wantStatus(t, "ungated claim", s.claim(t, field, s.h.Short, 3), invocation.Claimed)
	running := s.h.State(t, s.key)[field]
	s.h.Advance(t, s.h.Short)
	c := s.gated(t, s.key, time.Minute, gate)
	wantStatus(t, "claim after the lease expired, slot held", c, invocation.Throttled)
	if c.Lost != 0 {
		t.Errorf("throttled claim reported lost attempt %d", c.Lost)
	}
	if got := s.h.State(t, s.key)[field]; got != running {
		t.Errorf("throttled claim changed the field: %q, was %q", got, running)
	}
	s.apply(t, "holder's finish", invocation.Transition{Kind: invocation.Finish, Lease: holder.Lease, Gate: gate})
	c = s.gated(t, s.key, time.Minute, gate)
	wantStatus(t, "claim with the slot free", c, invocation.Claimed)
	if c.Lease.Attempt != 2 || c.Lost != 1 {
		t.Errorf("claim with the slot free: attempt %d, lost %d; want attempt 2 after lost attempt 1", c.Lease.Attempt, c.Lost)
	}
}

// stateGateRate: a rate lets Burst attempts start at once, then one per
// Interval, per rate key; a throttled claim says when its turn comes,
// writes nothing and uses no turn.
func stateGateRate(t *testing.T, s *stateSuite) {
	third, fourth := s.h.Deliver(t), s.h.Deliver(t)
	interval := 2 * s.h.Short
	gate := invocation.Gate{Interval: interval, Burst: 2, RateKey: "tenant-1"}
	before := s.h.Now(t)
	wantStatus(t, "first start", s.gated(t, s.key, time.Minute, gate), invocation.Claimed)
	wantStatus(t, "second start (the burst)", s.gated(t, s.other, time.Minute, gate), invocation.Claimed)
	c := s.gated(t, third, time.Minute, gate)
	wantStatus(t, "third start", c, invocation.Throttled)
	if c.Limit != invocation.LimitRate {
		t.Errorf("throttled by %q, want %q", c.Limit, invocation.LimitRate)
	}
	checkBetween(t, "throttled claim's time (one interval on)", c.NextAttemptAt, before.Add(interval), s.h.Now(t).Add(interval))
	s.wantRecordedDue(t, "throttled", third)
	wantStatus(t, "fourth start", s.gated(t, fourth, time.Minute, gate), invocation.Throttled)
	wantStatus(t, "another rate key", s.gated(t, fourth, time.Minute, invocation.Gate{Interval: interval, Burst: 1, RateKey: "tenant-2"}), invocation.Claimed)

	s.h.Advance(t, interval)
	wantStatus(t, "a start one interval on", s.gated(t, third, time.Minute, gate), invocation.Claimed)
	fifth := s.h.Deliver(t)
	wantStatus(t, "the next start, at once", s.gated(t, fifth, time.Minute, gate), invocation.Throttled)
}

// stateGateDebounce: an event waits its debounce period, Debounced with
// the period's end and nothing written; a newer event with the same key
// supersedes it, durably (a final "superseded:<newer id>" that Unfinished
// no longer lists and later claims report); the newest runs once its own
// period passed; an older event claimed after a newer one is superseded at
// once; another key is not held up.
func stateGateDebounce(t *testing.T, s *stateSuite) {
	older := s.key
	newer := s.other
	period := 2 * s.h.Short
	gate := invocation.Gate{Period: period, DebounceKey: "product-7"}
	before := s.h.Now(t)
	c := s.gated(t, older, time.Minute, gate)
	wantStatus(t, "first claim", c, invocation.Debounced)
	checkBetween(t, "debounced claim's time", c.NextAttemptAt, before.Add(period), s.h.Now(t).Add(period))
	s.wantRecordedDue(t, "debounced", older)
	again := s.gated(t, older, time.Minute, gate)
	wantStatus(t, "claim again within the period", again, invocation.Debounced)
	if !again.NextAttemptAt.Equal(c.NextAttemptAt) {
		t.Errorf("claim again moved the period's end: %v, was %v", again.NextAttemptAt, c.NextAttemptAt)
	}

	wantStatus(t, "newer event's claim", s.gated(t, newer, time.Minute, gate), invocation.Debounced)
	c = s.gated(t, older, time.Minute, gate)
	wantStatus(t, "older event's claim", c, invocation.Superseded)
	if c.SupersededBy != newer.MessageID {
		t.Errorf("superseded by %q, want %q", c.SupersededBy, newer.MessageID)
	}
	if got, want := s.h.State(t, older)[field], "superseded:"+newer.MessageID; got != want {
		t.Errorf("superseded field = %q, want %q", got, want)
	}
	u, err := s.h.Store.Unfinished(t.Context(), older)
	if err != nil || len(u.Fields) != 0 {
		t.Errorf("Unfinished of the superseded message = %+v, %v; want none", u, err)
	}
	wantStatus(t, "claim of the superseded event, ungated", s.claimOf(t, older, field, time.Minute, 3), invocation.Superseded)

	s.h.Advance(t, period)
	wantStatus(t, "newer event's claim after its period", s.gated(t, newer, time.Minute, gate), invocation.Claimed)

	late := s.h.Deliver(t) // newer still: it starts its own period
	wantStatus(t, "a later event's claim", s.gated(t, late, time.Minute, gate), invocation.Debounced)
	wantStatus(t, "another key", s.gated(t, s.h.Deliver(t), time.Minute, invocation.Gate{Period: period, DebounceKey: "product-8"}), invocation.Debounced)
}

// stateGateDebounceOlderArrivesLate: an older event first claimed after a
// newer one of its key was recorded is superseded at once.
func stateGateDebounceOlderArrivesLate(t *testing.T, s *stateSuite) {
	gate := invocation.Gate{Period: time.Minute, DebounceKey: "k"}
	wantStatus(t, "newer event's claim", s.gated(t, s.other, time.Minute, gate), invocation.Debounced)
	c := s.gated(t, s.key, time.Minute, gate)
	wantStatus(t, "older event's first claim", c, invocation.Superseded)
	if c.SupersededBy != s.other.MessageID {
		t.Errorf("superseded by %q, want %q", c.SupersededBy, s.other.MessageID)
	}
}

// stateGateProbePassesNoGate: a probe records the invocation due whatever
// its gate says, and takes no slot.
func stateGateProbePassesNoGate(t *testing.T, s *stateSuite) {
	gate := invocation.Gate{Slots: 1, SlotKey: "k", Period: time.Hour, DebounceKey: "k"}
	r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: field, Lease: time.Minute, MaxAttempts: 3, Probe: true, Gate: gate})
	if r.Err != nil || r.Status != invocation.Probed {
		t.Fatalf("probe: %+v, %v; want Probed", r.Claim, r.Err)
	}
	wantStatus(t, "claim after the probe, no debounce", s.gated(t, s.key, time.Minute, invocation.Gate{Slots: 1, SlotKey: "k"}), invocation.Claimed)
}

// stateWaitingClaimsCarryTheAttempt: Running and NotDue report the attempt
// running and the attempts used, in Lease.Attempt.
func stateWaitingClaimsCarryTheAttempt(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Minute, 3)
	running := s.claim(t, field, time.Minute, 3)
	wantStatus(t, "claim while running", running, invocation.Running)
	if running.Lease.Attempt != 1 {
		t.Errorf("Running: attempt %d, want 1", running.Lease.Attempt)
	}
	s.retry(t, c.Lease, time.Hour)
	notDue := s.claim(t, field, time.Minute, 3)
	wantStatus(t, "claim before the retry is due", notDue, invocation.NotDue)
	if notDue.Lease.Attempt != 1 {
		t.Errorf("NotDue: attempt %d, want 1 (the attempts used)", notDue.Lease.Attempt)
	}
}

// stateInvalidGates: a malformed gate is refused before anything changes.
func stateInvalidGates(t *testing.T, s *stateSuite) {
	for _, g := range []invocation.Gate{
		{Slots: -1},
		{Interval: time.Nanosecond, Burst: 1},
		{Interval: time.Second},
		{Period: time.Microsecond},
		{Period: -time.Second},
	} {
		r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: field, Lease: time.Minute, MaxAttempts: 3, Gate: g})
		if r.Err == nil {
			t.Errorf("gate %+v accepted: %+v", g, r.Claim)
		}
	}
	if v, ok := s.h.State(t, s.key)[field]; ok {
		t.Errorf("refused gates wrote %s = %q", field, v)
	}
}
