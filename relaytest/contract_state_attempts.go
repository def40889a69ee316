//go:build relaytest_port
package relaytest

import (
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// Cases of TestStateStore about the attempts of one invocation: claims and
// leases, success, retries, expired leases, exhaustion and the DLQ marker,
// attempts given back, what is left unfinished, and the trace lineage
// between attempts.

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
		if c.Lease != (invocation.Lease{}) {
			t.Errorf("running claim carries a lease: %+v", c.Lease)
		}
	}
}

func stateFinishThenSucceeded(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	if err := s.h.Store.Finish(t.Context(), c.Lease); err != nil {
		t.Fatalf("finish: %v", err)
	}
	for range 2 {
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Succeeded {
			t.Fatalf("claim after finish = %+v, want succeeded", got)
		}
	}
	// "ok" carries no token: a repeated Finish cannot prove it wrote it.
	s.wantErr(t, "second finish", invocation.ErrStale, s.h.Store.Finish(t.Context(), c.Lease))
}

func stateRetryNotDue(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	before := s.h.Now(t)
	next, err := s.h.Store.ScheduleRetry(t.Context(), c.Lease, time.Hour)
	after := s.h.Now(t)
	if err != nil {
		t.Fatalf("schedule_retry: %v", err)
	}
	checkBetween(t, "next attempt", next, before.Add(time.Hour), after.Add(time.Hour))
	got := s.claim(t, field, time.Hour, 3)
	if got.Status != invocation.NotDue || !got.NextAttemptAt.Equal(next) {
		t.Fatalf("claim before the retry is due = %+v, want not due at %v", got, next)
	}
	// The failed attempt's lease is spent.
	s.wantErr(t, "finish after schedule_retry", invocation.ErrStale, s.h.Store.Finish(t.Context(), c.Lease))
}

func stateRetryDue(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 3)
	if _, err := s.h.Store.ScheduleRetry(t.Context(), c.Lease, s.h.Short); err != nil {
		t.Fatalf("schedule_retry: %v", err)
	}
	s.h.Advance(t, s.h.Short)
	c2 := s.claim(t, field, time.Hour, 3)
	if c2.Status != invocation.Claimed || c2.Lease.Attempt != 2 || c2.Lease.Token == c.Lease.Token || c2.Lost != 0 {
		t.Fatalf("claim of a due retry = %+v, want attempt 2 with a new token, nothing lost", c2)
	}
	// A zero backoff is due at once.
	if _, err := s.h.Store.ScheduleRetry(t.Context(), c2.Lease, 0); err != nil {
		t.Fatalf("schedule_retry: %v", err)
	}
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
	if err := s.h.Store.Finish(t.Context(), c.Lease); err != nil {
		t.Fatalf("finish attempt 2: %v", err)
	}
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
	// so they all write the DLQ entry under one marker.
	again := s.claim(t, field, time.Hour, 2)
	if again.Status != invocation.Exhausted || again.Lease.Attempt != 2 || again.Lease.Token != ex.Lease.Token || again.Lost != 0 {
		t.Fatalf("second claim = %+v, want %+v without Lost (reported once)", again, ex)
	}
	s.wantErr(t, "exhaust with the expired lease", invocation.ErrStale, s.h.Store.Exhaust(t.Context(), second.Lease))
	if err := s.h.Store.MarkDLQ(t.Context(), ex.Lease); err != nil {
		t.Fatalf("mark_dlq: %v", err)
	}
	dl := s.claim(t, field, time.Hour, 2)
	if dl.Status != invocation.DeadLettered || dl.Lease.Attempt != 2 || dl.Lease.Token != ex.Lease.Token {
		t.Fatalf("claim after mark_dlq = %+v, want dead-lettered at attempt 2", dl)
	}
}

func stateDueRetryBeyondMaxAttemptsExhausts(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 1)
	if _, err := s.h.Store.ScheduleRetry(t.Context(), c.Lease, 0); err != nil {
		t.Fatalf("schedule_retry: %v", err)
	}
	ex := s.claim(t, field, time.Hour, 1)
	if ex.Status != invocation.Exhausted || ex.Lease.Attempt != 1 {
		t.Fatalf("claim beyond max attempts = %+v, want exhausted at attempt 1", ex)
	}
}

