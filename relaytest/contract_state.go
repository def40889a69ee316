package relaytest

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/invocation"
)

// StateStoreHarness is one StateStore under test, with control over its
// clock, for TestStateStore.
type StateStoreHarness struct {
	// Store is the implementation under test. The suite uses message keys
	// unique to each sub-test (UniqueName), so one store may serve several
	// harnesses.
	Store relay.StateStore
	// Now returns the current time on the store's clock, the clock its
	// deadlines are computed from (the Redis server's TIME for
	// invocation.Store).
	Now func(t *testing.T) time.Time
	// Advance lets at least d pass on the store's clock: AdvanceManual for a
	// store on a ManualClock, AdvanceByPolling for one on real time.
	Advance func(t *testing.T, d time.Duration)
	// Short is the lease, backoff and retention the suite lets run out with
	// Advance. On real time it must be far longer than two consecutive calls
	// to the store take, since the suite asserts that a TTL of Short set by
	// one call is still running at the next; 200ms suits a local Redis. Any
	// value works with a ManualClock.
	Short time.Duration
	// NoTraceLineage skips the trace-lineage case, for a store that does
	// not keep Lease.Trace for the next Claim's PrevTrace: relay.go makes
	// that optional.
	NoTraceLineage bool
}

// TestStateStore runs the contract of relay.StateStore
// (docs/delivery.md#invocation-state, docs/delivery.md#attempts-retries-backoff
// and docs/delivery.md#dead-letter-queue; the state machine in invocation's
// package doc) against the stores newHarness returns, one per parallel
// sub-test.
//
// It covers: a first claim and a live lease; success, and Finish being
// strictly fenced; retries that are not yet due and then due; an expired
// lease counted as a failed attempt, and exhaustion when it was the last;
// Exhaust and the idempotent MarkDLQ; Release of first and later attempts
// without charging them; ErrStale for every transition whose attempt or
// token does not match, or whose state does not exist; ErrTerminal for every
// transition once Retain ran; the retention TTL running out, and not being
// extended by a second Retain; independence of fields and keys; exactly one
// winner among concurrent claims; first-writer-wins pins; the trace lineage
// a Release, ScheduleRetry or Exhaust stores for the next Claim (unless the
// harness sets NoTraceLineage); and rejection of ill-formed arguments.
func TestStateStore(t *testing.T, newHarness func(t *testing.T) StateStoreHarness) {
	run := func(name string, f func(t *testing.T, s *stateSuite)) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Store == nil || h.Now == nil || h.Advance == nil || h.Short <= 0 {
				t.Fatal("relaytest: StateStoreHarness needs Store, Now, Advance and a positive Short")
			}
			n := UniqueName(t)
			f(t, &stateSuite{h: h, key: invocation.Key{Stream: n, Group: "group", MessageID: "1700000000000-0"}})
		})
	}

	run("ClaimNew", func(t *testing.T, s *stateSuite) {
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
	})

	run("ClaimWhileRunning", func(t *testing.T, s *stateSuite) {
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
	})

	run("FinishThenSucceeded", func(t *testing.T, s *stateSuite) {
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
	})

	run("RetryNotDue", func(t *testing.T, s *stateSuite) {
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
	})

	run("RetryDue", func(t *testing.T, s *stateSuite) {
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
	})

	run("ExpiredLeaseIsAFailedAttempt", func(t *testing.T, s *stateSuite) {
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
	})

	run("ExpiredLastLeaseExhausts", func(t *testing.T, s *stateSuite) {
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
	})

	run("DueRetryBeyondMaxAttemptsExhausts", func(t *testing.T, s *stateSuite) {
		c := s.claim(t, field, time.Hour, 1)
		if _, err := s.h.Store.ScheduleRetry(t.Context(), c.Lease, 0); err != nil {
			t.Fatalf("schedule_retry: %v", err)
		}
		ex := s.claim(t, field, time.Hour, 1)
		if ex.Status != invocation.Exhausted || ex.Lease.Attempt != 1 {
			t.Fatalf("claim beyond max attempts = %+v, want exhausted at attempt 1", ex)
		}
	})

	run("ExhaustThenMarkDLQ", func(t *testing.T, s *stateSuite) {
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
	})

	run("MarkDLQNeedsExhausted", func(t *testing.T, s *stateSuite) {
		c := s.claim(t, field, time.Hour, 1)
		s.wantErr(t, "mark_dlq of a running attempt", invocation.ErrStale, s.h.Store.MarkDLQ(t.Context(), c.Lease))
		if got := s.claim(t, field, time.Hour, 1); got.Status != invocation.Running {
			t.Errorf("claim after a refused mark_dlq = %+v, want still running", got)
		}
	})

	run("ReleaseFirstAttempt", func(t *testing.T, s *stateSuite) {
		c := s.claim(t, field, time.Hour, 2)
		if err := s.h.Store.Release(t.Context(), c.Lease); err != nil {
			t.Fatalf("release: %v", err)
		}
		s.wantErr(t, "second release", invocation.ErrStale, s.h.Store.Release(t.Context(), c.Lease))
		// Still recorded, so that a redelivery that no longer matches the
		// rule drives it anyway.
		if u, err := s.h.Store.Unfinished(t.Context(), s.key); err != nil || !slices.Equal(u, []string{field}) {
			t.Fatalf("unfinished after releasing attempt 1 = %v, %v; want [%s]", u, err, field)
		}
		got := s.claim(t, field, time.Hour, 2)
		if got.Status != invocation.Claimed || got.Lease.Attempt != 1 || got.Lost != 0 {
			t.Fatalf("claim after releasing attempt 1 = %+v, want attempt 1 again, nothing lost", got)
		}
	})

	run("ReleaseLaterAttempt", func(t *testing.T, s *stateSuite) {
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
	})

	run("FencingRejectsAnotherLease", func(t *testing.T, s *stateSuite) {
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
	})

	run("TransitionsWithoutState", func(t *testing.T, s *stateSuite) {
		s.wantAllStale(t, invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "never-claimed"}, invocation.ErrStale)
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Claimed || got.Lease.Attempt != 1 {
			t.Fatalf("claim after refused writes = %+v, want attempt 1", got)
		}
	})

	run("UnfinishedListsWhatIsNotFinal", func(t *testing.T, s *stateSuite) {
		ctx := t.Context()
		unfinished := func(what string) []string {
			t.Helper()
			got, err := s.h.Store.Unfinished(ctx, s.key)
			if err != nil {
				t.Fatalf("unfinished %s: %v", what, err)
			}
			return got
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
		if err := s.h.Store.Retain(ctx, s.key, time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := unfinished("after retain"); len(got) != 0 {
			t.Errorf("unfinished after retain = %v, want none", got)
		}
	})

	run("RetainMakesStateInert", func(t *testing.T, s *stateSuite) {
		ctx := t.Context()
		done := s.claim(t, field, time.Hour, 3)
		if err := s.h.Store.Finish(ctx, done.Lease); err != nil {
			t.Fatal(err)
		}
		live := s.claim(t, otherField, time.Hour, 3)
		for i := range 2 { // idempotent
			if err := s.h.Store.Retain(ctx, s.key, time.Hour); err != nil {
				t.Fatalf("retain #%d: %v", i+1, err)
			}
		}
		for _, f := range []string{field, otherField, "never/claimed"} {
			if got := s.claim(t, f, time.Hour, 3); got.Status != invocation.Terminal {
				t.Errorf("claim %s on a retained hash = %+v, want terminal", f, got)
			}
		}
		// A stale in-memory delivery can change nothing any more.
		s.wantAllStale(t, live.Lease, invocation.ErrTerminal)
		s.wantAllStale(t, done.Lease, invocation.ErrTerminal)
	})

	run("RetainWithoutState", func(t *testing.T, s *stateSuite) {
		if err := s.h.Store.Retain(t.Context(), s.key, time.Hour); err != nil {
			t.Fatalf("retain: %v", err)
		}
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Terminal {
			t.Fatalf("claim after retaining a missing hash = %+v, want terminal", got)
		}
		s.wantAllStale(t, invocation.Lease{Key: s.key, Field: field, Attempt: 1, Token: "late"}, invocation.ErrTerminal)
	})

	run("RetentionExpires", func(t *testing.T, s *stateSuite) {
		c := s.claim(t, field, time.Hour, 3)
		if err := s.h.Store.Finish(t.Context(), c.Lease); err != nil {
			t.Fatal(err)
		}
		if err := s.h.Store.Retain(t.Context(), s.key, s.h.Short); err != nil {
			t.Fatal(err)
		}
		s.h.Advance(t, 2*s.h.Short)
		// The state is gone, as if the message had never been seen.
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Claimed || got.Lease.Attempt != 1 {
			t.Fatalf("claim after the retention TTL ran out = %+v, want attempt 1", got)
		}
	})

	run("RetainDoesNotExtendTTL", func(t *testing.T, s *stateSuite) {
		if err := s.h.Store.Retain(t.Context(), s.key, s.h.Short); err != nil {
			t.Fatal(err)
		}
		if err := s.h.Store.Retain(t.Context(), s.key, time.Hour); err != nil {
			t.Fatal(err)
		}
		s.h.Advance(t, 2*s.h.Short)
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Claimed {
			t.Fatalf("claim after the first TTL ran out = %+v, want claimed (a second Retain must not extend the TTL)", got)
		}
	})

	run("FieldsAndKeysAreIndependent", func(t *testing.T, s *stateSuite) {
		a := s.claim(t, field, time.Hour, 3)
		b := s.claim(t, otherField, time.Hour, 3)
		if a.Status != invocation.Claimed || b.Status != invocation.Claimed || b.Lease.Attempt != 1 {
			t.Fatalf("claims of two fields = %+v, %+v; want both claimed", a, b)
		}
		otherKey := s.key
		otherKey.MessageID = "1700000000000-1"
		c, err := s.h.Store.Claim(t.Context(), otherKey, field, time.Hour, 3)
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
		if err := s.h.Store.Retain(t.Context(), otherKey, time.Hour); err != nil {
			t.Fatal(err)
		}
		if got := s.claim(t, otherField, time.Hour, 3); got.Status != invocation.Running {
			t.Errorf("claim after retaining another message = %+v, want still running", got)
		}
	})

	run("ConcurrentClaimsHaveOneWinner", func(t *testing.T, s *stateSuite) {
		const n = 16
		var wg sync.WaitGroup
		results := make([]invocation.Claim, n)
		errs := make([]error, n)
		for i := range n {
			wg.Go(func() {
				results[i], errs[i] = s.h.Store.Claim(t.Context(), s.key, field, time.Hour, 3)
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
	})

	run("PinFirstWriterWins", func(t *testing.T, s *stateSuite) {
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
		if err := s.h.Store.Retain(ctx, s.key, time.Hour); err != nil {
			t.Fatal(err)
		}
		if _, err := s.h.Store.Pin(ctx, s.key, "__other", "x"); !errors.Is(err, invocation.ErrTerminal) {
			t.Errorf("pin on retained state: %v, want ErrTerminal", err)
		}
	})

	run("TraceLineage", func(t *testing.T, s *stateSuite) {
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
	})

	run("InvalidArguments", func(t *testing.T, s *stateSuite) {
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
			if got, err := s.h.Store.Claim(ctx, s.key, c.field, c.lease, c.maxAttempts); err == nil || isContractErr(err) {
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
		if err := s.h.Store.Retain(ctx, s.key, 0); err == nil {
			t.Error("retain with a zero TTL succeeded, want an argument error")
		}
		// Nothing was changed by the refused calls.
		if got := s.claim(t, field, time.Hour, 3); got.Status != invocation.Running {
			t.Errorf("claim after refused calls = %+v, want still running", got)
		}
	})
}

const (
	field      = "app/handler"
	otherField = "app/other.handler"
)

type stateSuite struct {
	h   StateStoreHarness
	key invocation.Key
}

func (s *stateSuite) claim(t *testing.T, f string, lease time.Duration, maxAttempts int) invocation.Claim {
	t.Helper()
	c, err := s.h.Store.Claim(t.Context(), s.key, f, lease, maxAttempts)
	if err != nil {
		t.Fatalf("claim %s: %v", f, err)
	}
	return c
}

func (s *stateSuite) wantErr(t *testing.T, what string, want, err error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// wantAllStale runs every fenced transition with l and expects want from
// each (ErrStale or ErrTerminal).
func (s *stateSuite) wantAllStale(t *testing.T, l invocation.Lease, want error) {
	t.Helper()
	ctx := t.Context()
	st := s.h.Store
	s.wantErr(t, "finish", want, st.Finish(ctx, l))
	s.wantErr(t, "release", want, st.Release(ctx, l))
	_, err := st.ScheduleRetry(ctx, l, time.Minute)
	s.wantErr(t, "schedule_retry", want, err)
	s.wantErr(t, "exhaust", want, st.Exhaust(ctx, l))
	s.wantErr(t, "mark_dlq", want, st.MarkDLQ(ctx, l))
}

func isContractErr(err error) bool {
	return errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal)
}

// checkBetween asserts lo <= got <= hi at the millisecond precision the
// stores keep.
func checkBetween(t *testing.T, what string, got, lo, hi time.Time) {
	t.Helper()
	g, l, h := got.UnixMilli(), lo.UnixMilli(), hi.UnixMilli()
	if g < l || g > h {
		t.Errorf("%s = %v, want between %v and %v", what, got, lo, hi)
	}
}
