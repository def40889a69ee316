//go:build relaytest_port
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
	// Deliver returns the key of a new message of a stream of the sub-test,
	// pending in its consumer group's PEL as a delivery finds it (XADD,
	// then XREADGROUP). The suite calls it twice per sub-test.
	Deliver func(t *testing.T) invocation.Key
	// Ack acknowledges the message of key (XACK), as another worker's
	// settlement does: it leaves the PEL.
	Ack func(t *testing.T, key invocation.Key)
	// Redeliver puts the acknowledged message of key back in the group's
	// PEL, as a rewound group (XGROUP SETID to an older id, then a read)
	// delivers it again. Nil skips the cases that need it.
	Redeliver func(t *testing.T, key invocation.Key)
	// ClaimToken makes the next Claim of Store use token instead of one of
	// its own (through a token source of the harness's:
	// invocation.WithTokenSource, WithTokenSource), so the suite can give
	// a claim back before it runs (relay.ClaimVoider); later claims get
	// the store's own tokens again. The store must then serve this harness
	// alone. Nil skips that case.
	ClaimToken func(t *testing.T, token string)
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
// transition and a Terminal claim once the message left the PEL, whether
// Retain kept its state or deleted it (retention 0) or there was none, so a
// stale delivery changes nothing; Retain refused while the message is
// pending; a rewound message inert while its state is retained and handled
// afresh once it is deleted or expired (unless Redeliver is nil); the
// retention TTL not being extended by a second Retain; independence of
// fields and keys; exactly one
// winner among concurrent claims; first-writer-wins pins; the trace lineage
// a Release, ScheduleRetry or Exhaust stores for the next Claim (unless the
// harness sets NoTraceLineage); rejection of ill-formed arguments; and,
// for a relay.ClaimVoider, a claim given back whether it ran before Void or
// arrives after it (unless ClaimToken is nil), uncharged, idempotently, and
// ErrTerminal once the message left the PEL.
func TestStateStore(t *testing.T, newHarness func(t *testing.T) StateStoreHarness) {
	for _, c := range stateCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Store == nil || h.Now == nil || h.Advance == nil || h.Short <= 0 || h.Deliver == nil || h.Ack == nil {
				t.Fatal("relaytest: StateStoreHarness needs Store, Now, Advance, a positive Short, Deliver and Ack")
			}
			c.run(t, &stateSuite{h: h, key: h.Deliver(t), other: h.Deliver(t)})
		})
	}
}

// stateCases are the cases of TestStateStore, in the order they run. Each
// is a function named state<case>, in contract_state_attempts.go,
// contract_state_guards.go, contract_state_retention.go or
// contract_state_void.go; a failure names
// the calling test and the case, such as TestStoreContract/ClaimNew.
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
	{"StaleDeliveryAfterAck", stateStaleDeliveryAfterAck},
	{"StaleDeliveryAfterAckWithoutRetention", stateStaleDeliveryAfterAckWithoutRetention},
	{"AckedWithoutState", stateAckedWithoutState},
	{"RetainRefusedWhilePending", stateRetainRefusedWhilePending},
	{"RedeliveredWhileRetained", stateRedeliveredWhileRetained},
	{"RedeliveredAfterDeletion", stateRedeliveredAfterDeletion},
	{"RetentionExpires", stateRetentionExpires},
	{"RetainDoesNotExtendTTL", stateRetainDoesNotExtendTTL},
	{"FieldsAndKeysAreIndependent", stateFieldsAndKeysAreIndependent},
	{"ConcurrentClaimsHaveOneWinner", stateConcurrentClaimsHaveOneWinner},
	{"PinFirstWriterWins", statePinFirstWriterWins},
	{"TraceLineage", stateTraceLineage},
	{"InvalidArguments", stateInvalidArguments},
	{"VoidAfterTheClaimRan", stateVoidAfterTheClaimRan},
	{"VoidBeforeTheClaimLands", stateVoidBeforeTheClaimLands},
	{"VoidAfterTheMessageLeft", stateVoidAfterTheMessageLeft},
}

const (
	field      = "app/handler"
	otherField = "app/other.handler"
)

type stateSuite struct {
	h          StateStoreHarness
	key, other invocation.Key // two messages, pending in their group
}

// settle acknowledges key's message and applies retention to its state,
// as the Engine's ack path does (Ack, then Retain).
func (s *stateSuite) settle(t *testing.T, key invocation.Key, retention time.Duration) {
	t.Helper()
	s.h.Ack(t, key)
	if err := s.h.Store.Retain(t.Context(), key, retention); err != nil {
		t.Fatalf("retain after the ack: %v", err)
	}
}

// needRedeliver skips a case the harness cannot rewind for.
func (s *stateSuite) needRedeliver(t *testing.T) {
	t.Helper()
	if s.h.Redeliver == nil {
		t.Skip("the harness cannot deliver an acknowledged message again (StateStoreHarness.Redeliver)")
	}
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

func isTerminal(err error) bool { return errors.Is(err, invocation.ErrTerminal) }

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
