package relaytest

import (
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about the attempts of one invocation: claims and
// leases, success, retries, expired leases, exhaustion, attempts given
// back, probes, what is left unfinished and recorded, and the trace
// lineage between attempts.

func stateClaimNew(t *testing.T, s *stateSuite) {
	before := s.h.Now(t)
	c := s.claim(t, field, time.Hour, 3)
	after := s.h.Now(t)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 1 {
		t.Fatalf("first claim = %+v, want claimed attempt 1", c)
	}
	l := c.Lease
	if l.Key != s.key || l.Field != field || l.Token == "" {
		t.Errorf("lease = %+v, want key %+v, field %q and a token", l, s.key, field)
	}
	checkBetween(t, "lease deadline", l.Deadline, before.Add(time.Hour), after.Add(time.Hour))
}

func stateClaimWhileRunning(t *testing.T, s *stateSuite) {
	first := s.claim(t, field, time.Hour, 3)
	for range 2 {
		c := s.claim(t, field, time.Hour, 3)
		if c.Status != invocation.Running || !c.RunningUntil.Equal(first.Lease.Deadline) {
			t.Fatalf("claim during a live lease = %+v, want running until %v", c, first.Lease.Deadline)
		}
		if want := (invocation.Lease{Key: s.key, Field: field, Attempt: 1}); c.Lease != want {
			t.Errorf("running claim's lease = %+v, want only the attempt running: %+v", c.Lease, want)
		}
	}
}

func stateFinishThenSucceeded(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	if res := s.apply(t, "finish", finish(c.Lease)); res[0] != (invocation.TransitionResult{}) {
		t.Errorf("finish result = %+v, want none (no next attempt, no entry)", res[0])
	}
	for range 2 {
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Succeeded {
			t.Fatalf("claim after finish = %+v, want succeeded", got)
		}
	}
	// "ok" carries no token: a repeated Finish cannot prove it wrote it.
	s.wantErr(t, "second finish", invocation.ErrStale, s.transit(t, finish(c.Lease)).Err)
}

func stateRetryNotDue(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	before := s.h.Now(t)
	next := s.retry(t, c.Lease, time.Hour)
	after := s.h.Now(t)
	checkBetween(t, "next attempt", next, before.Add(time.Hour), after.Add(time.Hour))
	got := s.claim(t, field, time.Hour, 3)
	if got.Status != invocation.NotDue || !got.NextAttemptAt.Equal(next) {
		t.Fatalf("claim before the retry is due = %+v, want not due at %v", got, next)
	}
	// The failed attempt's lease is spent.
	s.wantErr(t, "finish after the retry", invocation.ErrStale, s.transit(t, finish(c.Lease)).Err)
}

func stateRetryDue(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	s.retry(t, c.Lease, s.h.Short)
	s.h.Advance(t, s.h.Short)
	c2 := s.claim(t, field, time.Hour, 3)
	if c2.Status != invocation.Claimed || c2.Lease.Attempt != 2 || c2.Lease.Token == c.Lease.Token || c2.Lost != 0 {
		t.Fatalf("claim of a due retry = %+v, want attempt 2 with a new token, nothing lost", c2)
	}
	// A zero backoff is due at once.
	s.retry(t, c2.Lease, 0)
	if c3 := s.claim(t, field, time.Hour, 3); c3.Status != invocation.Claimed || c3.Lease.Attempt != 3 {
		t.Fatalf("claim after a zero backoff = %+v, want attempt 3", c3)
	}
}

func stateExpiredLeaseIsAFailedAttempt(t *testing.T, s *stateSuite) {
	old := s.claim(t, field, s.h.Short, 3)
	s.h.Advance(t, s.h.Short)
	c := s.claim(t, field, time.Hour, 3)
	if c.Status != invocation.Claimed || c.Lease.Attempt != 2 || c.Lease.Token == old.Lease.Token || c.Lost != 1 {
		t.Fatalf("claim after the lease expired = %+v, want attempt 2 with a new token, Lost 1", c)
	}
	if old.Lost != 0 {
		t.Errorf("first claim reports Lost %d, want 0", old.Lost)
	}
	// The slow owner of attempt 1 comes back: every write is refused.
	s.wantAllStale(t, old.Lease, invocation.ErrStale)
	s.finish(t, c.Lease)
	if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Succeeded {
		t.Errorf("claim after finish = %+v, want succeeded", got)
	}
}

func stateExpiredLastLeaseExhausts(t *testing.T, s *stateSuite) {
	first := s.claim(t, field, s.h.Short, 2)
	s.h.Advance(t, s.h.Short)
	second := s.claim(t, field, s.h.Short, 2)
	if second.Status != invocation.Claimed || second.Lease.Attempt != 2 || second.Lost != 1 {
		t.Fatalf("claim after attempt 1 expired = %+v, want attempt 2, Lost 1", second)
	}
	s.h.Advance(t, s.h.Short)
	ex := s.claim(t, field, time.Hour, 2)
	if ex.Status != invocation.Exhausted || ex.Lease.Attempt != 2 || ex.Lease.Token == "" ||
		ex.Lease.Token == first.Lease.Token || ex.Lease.Token == second.Lease.Token || ex.Lost != 2 {
		t.Fatalf("claim after the last attempt expired = %+v, want exhausted at attempt 2 with a new token, Lost 2", ex)
	}
	if ex.Lease.Key != s.key || ex.Lease.Field != field {
		t.Errorf("exhausted lease = %+v, want key %+v and field %q", ex.Lease, s.key, field)
	}
	// Every later delivery sees the same exhausted attempt and token,
	// so they all write the dead-letter entry under one marker.
	again := s.claim(t, field, time.Hour, 2)
	if again.Status != invocation.Exhausted || again.Lease.Attempt != 2 || again.Lease.Token != ex.Lease.Token || again.Lost != 0 {
		t.Fatalf("second claim = %+v, want %+v without Lost (reported once)", again, ex)
	}
	s.wantErr(t, "exhaust with the expired lease", invocation.ErrStale, s.transit(t, exhaust(second.Lease)).Err)
	if n := len(s.h.DeadLetters(t, s.key)); n != 0 {
		t.Fatalf("%d dead-letter entries before the dead-letter transition, want none", n)
	}
	if id := s.markDead(t, ex.Lease); id == "" {
		t.Error("dead-letter of the exhausted attempt returned no entry id")
	}
	dl := s.claim(t, field, time.Hour, 2)
	if dl.Status != invocation.DeadLettered || dl.Lease.Attempt != 2 || dl.Lease.Token != ex.Lease.Token {
		t.Fatalf("claim after the dead-letter transition = %+v, want dead-lettered at attempt 2", dl)
	}
}

func stateDueRetryBeyondMaxAttemptsExhausts(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 1)
	s.retry(t, c.Lease, 0)
	ex := s.claim(t, field, time.Hour, 1)
	if ex.Status != invocation.Exhausted || ex.Lease.Attempt != 1 {
		t.Fatalf("claim beyond max attempts = %+v, want exhausted at attempt 1", ex)
	}
}