func stateExhaustThenMarkDLQ(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	c := s.claim(t, field, time.Hour, 1)
	if err := s.h.Store.Exhaust(ctx, c.Lease); err != nil {
		t.Fatalf("exhaust: %v", err)
	}
	ex := s.claim(t, field, time.Hour, 1)
	if ex.Status != invocation.Exhausted || ex.Lease.Attempt != 1 || ex.Lease.Token != c.Lease.Token {
		t.Fatalf("claim after exhaust = %+v, want exhausted with the lease's attempt and token", ex)
	}
	s.wantErr(t, "second exhaust", invocation.ErrStale, s.h.Store.Exhaust(ctx, c.Lease))
	s.wantErr(t, "finish after exhaust", invocation.ErrStale, s.h.Store.Finish(ctx, c.Lease))
	wrong := c.Lease
	wrong.Token += "x"
	s.wantErr(t, "mark_dlq with another token", invocation.ErrStale, s.h.Store.MarkDLQ(ctx, wrong))
	for i := range 2 { // idempotent
		if err := s.h.Store.MarkDLQ(ctx, c.Lease); err != nil {
			t.Fatalf("mark_dlq #%d: %v", i+1, err)
		}
	}
	if dl := s.claim(t, field, time.Hour, 1); dl.Status != invocation.DeadLettered || dl.Lease.Token != c.Lease.Token {
		t.Fatalf("claim after mark_dlq = %+v, want dead-lettered", dl)
	}
}

func stateMarkDLQNeedsExhausted(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 1)
	s.wantErr(t, "mark_dlq of a running attempt", invocation.ErrStale, s.h.Store.MarkDLQ(t.Context(), c.Lease))
	if got := s.claim(t, field, time.Hour, 1); got.Status != invocation.Running {
		t.Errorf("claim after a refused mark_dlq = %+v, want still running", got)
	}
}

