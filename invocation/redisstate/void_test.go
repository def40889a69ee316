package redisstate

import (
	"errors"
	"regexp"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// TestVoidBeforeTheClaimRuns: the claim whose reply the worker gave up for
// lost is still held in the network when Void runs; when it reaches Redis
// it finds its own token and records nothing, so no lease is left to
// expire into a charged attempt. A claim of another delivery then runs the
// same attempt number.
func TestVoidBeforeTheClaimRuns(t *testing.T) {
	for _, tc := range []struct {
		name, seed, wantVoided string
		wantAttempt            int
	}{
		{name: "no state", wantVoided: `^next_attempt_at:\d+:0:lost$`, wantAttempt: 1},
		{name: "due retry", seed: "next_attempt_at:1:2:earlier", wantVoided: `^next_attempt_at:1:2:lost$`, wantAttempt: 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, "lost")
			if tc.seed != "" {
				e.seed(t, map[string]string{testField: tc.seed}, 0)
			}
			if err := e.s.Void(t.Context(), e.lease(1, "lost")); err != nil {
				t.Fatalf("Void: %v", err)
			}
			m, _ := e.state(t)
			if !regexp.MustCompile(tc.wantVoided).MatchString(m[testField]) {
				t.Fatalf("after Void the field is %q, want %s", m[testField], tc.wantVoided)
			}
			voided := m[testField]
			// The late claim, with the voided token.
			if c, err := claimOne(t.Context(), e.s, e.req(time.Minute, 5)); err == nil {
				t.Fatalf("late claim = %+v, want an error", c)
			}
			if m, _ := e.state(t); m[testField] != voided {
				t.Fatalf("the late claim wrote %q", m[testField])
			}
			// Idempotent.
			if err := e.s.Void(t.Context(), e.lease(1, "lost")); err != nil {
				t.Fatalf("second Void: %v", err)
			}
			next := newStoreWithToken(e, "next")
			c, err := claimOne(t.Context(), next, e.req(time.Minute, 5))
			if err != nil || c.Status != invocation.Claimed || c.Lease.Attempt != tc.wantAttempt {
				t.Fatalf("claim after Void = %+v, %v; want attempt %d claimed", c, err, tc.wantAttempt)
			}
		})
	}
}

// TestVoidAfterTheClaimRan: the claim ran and nothing uses its lease; Void
// gives the attempt back uncharged, as Release does, and leaves alone a
// lease that is not the claim's.
func TestVoidAfterTheClaimRan(t *testing.T) {
	e := newEnv(t, "lost")
	e.seed(t, map[string]string{testField: "next_attempt_at:1:1:earlier"}, 0)
	c := mustClaim(t, e, time.Minute, 5)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 2 {
		t.Fatalf("claim = %+v, want attempt 2", c)
	}
	if err := e.s.Void(t.Context(), e.lease(0, "lost")); err != nil {
		t.Fatalf("Void: %v", err)
	}
	m, _ := e.state(t)
	if !regexp.MustCompile(`^next_attempt_at:\d+:1:lost$`).MatchString(m[testField]) {
		t.Fatalf("after Void the field is %q, want attempt 2 given back", m[testField])
	}
	next := newStoreWithToken(e, "next")
	c, err := claimOne(t.Context(), next, e.req(time.Minute, 5))
	if err != nil || c.Status != invocation.Claimed || c.Lease.Attempt != 2 {
		t.Fatalf("claim after Void = %+v, %v; want attempt 2 again", c, err)
	}
	// Another delivery's lease is not the lost claim's.
	if err := e.s.Void(t.Context(), e.lease(0, "lost")); err != nil {
		t.Fatalf("Void: %v", err)
	}
	if m, _ := e.state(t); m[testField] == "" || m[testField][:8] != "running:" {
		t.Fatalf("Void touched another delivery's lease: %q", m[testField])
	}
	e.ack(t, e.key)
	if err := e.s.Void(t.Context(), e.lease(0, "lost")); !errors.Is(err, invocation.ErrTerminal) {
		t.Fatalf("Void of an acknowledged message = %v, want ErrTerminal", err)
	}
}

// newStoreWithToken is a second Store on e's client whose claims get token
// tok.
func newStoreWithToken(e *env, tok string) *Store {
	return New(e.c, WithTokenSource(func() string { return tok }))
}