func stateReleaseFirstAttempt(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 2)
	s.release(t, c.Lease)
	s.wantErr(t, "second release", invocation.ErrStale, s.transit(t, release(c.Lease)).Err)
	// Still recorded, so that a redelivery that no longer matches the
	// rule drives it anyway.
	if u, err := s.h.Store.Unfinished(t.Context(), s.key); err != nil || !slices.Equal(u.Fields, []string{field}) || u.Complete {
		t.Fatalf("unfinished after releasing attempt 1 = %v, %v; want [%s]", u, err, field)
	}
	got := s.claim(t, field, time.Hour, 2)
	if got.Status != invocation.Claimed || got.Lease.Attempt != 1 || got.Lost != 0 {
		t.Fatalf("claim after releasing attempt 1 = %+v, want attempt 1 again, nothing lost", got)
	}
}

func stateReleaseLaterAttempt(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 2)
	s.retry(t, c.Lease, 0)
	c2 := s.claim(t, field, time.Hour, 2)
	if c2.Status != invocation.Claimed || c2.Lease.Attempt != 2 {
		t.Fatalf("claim of attempt 2 = %+v", c2)
	}
	s.release(t, c2.Lease)
	// Released, the last attempt is not charged: it is due at once and
	// runs again instead of exhausting.
	got := s.claim(t, field, time.Hour, 2)
	if got.Status != invocation.Claimed || got.Lease.Attempt != 2 {
		t.Fatalf("claim after releasing attempt 2 = %+v, want attempt 2 again", got)
	}
}

