package relaytest

import (
	"errors"
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
	for _, c := range stateCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Store == nil || h.Now == nil || h.Advance == nil || h.Short <= 0 {
				t.Fatal("relaytest: StateStoreHarness needs Store, Now, Advance and a positive Short")
			}
			n := UniqueName(t)
			c.run(t, &stateSuite{h: h, key: invocation.Key{Stream: n, Group: "group", MessageID: "1700000000000-0"}})
		})
	}
}

// stateCases are the cases of TestStateStore, in the order they run. Each
// is a function named state<case>, in contract_state_attempts.go or
// contract_state_guards.go; a failure names the calling test and the case,
// such as TestStoreContract/ClaimNew.
var stateCases = []struct {
	name string
	run  func(t *testing.T, s *stateSuite)
}{
	{"ClaimNew", stateClaimNew},
	{"ClaimWhileRunning", stateClaimWhileRunning},
	{"FinishThenSucceeded", stateFinishThenSucceeded},
	{"RetryNotDue", stateRetryNotDue},
	{"RetryDue", stateRetryDue},
	{"ExpiredLeaseIsAFailedAttempt", stateExpiredLeaseIsAFailedAttempt},
	{"ExpiredLastLeaseExhausts", stateExpiredLastLeaseExhausts},
	{"DueRetryBeyondMaxAttemptsExhausts", stateDueRetryBeyondMaxAttemptsExhausts},
	{"ExhaustThenMarkDLQ", stateExhaustThenMarkDLQ},
	{"MarkDLQNeedsExhausted", stateMarkDLQNeedsExhausted},
	{"ReleaseFirstAttempt", stateReleaseFirstAttempt},
	{"ReleaseLaterAttempt", stateReleaseLaterAttempt},
	{"FencingRejectsAnotherLease", stateFencingRejectsAnotherLease},
	{"TransitionsWithoutState", stateTransitionsWithoutState},
	{"UnfinishedListsWhatIsNotFinal", stateUnfinishedListsWhatIsNotFinal},
	{"ClaimRecordsTheMessagesInvocations", stateClaimRecords},
	{"IncompleteRecord", stateIncompleteRecord},
	{"RecordArgumentsChecked", stateRecordArguments},
	{"RetainMakesStateInert", stateRetainMakesStateInert},
	{"RetainWithoutState", stateRetainWithoutState},
	{"RetentionExpires", stateRetentionExpires},
	{"RetainDoesNotExtendTTL", stateRetainDoesNotExtendTTL},
	{"FieldsAndKeysAreIndependent", stateFieldsAndKeysAreIndependent},
	{"ConcurrentClaimsHaveOneWinner", stateConcurrentClaimsHaveOneWinner},
	{"PinFirstWriterWins", statePinFirstWriterWins},
	{"TraceLineage", stateTraceLineage},
	{"InvalidArguments", stateInvalidArguments},
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
	c, err := s.h.Store.Claim(t.Context(), s.key, f, lease, maxAttempts, invocation.Record{})
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
