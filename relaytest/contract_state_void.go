package relaytest

import (
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about relay.ClaimVoider, skipped for a store that
// is not one: a claim whose outcome the Engine did not learn is given back
// knowing only its Key, Field and Token, whether it ran before Void or
// arrives after it, and no lease is left whose expiry charges an attempt
// (docs/delivery.md#lost-replies).

// voider returns the store as a relay.ClaimVoider, or skips the case.
func (s *stateSuite) voider(t *testing.T) relay.ClaimVoider {
	t.Helper()
	v, ok := s.h.Store.(relay.ClaimVoider)
	if !ok {
		t.Skip("the store is not a relay.ClaimVoider")
	}
	return v
}

// lostClaim is what the Engine knows of a claim whose reply was lost
// (invocation.ClaimUnknownError): no attempt, no deadline.
func lostClaim(key invocation.Key, f, token string) invocation.Lease {
	return invocation.Lease{Key: key, Field: f, Token: token}
}

// stateVoidAfterTheClaimRan: the claim ran and its lease is unused; Void
// gives the attempt back uncharged, so the lease's expiry charges nothing
// and the next claim runs the same attempt. Void is idempotent and leaves
// the next delivery's lease alone.
func stateVoidAfterTheClaimRan(t *testing.T, s *stateSuite) {
	v := s.voider(t)
	ctx := t.Context()
	first := s.claim(t, field, s.h.Short, 3)
	s.retry(t, first.Lease, 0)
	lost := s.claim(t, field, s.h.Short, 3)
	if lost.Status != invocation.Claimed || lost.Lease.Attempt != 2 {
		t.Fatalf("claim after a due retry = %+v, want attempt 2", lost)
	}
	if err := v.Void(ctx, lostClaim(s.key, field, lost.Lease.Token)); err != nil {
		t.Fatalf("void: %v", err)
	}
	s.h.Advance(t, s.h.Short) // past the given-back lease's deadline
	next := s.claim(t, field, time.Hour, 3)
	if next.Status != invocation.Claimed || next.Lease.Attempt != 2 || next.Lost != 0 {
		t.Fatalf("claim after void = %+v, want attempt 2 again with nothing lost", next)
	}
	s.wantErr(t, "finish with the voided lease", invocation.ErrStale, s.transit(t, finish(lost.Lease)).Err)
	// Idempotent, and the new lease is not the lost claim's.
	if err := v.Void(ctx, lostClaim(s.key, field, lost.Lease.Token)); err != nil {
		t.Fatalf("second void: %v", err)
	}
	s.finish(t, next.Lease)
	// Nor is "ok".
	if err := v.Void(ctx, lostClaim(s.key, field, next.Lease.Token)); err != nil {
		t.Fatalf("void after success: %v", err)
	}
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Succeeded {
		t.Fatalf("claim after a void of a finished lease = %+v, want succeeded", got)
	}
}

// stateVoidBeforeTheClaimLands: the claim is still on its way when Void
// runs; when it arrives it finds its own token and records nothing, so no
// lease is left to expire, and the next claim runs the attempt it would
// have. Needs ClaimToken, to know the late claim's token in advance.
func stateVoidBeforeTheClaimLands(t *testing.T, s *stateSuite) {
	v := s.voider(t)
	if s.h.ClaimToken == nil {
		t.Skip("the harness cannot choose a claim's token (StateStoreHarness.ClaimToken)")
	}
	ctx := t.Context()
	// otherField has no state; field has a due retry of attempt 1.
	first := s.claim(t, field, time.Hour, 3)
	s.retry(t, first.Lease, 0)
	for _, c := range []struct {
		field       string
		wantAttempt int
		token       string
	}{{otherField, 1, "lost1"}, {field, 2, "lost2"}} {
		token := c.token
		if err := v.Void(ctx, lostClaim(s.key, c.field, token)); err != nil {
			t.Fatalf("void of %s before its claim: %v", c.field, err)
		}
		if err := v.Void(ctx, lostClaim(s.key, c.field, token)); err != nil {
			t.Fatalf("second void of %s: %v", c.field, err)
		}
		s.h.ClaimToken(t, token)
		late := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: c.field, Lease: s.h.Short, MaxAttempts: 3})
		if late.Err == nil {
			t.Fatalf("the voided claim of %s, arriving late = %+v; want an error and nothing recorded", c.field, late.Claim)
		}
		s.h.Advance(t, s.h.Short) // past the late claim's deadline, had it recorded one
		next := s.claim(t, c.field, time.Hour, 3)
		if next.Status != invocation.Claimed || next.Lease.Attempt != c.wantAttempt || next.Lost != 0 {
			t.Fatalf("claim of %s after the voided one = %+v, want attempt %d with nothing lost", c.field, next, c.wantAttempt)
		}
		if next.Lease.Token == token {
			t.Fatalf("the next claim of %s reused the voided token", c.field)
		}
	}
}

// stateVoidAfterTheMessageLeft: once the message left the PEL there is
// nothing to give back: ErrTerminal, and a token that is not a claim's is
// refused as ill-formed.
func stateVoidAfterTheMessageLeft(t *testing.T, s *stateSuite) {
	v := s.voider(t)
	ctx := t.Context()
	for _, bad := range []invocation.Lease{lostClaim(s.key, field, ""), lostClaim(s.key, field, "a:b"), lostClaim(s.key, "", "tok")} {
		if err := v.Void(ctx, bad); err == nil || isContractErr(err) {
			t.Errorf("void of %+v: %v, want an argument error", bad, err)
		}
	}
	c := s.claim(t, field, time.Hour, 3)
	s.h.Ack(t, s.key)
	s.wantErr(t, "void after the ack", invocation.ErrTerminal, v.Void(ctx, lostClaim(s.key, field, c.Lease.Token)))
	s.wantErr(t, "void without state after the ack", invocation.ErrTerminal, v.Void(ctx, lostClaim(s.key, otherField, "tok")))
	if err := s.clear(t, s.key, time.Hour); err != nil {
		t.Fatal(err)
	}
	s.wantErr(t, "void of a retained hash", invocation.ErrTerminal, v.Void(ctx, lostClaim(s.key, field, c.Lease.Token)))
}