// stateProbe: a probe decides as a claim does, but where a claim would
// take an attempt it records the invocation due now with its attempts
// unchanged (Probed, the attempts used in Lease.Attempt), charging an
// expired lease it finds (Lost) once; elsewhere it reports what a claim
// would, and the claim after it sees the state the probe left.
func stateProbe(t *testing.T, s *stateSuite) {
	type want struct {
		status  invocation.Status
		attempt int
		lost    int
	}
	cases := []struct {
		field       string
		maxAttempts int
		setup       func(t *testing.T, f string)
		probe, then want
	}{
		{"probe/none", 3, func(*testing.T, string) {},
			want{invocation.Probed, 0, 0}, want{invocation.Claimed, 1, 0}},
		{"probe/running", 3, func(t *testing.T, f string) { s.claim(t, f, time.Hour, 3) },
			want{invocation.Running, 1, 0}, want{invocation.Running, 1, 0}},
		{"probe/expired", 3, func(t *testing.T, f string) { s.claim(t, f, s.h.Short, 3) },
			want{invocation.Probed, 1, 1}, want{invocation.Claimed, 2, 0}},
		{"probe/expired-last", 1, func(t *testing.T, f string) { s.claim(t, f, s.h.Short, 1) },
			want{invocation.Exhausted, 1, 1}, want{invocation.Exhausted, 1, 0}},
		{"probe/due", 3, func(t *testing.T, f string) { s.retry(t, s.claim(t, f, time.Hour, 3).Lease, 0) },
			want{invocation.Probed, 1, 0}, want{invocation.Claimed, 2, 0}},
		{"probe/not-due", 3, func(t *testing.T, f string) { s.retry(t, s.claim(t, f, time.Hour, 3).Lease, time.Hour) },
			want{invocation.NotDue, 1, 0}, want{invocation.NotDue, 1, 0}},
		{"probe/succeeded", 3, func(t *testing.T, f string) { s.finish(t, s.claim(t, f, time.Hour, 3).Lease) },
			want{invocation.Succeeded, 0, 0}, want{invocation.Succeeded, 0, 0}},
		{"probe/dead-lettered", 1, func(t *testing.T, f string) { s.exhaust(t, s.claim(t, f, time.Hour, 1).Lease) },
			want{invocation.DeadLettered, 1, 0}, want{invocation.DeadLettered, 1, 0}},
	}
	for _, c := range cases {
		c.setup(t, c.field)
	}
	s.h.Advance(t, s.h.Short) // the Short leases expire
	for _, c := range cases {
		r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: c.field, Lease: time.Hour, MaxAttempts: c.maxAttempts, Probe: true})
		got := want{r.Status, r.Lease.Attempt, r.Lost}
		if r.Err != nil || got != c.probe {
			t.Errorf("probe of %s = %+v, %v; want %+v", c.field, r.Claim, r.Err, c.probe)
			continue
		}
		if r.Status == invocation.Probed && (r.Lease.Key != s.key || r.Lease.Field != c.field || r.Lease.Token == "") {
			t.Errorf("probed lease of %s = %+v, want key %+v, the field and a token", c.field, r.Lease, s.key)
		}
		next := s.claim(t, c.field, time.Hour, c.maxAttempts)
		if got := (want{next.Status, next.Lease.Attempt, next.Lost}); got != c.then {
			t.Errorf("claim of %s after the probe = %+v, want %+v", c.field, next, c.then)
		}
	}
}

