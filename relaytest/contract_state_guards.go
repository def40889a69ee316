package relaytest

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about what a store refuses or keeps apart:
// writes with another lease or without state, anything after the
// acknowledgement, crossed fields and keys, racing claims, pins after the
// first, and ill-formed claims and settlements.

func stateFencingRejectsAnotherLease(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	otherToken, otherAttempt := c.Lease, c.Lease
	otherToken.Token += "x"
	otherAttempt.Attempt++
	s.wantAllStale(t, otherToken, invocation.ErrStale)
	s.wantAllStale(t, otherAttempt, invocation.ErrStale)
	got := s.claim(t, field, time.Hour, 3)
	if got.Status != invocation.Running || !got.RunningUntil.Equal(c.Lease.Deadline) {
		t.Fatalf("claim after refused writes = %+v, want the original lease still running", got)
	}
	s.finish(t, c.Lease)
}

func stateTransitionsWithoutState(t *testing.T, s *stateSuite) {
	s.wantAllStale(t, invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "never-claimed"}, invocation.ErrStale)
	if state := s.h.State(t, s.key); len(state) != 0 {
		t.Errorf("refused writes created state %v", state)
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Claimed || got.Lease.Attempt != 1 {
		t.Fatalf("claim after refused writes = %+v, want attempt 1", got)
	}
}

// stateAckMakesStateInert: once another delivery acknowledged the message,
// its state is frozen: claims are Terminal, every transition ErrTerminal,
// and a Cleared settlement (the janitor's) changes nothing more.
func stateAckMakesStateInert(t *testing.T, s *stateSuite) {
	done := s.claim(t, field, time.Hour, 3)
	s.finish(t, done.Lease)
	live := s.claim(t, otherField, time.Hour, 3)
	s.ack(t, s.key, time.Hour)
	if err := s.clear(t, s.key, time.Hour); err != nil { // idempotent
		t.Fatalf("retention again: %v", err)
	}
	for _, f := range []string{field, otherField, "never/claimed"} {
		if got := s.claim(t, f, time.Hour, 3); got.Status != invocation.Terminal || got.NotPending {
			t.Errorf("claim %s on a retained hash = %+v, want terminal, the state retained (NotPending false)", f, got)
		}
	}
	// A stale in-memory delivery can change nothing any more.
	s.wantAllStale(t, live.Lease, invocation.ErrTerminal)
	s.wantAllStale(t, done.Lease, invocation.ErrTerminal)
	if state := s.h.State(t, s.key); state[field] != "ok" || state["__terminal"] != "1" {
		t.Errorf("state after the stale writes = %v, want %s ok and retained", state, field)
	}
}

func stateFieldsAndKeysAreIndependent(t *testing.T, s *stateSuite) {
	a := s.claim(t, field, time.Hour, 3)
	b := s.claim(t, otherField, time.Hour, 3)
	if a.Status != invocation.Claimed || b.Status != invocation.Claimed || b.Lease.Attempt != 1 {
		t.Fatalf("claims of two fields = %+v, %+v; want both claimed", a, b)
	}
	otherKey := s.other
	c := s.claimOf(t, otherKey, field, time.Hour, 3)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 1 || c.Lease.Key != otherKey {
		t.Fatalf("claim on another message = %+v; want claimed attempt 1", c)
	}
	// The same lease fields on another key do not fence this one.
	moved := a.Lease
	moved.Key = otherKey
	s.wantErr(t, "finish with the lease moved to another key", invocation.ErrStale, s.transit(t, finish(moved)).Err)
	s.finish(t, a.Lease)
	if got := s.claim(t, otherField, time.Hour, 3); got.Status != invocation.Running {
		t.Errorf("claim of the other field = %+v, want still running", got)
	}
	if got := s.claimOf(t, otherKey, field, time.Hour, 3); got.Status != invocation.Running {
		t.Errorf("claim on the other message after finishing this one = %+v, want still running", got)
	}
	s.ack(t, otherKey, time.Hour)
	s.wantPending(t, "after acknowledging another message", s.key, true)
	if got := s.claim(t, otherField, time.Hour, 3); got.Status != invocation.Running {
		t.Errorf("claim after acknowledging another message = %+v, want still running", got)
	}
}

func stateConcurrentClaimsHaveOneWinner(t *testing.T, s *stateSuite) {
	const n = 16
	var wg sync.WaitGroup
	results := make([]invocation.ClaimResult, n)
	for i := range n {
		wg.Go(func() {
			results[i] = s.h.Store.Claim(t.Context(), []invocation.ClaimRequest{{Key: s.key, Field: field, Lease: time.Hour, MaxAttempts: 3}})[0]
		})
	}
	wg.Wait()
	won := 0
	for i, r := range results {
		switch {
		case r.Err != nil:
			t.Errorf("claim %d: %v", i, r.Err)
		case r.Status == invocation.Claimed:
			won++
		case r.Status != invocation.Running:
			t.Errorf("claim %d = %+v, want claimed or running", i, r.Claim)
		}
	}
	if won != 1 {
		t.Errorf("%d concurrent claims won, want exactly 1", won)
	}
}

