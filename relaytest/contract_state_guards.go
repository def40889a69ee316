//go:build relaytest_port
package relaytest

import (
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about what a store refuses or keeps apart:
// writes with another lease or without state, anything after the
// retention switch, the retention TTL, crossed fields and keys, racing
// claims, pins after the first, and ill-formed arguments.

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
	if err := s.h.Store.Finish(t.Context(), c.Lease); err != nil {
		t.Fatalf("finish with the right lease: %v", err)
	}
}

func stateTransitionsWithoutState(t *testing.T, s *stateSuite) {
	s.wantAllStale(t, invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "never-claimed"}, invocation.ErrStale)
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Claimed || got.Lease.Attempt != 1 {
		t.Fatalf("claim after refused writes = %+v, want attempt 1", got)
	}
}

func stateRetainMakesStateInert(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	done := s.claim(t, field, time.Hour, 3)
	if err := s.h.Store.Finish(ctx, done.Lease); err != nil {
		t.Fatal(err)
	}
	live := s.claim(t, otherField, time.Hour, 3)
	s.settle(t, s.key, time.Hour)
	if err := s.h.Store.Retain(ctx, s.key, time.Hour); err != nil { // idempotent
		t.Fatalf("retain again: %v", err)
	}
	for _, f := range []string{field, otherField, "never/claimed"} {
		if got := s.claim(t, f, time.Hour, 3); got.Status != invocation.Terminal {
			t.Errorf("claim %s on a retained hash = %+v, want terminal", f, got)
		}
	}
	// A stale in-memory delivery can change nothing any more.
	s.wantAllStale(t, live.Lease, invocation.ErrTerminal)
	s.wantAllStale(t, done.Lease, invocation.ErrTerminal)
}

func stateFieldsAndKeysAreIndependent(t *testing.T, s *stateSuite) {
	a := s.claim(t, field, time.Hour, 3)
	b := s.claim(t, otherField, time.Hour, 3)
	if a.Status != invocation.Claimed || b.Status != invocation.Claimed || b.Lease.Attempt != 1 {
		t.Fatalf("claims of two fields = %+v, %+v; want both claimed", a, b)
	}
	otherKey := s.other
	c, err := s.h.Store.Claim(t.Context(), otherKey, field, time.Hour, 3, invocation.Record{})
	if err != nil || c.Status != invocation.Claimed || c.Lease.Attempt != 1 || c.Lease.Key != otherKey {
		t.Fatalf("claim on another message = %+v, %v; want claimed attempt 1", c, err)
	}
	// The same lease fields on another key do not fence this one.
	moved := a.Lease
	moved.Key = otherKey
	s.wantErr(t, "finish with the lease moved to another key", invocation.ErrStale, s.h.Store.Finish(t.Context(), moved))
	if err := s.h.Store.Finish(t.Context(), a.Lease); err != nil {
		t.Fatal(err)
	}
	if got := s.claim(t, otherField, time.Hour, 3); got.Status != invocation.Running {
		t.Errorf("claim of the other field = %+v, want still running", got)
	}
	s.settle(t, otherKey, time.Hour)
	if got := s.claim(t, otherField, time.Hour, 3); got.Status != invocation.Running {
		t.Errorf("claim after retaining another message = %+v, want still running", got)
	}
}

func stateConcurrentClaimsHaveOneWinner(t *testing.T, s *stateSuite) {
	const n = 16
	var wg sync.WaitGroup
	results := make([]invocation.Claim, n)
	errs := make([]error, n)
	for i := range n {
		wg.Go(func() {
			results[i], errs[i] = s.h.Store.Claim(t.Context(), s.key, field, time.Hour, 3, invocation.Record{})
		})
	}
	wg.Wait()
	won := 0
	for i := range n {
		switch {
		case errs[i] != nil:
			t.Errorf("claim %d: %v", i, errs[i])
		case results[i].Status == invocation.Claimed:
			won++
		case results[i].Status != invocation.Running:
			t.Errorf("claim %d = %+v, want claimed or running", i, results[i])
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
	if err := s.h.Store.Release(ctx, c.Lease); err != nil {
		t.Fatal(err)
	}
	if v, err := s.h.Store.Pin(ctx, s.key, pin, "after-release"); err != nil || v != got[0] {
		t.Errorf("pin after releasing the only invocation = %q, %v; want %q kept", v, err, got[0])
	}
	for _, bad := range []string{"", "app/handler", "__terminal"} {
		if _, err := s.h.Store.Pin(ctx, s.key, bad, "x"); err == nil {
			t.Errorf("pin of field %q succeeded, want an error (pins take a reserved \"__<name>\" field)", bad)
		}
	}
	s.settle(t, s.key, time.Hour)
	if _, err := s.h.Store.Pin(ctx, s.key, "__other", "x"); !errors.Is(err, invocation.ErrTerminal) {
		t.Errorf("pin on retained state: %v, want ErrTerminal", err)
	}
}

func stateInvalidArguments(t *testing.T, s *stateSuite) {
	ctx := t.Context()
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
		if got, err := s.h.Store.Claim(ctx, s.key, c.field, c.lease, c.maxAttempts, invocation.Record{}); err == nil || isContractErr(err) {
			t.Errorf("claim with %s = %+v, %v; want an argument error", c.name, got, err)
		}
	}
	l := s.claim(t, field, time.Hour, 3).Lease
	if _, err := s.h.Store.ScheduleRetry(ctx, l, -time.Second); err == nil || isContractErr(err) {
		t.Errorf("schedule_retry with a negative backoff: %v, want an argument error", err)
	}
	noAttempt := l
	noAttempt.Attempt = 0
	if err := s.h.Store.Finish(ctx, noAttempt); err == nil || errors.Is(err, invocation.ErrTerminal) {
		t.Errorf("finish of attempt 0: %v, want an error", err)
	}
	if err := s.h.Store.Retain(ctx, s.key, -time.Second); err == nil {
		t.Error("retain with a negative retention succeeded, want an argument error")
	}
	// Nothing was changed by the refused calls.
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Running {
		t.Errorf("claim after refused calls = %+v, want still running", got)
	}
}