// stateProbeTakesNoLease: a probe leaves no running lease, so time passing
// after it charges nothing and no transition can use what it returned; it
// records the message's other invocations as a claim does.
func stateProbeTakesNoLease(t *testing.T, s *stateSuite) {
	rec := invocation.Record{Fields: []string{otherField}, Complete: true}
	r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: field, Lease: s.h.Short, MaxAttempts: 3, Probe: true, Record: rec})
	if r.Err != nil || r.Status != invocation.Probed || r.Lease.Attempt != 0 {
		t.Fatalf("probe = %+v, %v; want probed with no attempt used", r.Claim, r.Err)
	}
	u, err := s.h.Store.Unfinished(t.Context(), s.key)
	if err != nil || !u.Complete || !slices.Equal(u.Fields, []string{field, otherField}) {
		t.Fatalf("unfinished after a recording probe = %+v, %v; want [%s %s], complete", u, err, field, otherField)
	}
	used := r.Lease
	used.Attempt = 1
	s.wantAllStale(t, used, invocation.ErrStale)
	s.h.Advance(t, s.h.Short) // past the deadline a claim with the probe's lease would have
	if c := s.claim(t, field, time.Hour, 3); c.Status != invocation.Claimed || c.Lease.Attempt != 1 || c.Lost != 0 {
		t.Fatalf("claim after the probe = %+v, want attempt 1 with nothing lost", c)
	}
}

func stateUnfinishedListsWhatIsNotFinal(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	unfinished := func(what string) []string {
		t.Helper()
		got, err := s.h.Store.Unfinished(ctx, s.key)
		if err != nil {
			t.Fatalf("unfinished %s: %v", what, err)
		}
		if got.Complete {
			t.Fatalf("unfinished %s: Complete without a record", what)
		}
		return got.Fields
	}
	if got := unfinished("without state"); len(got) != 0 {
		t.Fatalf("unfinished without state = %v, want none", got)
	}
	s.claim(t, "a/running", time.Hour, 3)
	s.retry(t, s.claim(t, "a/retrying", time.Hour, 3).Lease, time.Hour)
	s.finish(t, s.claim(t, "a/done", time.Hour, 3).Lease)
	// Exhausted by a claim, its dead-letter entry not written yet.
	s.retry(t, s.claim(t, "a/exhausted", time.Hour, 1).Lease, 0)
	if c := s.claim(t, "a/exhausted", time.Hour, 1); c.Status != invocation.Exhausted {
		t.Fatalf("claim beyond max attempts = %+v, want exhausted", c)
	}
	s.exhaust(t, s.claim(t, "a/dead", time.Hour, 1).Lease)
	if _, err := s.h.Store.Pin(ctx, s.key, "__schedule", "x"); err != nil {
		t.Fatal(err)
	}
	want := []string{"a/exhausted", "a/retrying", "a/running"}
	if got := unfinished("with state"); !slices.Equal(got, want) {
		t.Errorf("unfinished = %v, want %v (sorted; no ok, dead-lettered or reserved fields)", got, want)
	}
	s.ack(t, s.key, time.Hour)
	if got := unfinished("after the ack"); len(got) != 0 {
		t.Errorf("unfinished after the ack = %v, want none", got)
	}
}

func stateTraceLineage(t *testing.T, s *stateSuite) {
	if s.h.NoTraceLineage {
		t.Skip("the store keeps no trace lineage (StateStoreHarness.NoTraceLineage)")
	}
	claimed := func(f string, maxAttempts, wantAttempt int, wantPrev string) invocation.Lease {
		t.Helper()
		c := s.claim(t, f, time.Hour, maxAttempts)
		if c.Status != invocation.Claimed || c.Lease.Attempt != wantAttempt || c.PrevTrace != wantPrev || c.Lease.Trace != "" {
			t.Fatalf("claim of %s = %+v, want attempt %d with PrevTrace %q and no Lease.Trace", f, c, wantAttempt, wantPrev)
		}
		return c.Lease
	}
	wantPrev := func(f string, maxAttempts int, status invocation.Status, prev string) invocation.Claim {
		t.Helper()
		c := s.claim(t, f, time.Hour, maxAttempts)
		if c.Status != status || c.PrevTrace != prev {
			t.Fatalf("claim of %s = %+v, want %v with PrevTrace %q", f, c, status, prev)
		}
		return c
	}
	l := claimed(field, 2, 1, "")
	l.Trace = "trace-released"
	s.release(t, l)
	l = claimed(field, 2, 1, "trace-released")
	l.Trace = "trace-failed"
	s.retry(t, l, 0)
	l = claimed(field, 2, 2, "trace-failed")
	// A lease without lineage keeps what is stored.
	s.release(t, l)
	l = claimed(field, 2, 2, "trace-failed")
	l.Trace = "trace-last"
	s.exhaust(t, l)
	wantPrev(field, 2, invocation.DeadLettered, "trace-last")
	// Applied again, an Exhaust writes nothing, its lineage included.
	l.Trace = "trace-again"
	if id := s.apply(t, "exhaust again", exhaust(l))[0].DLQID; id != "" {
		t.Errorf("exhaust applied again wrote entry %s", id)
	}
	wantPrev(field, 2, invocation.DeadLettered, "trace-last")

	// Lineage is per invocation field; a claim that exhausts the
	// invocation returns it, and DeadLetter does not store one.
	l = claimed(otherField, 1, 1, "")
	l.Trace = "trace-other"
	s.retry(t, l, 0)
	ex := wantPrev(otherField, 1, invocation.Exhausted, "trace-other")
	ex.Lease.Trace = "trace-dead-letter"
	s.markDead(t, ex.Lease)
	wantPrev(otherField, 1, invocation.DeadLettered, "trace-other")
}