func stateReleaseFirstAttempt(t *testing.T, s *stateSuite) {
	c := s.claim(t, field, time.Hour, 2)
	if err := s.h.Store.Release(t.Context(), c.Lease); err != nil {
		t.Fatalf("release: %v", err)
	}
	s.wantErr(t, "second release", invocation.ErrStale, s.h.Store.Release(t.Context(), c.Lease))
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
	if _, err := s.h.Store.ScheduleRetry(t.Context(), c.Lease, 0); err != nil {
		t.Fatalf("schedule_retry: %v", err)
	}
	c2 := s.claim(t, field, time.Hour, 2)
	if c2.Status != invocation.Claimed || c2.Lease.Attempt != 2 {
		t.Fatalf("claim of attempt 2 = %+v", c2)
	}
	if err := s.h.Store.Release(t.Context(), c2.Lease); err != nil {
		t.Fatalf("release: %v", err)
	}
	// Released, the last attempt is not charged: it is due at once and
	// runs again instead of exhausting.
	got := s.claim(t, field, time.Hour, 2)
	if got.Status != invocation.Claimed || got.Lease.Attempt != 2 {
		t.Fatalf("claim after releasing attempt 2 = %+v, want attempt 2 again", got)
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
	retry := s.claim(t, "a/retrying", time.Hour, 3)
	if _, err := s.h.Store.ScheduleRetry(ctx, retry.Lease, time.Hour); err != nil {
		t.Fatal(err)
	}
	done := s.claim(t, "a/done", time.Hour, 3)
	if err := s.h.Store.Finish(ctx, done.Lease); err != nil {
		t.Fatal(err)
	}
	ex := s.claim(t, "a/exhausted", time.Hour, 1)
	if err := s.h.Store.Exhaust(ctx, ex.Lease); err != nil {
		t.Fatal(err)
	}
	dl := s.claim(t, "a/dead", time.Hour, 1)
	if err := s.h.Store.Exhaust(ctx, dl.Lease); err != nil {
		t.Fatal(err)
	}
	if err := s.h.Store.MarkDLQ(ctx, dl.Lease); err != nil {
		t.Fatal(err)
	}
	if _, err := s.h.Store.Pin(ctx, s.key, "__schedule", "x"); err != nil {
		t.Fatal(err)
	}
	want := []string{"a/exhausted", "a/retrying", "a/running"}
	if got := unfinished("with state"); !slices.Equal(got, want) {
		t.Errorf("unfinished = %v, want %v (sorted; no ok, dead-lettered or reserved fields)", got, want)
	}
	s.settle(t, s.key, time.Hour)
	if got := unfinished("after retain"); len(got) != 0 {
		t.Errorf("unfinished after retain = %v, want none", got)
	}
}

func stateTraceLineage(t *testing.T, s *stateSuite) {
	if s.h.NoTraceLineage {
		t.Skip("the store keeps no trace lineage (StateStoreHarness.NoTraceLineage)")
	}
	ctx := t.Context()
	claimed := func(wantAttempt int, wantPrev string) invocation.Lease {
		t.Helper()
		c := s.claim(t, field, time.Hour, 2)
		if c.Status != invocation.Claimed || c.Lease.Attempt != wantAttempt || c.PrevTrace != wantPrev || c.Lease.Trace != "" {
			t.Fatalf("claim = %+v, want attempt %d with PrevTrace %q and no Lease.Trace", c, wantAttempt, wantPrev)
		}
		return c.Lease
	}
	l := claimed(1, "")
	l.Trace = "trace-released"
	if err := s.h.Store.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	l = claimed(1, "trace-released")
	l.Trace = "trace-failed"
	if _, err := s.h.Store.ScheduleRetry(ctx, l, 0); err != nil {
		t.Fatal(err)
	}
	l = claimed(2, "trace-failed")
	// A lease without lineage keeps what is stored.
	if err := s.h.Store.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	l = claimed(2, "trace-failed")
	l.Trace = "trace-last"
	if err := s.h.Store.Exhaust(ctx, l); err != nil {
		t.Fatal(err)
	}
	ex := s.claim(t, field, time.Hour, 2)
	if ex.Status != invocation.Exhausted || ex.PrevTrace != "trace-last" {
		t.Fatalf("claim after exhaust = %+v, want exhausted with PrevTrace trace-last", ex)
	}
	if err := s.h.Store.MarkDLQ(ctx, ex.Lease); err != nil {
		t.Fatal(err)
	}
	if dl := s.claim(t, field, time.Hour, 2); dl.Status != invocation.DeadLettered || dl.PrevTrace != "trace-last" {
		t.Fatalf("claim after mark_dlq = %+v, want dead-lettered with PrevTrace trace-last", dl)
	}
	// Lineage is per invocation field.
	if c := s.claim(t, otherField, time.Hour, 2); c.Status != invocation.Claimed || c.PrevTrace != "" {
		t.Errorf("claim of another field = %+v, want claimed without PrevTrace", c)
	}
}

// stateClaimRecords: a first delivery's claim records the message's other
// invocations as due with no attempt used, leaves one that has state alone,
// and marks the record complete, so Unfinished lists exactly what is left.
func stateClaimRecords(t *testing.T, s *stateSuite) {
	ctx := t.Context()
	done := s.claim(t, "b/done", time.Hour, 3)
	if err := s.h.Store.Finish(ctx, done.Lease); err != nil {
		t.Fatal(err)
	}
	c, err := s.h.Store.Claim(ctx, s.key, "a/first", time.Hour, 3, invocation.Record{Fields: []string{"a/second", "b/done"}, Complete: true})
	if err != nil || c.Status != invocation.Claimed || c.Lease.Attempt != 1 {
		t.Fatalf("claim with a record = %+v, %v; want attempt 1 claimed", c, err)
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
	if _, err := s.h.Store.Claim(t.Context(), s.key, "a/first", time.Hour, 3, invocation.Record{Fields: []string{"a/second"}}); err != nil {
		t.Fatal(err)
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
		if _, err := s.h.Store.Claim(t.Context(), s.key, "a/first", time.Hour, 3, rec); err == nil {
			t.Errorf("claim with record %v: no error", rec.Fields)
		}
	}
	if u, err := s.h.Store.Unfinished(t.Context(), s.key); err != nil || len(u.Fields) != 0 {
		t.Errorf("after refused claims: unfinished %+v, %v; want nothing written", u, err)
	}
}