func statePinFirstWriterWins(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	const pin = "__schedule"
	const n = 8
	got := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			v, err := s.h.Store.Pin(ctx, s.key, pin, "value-"+strconv.Itoa(i))
			if err != nil {
				t.Errorf("pin %d: %v", i, err)
			}
			got[i] = v
		})
	}
	wg.Wait()
	if !strings.HasPrefix(got[0], "value-") {
		t.Fatalf("pin returned %q, want one of the values written", got[0])
	}
	for i, v := range got {
		if v != got[0] {
			t.Fatalf("pin %d returned %q, pin 0 %q: every caller must adopt the first value", i, v, got[0])
		}
	}
	if v, err := s.h.Store.Pin(ctx, s.key, pin, "later"); err != nil || v != got[0] {
		t.Errorf("pin after the first = %q, %v; want %q", v, err, got[0])
	}
	// A pin is not an invocation: claims of the message are unaffected.
	c := s.claim(t, field, time.Hour, 1)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 1 {
		t.Fatalf("claim beside a pin = %+v, want attempt 1", c)
	}
	s.release(t, c.Lease)
	if v, err := s.h.Store.Pin(ctx, s.key, pin, "after-release"); err != nil || v != got[0] {
		t.Errorf("pin after releasing the only invocation = %q, %v; want %q kept", v, err, got[0])
	}
	for _, bad := range []string{"", "app/handler", "__terminal"} {
		if _, err := s.h.Store.Pin(ctx, s.key, bad, "x"); err == nil {
			t.Errorf("pin of field %q succeeded, want an error (pins take a reserved \"__<name>\" field)", bad)
		}
	}
	s.ack(t, s.key, time.Hour)
	if _, err := s.h.Store.Pin(ctx, s.key, "__other", "x"); !errors.Is(err, invocation.ErrTerminal) {
		t.Errorf("pin on retained state: %v, want ErrTerminal", err)
	}
}

// stateInvalidClaims: a claim with an ill-formed field, lease or attempts
// is refused, and nothing is written.
func stateInvalidClaims(t *testing.T, s *stateSuite) {
	for _, c := range []struct {
		name        string
		field       string
		lease       time.Duration
		maxAttempts int
	}{
		{"empty field", "", time.Hour, 3},
		{"reserved field", "__terminal", time.Hour, 3},
		{"lease below 1ms", field, 0, 3},
		{"no attempts", field, time.Hour, 0},
	} {
		for _, probe := range []bool{false, true} {
			r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: c.field, Lease: c.lease, MaxAttempts: c.maxAttempts, Probe: probe})
			if r.Err == nil || isContractErr(r.Err) {
				t.Errorf("claim (probe %v) with %s = %+v, %v; want an argument error", probe, c.name, r.Claim, r.Err)
			}
		}
	}
	if state := s.h.State(t, s.key); len(state) != 0 {
		t.Errorf("refused claims wrote %v", state)
	}
}

// stateInvalidSettlements: a settlement that invocation.Settlement.Check
// refuses is refused before anything changes.
func stateInvalidSettlements(t *testing.T, s *stateSuite) {
	l := s.claim(t, field, time.Hour, 3).Lease
	o := s.claim(t, otherField, time.Hour, 3).Lease
	noAttempt := l
	noAttempt.Attempt = 0
	noToken := l
	noToken.Token = ""
	otherMessage := l
	otherMessage.Key = s.other
	e := deadLetter(l)
	for _, c := range []struct {
		name string
		st   invocation.Settlement
	}{
		{"a negative backoff", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{retry(l, -time.Second)}}},
		{"attempt 0", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(noAttempt)}}},
		{"no token", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(noToken)}}},
		{"a lease of another message", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(otherMessage)}}},
		{"one invocation twice", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(l), retry(l, 0)}}},
		{"an exhaust without an entry", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: l}}}},
		{"a dead-letter without an entry", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{{Kind: invocation.DeadLetter, Lease: l}}}},
		{"an unknown kind", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{{Kind: 99, Lease: l, Entry: &e}}}},
		{"an ack beside a retry", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(o), retry(l, 0)}, Ack: true}},
		{"an ack beside a release", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{release(l)}, Ack: true}},
		{"a negative retention", invocation.Settlement{Key: s.key, Ack: true, Retention: -time.Second}},
		{"a retention below 1ms", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{finish(l)}, Ack: true, Retention: time.Microsecond}},
		{"cleared with an ack", invocation.Settlement{Key: s.key, Cleared: true, Ack: true}},
		{"cleared with a transition", invocation.Settlement{Key: s.key, Cleared: true, Transitions: []invocation.Transition{finish(l)}}},
		{"an invalid entry", invocation.Settlement{Key: s.key, Transitions: []invocation.Transition{{Kind: invocation.Exhaust, Lease: l, Entry: &dlq.Entry{}}}}},
	} {
		if r := s.settleOne(t, c.st); r.Err == nil || isContractErr(r.Err) {
			t.Errorf("settlement with %s = %+v; want an argument error", c.name, r)
		}
	}
	// Nothing was changed by the refused settlements.
	s.wantPending(t, "after the refused settlements", s.key, true)
	for _, c := range []struct {
		f string
		l invocation.Lease
	}{{field, l}, {otherField, o}} {
		if got := s.claim(t, c.f, time.Hour, 3); got.Status != invocation.Running || !got.RunningUntil.Equal(c.l.Deadline) {
			t.Errorf("claim of %s after the refused settlements = %+v, want still running", c.f, got)
		}
	}
	if got := s.h.DeadLetters(t, s.key); len(got) != 0 {
		t.Errorf("refused settlements wrote entries: %+v", got)
	}
}