// stateClaimRecords: a first delivery's claim records the message's other
// invocations as due with no attempt used, leaves one that has state alone,
// and marks the record complete, so Unfinished lists exactly what is left.
func stateClaimRecords(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	s.finish(t, s.claim(t, "b/done", time.Hour, 3).Lease)
	r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: "a/first", Lease: time.Hour, MaxAttempts: 3,
		Record: invocation.Record{Fields: []string{"a/second", "b/done"}, Complete: true}})
	if r.Err != nil || r.Status != invocation.Claimed || r.Lease.Attempt != 1 {
		t.Fatalf("claim with a record = %+v, %v; want attempt 1 claimed", r.Claim, r.Err)
	}
	u, err := s.h.Store.Unfinished(ctx, s.key)
	if err != nil || !u.Complete || !slices.Equal(u.Fields, []string{"a/first", "a/second"}) {
		t.Fatalf("unfinished after the record = %+v, %v; want [a/first a/second], complete", u, err)
	}
	// The recorded invocation runs as attempt 1: recording charged nothing.
	second := s.claim(t, "a/second", time.Hour, 3)
	if second.Status != invocation.Claimed || second.Lease.Attempt != 1 || second.Lost != 0 {
		t.Fatalf("claim of a recorded invocation = %+v, want attempt 1, nothing lost", second)
	}
	if got := s.claim(t, "b/done", time.Hour, 3); got.Status != invocation.Succeeded {
		t.Errorf("a finished invocation named in the record = %+v, want it still succeeded", got)
	}
}

// stateIncompleteRecord: a record that is not complete (some app's rules
// could not be read) stores the invocations but not the mark, so a
// redelivery matches the event again.
func stateIncompleteRecord(t *testing.T, s *stateSuite) {
	r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: "a/first", Lease: time.Hour, MaxAttempts: 3,
		Record: invocation.Record{Fields: []string{"a/second"}}})
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	u, err := s.h.Store.Unfinished(t.Context(), s.key)
	if err != nil || u.Complete || !slices.Equal(u.Fields, []string{"a/first", "a/second"}) {
		t.Fatalf("unfinished after an incomplete record = %+v, %v; want both fields, not complete", u, err)
	}
}

// stateRecordArguments: a record naming the claimed field, a reserved
// field or a field twice is refused, and nothing is written.
func stateRecordArguments(t *testing.T, s *stateSuite) {
	for _, rec := range []invocation.Record{
		{Fields: []string{"a/first"}}, {Fields: []string{"__matched"}}, {Fields: []string{"a/x", "a/x"}}, {Fields: []string{""}},
	} {
		r := s.claimReq(t, invocation.ClaimRequest{Key: s.key, Field: "a/first", Lease: time.Hour, MaxAttempts: 3, Record: rec})
		if r.Err == nil || isContractErr(r.Err) {
			t.Errorf("claim with record %v = %+v, %v; want an argument error", rec.Fields, r.Claim, r.Err)
		}
	}
	if u, err := s.h.Store.Unfinished(t.Context(), s.key); err != nil || len(u.Fields) != 0 {
		t.Errorf("after refused claims: unfinished %+v, %v; want nothing written", u, err)
	}
}
