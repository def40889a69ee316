package relaytest

import (
	"errors"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
)

// StateStoreHarness is one StateStore under test, with control over its
// clock and a view of the message's stream, for TestStateStore.
type StateStoreHarness struct {
	// Store is the implementation under test. The suite uses message keys
	// unique to each sub-test (UniqueName), so one store may serve several
	// harnesses.
	Store relay.StateStore
	// Now returns the current time on the store's clock, the clock its
	// deadlines are computed from (the Redis server's TIME for
	// redisstate.Store).
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
	// then XREADGROUP). The suite calls it a few times per sub-test, and
	// every key it returns is of the same stream.
	Deliver func(t *testing.T) invocation.Key
	// Ack acknowledges the message of key outside the store (a plain
	// XACK), as a PEL reference cleared by XAUTOCLAIM or an ack that was
	// not one step with the retention leaves it: it leaves the PEL, and
	// its state is untouched.
	Ack func(t *testing.T, key invocation.Key)
	// Pending reports whether the message of key is in its group's PEL
	// (XPENDING), where Settle's acknowledgement removes it from.
	Pending func(t *testing.T, key invocation.Key) bool
	// State returns every field of the state of key's message, reserved
	// ones included, as redisstate.Store.Get does ("__terminal" = "1" once
	// retained, invocation.DLQField of a dead-lettered invocation); an
	// empty map when there is none.
	State func(t *testing.T, key invocation.Key) map[string]string
	// DeadLetters returns every entry of the dead-letter queue of key's
	// stream (keys.DLQ), oldest first, as redisdlq.Store.List with an empty
	// filter reads them: where Settle writes the entries of its Exhaust
	// and DeadLetter transitions.
	DeadLetters func(t *testing.T, key invocation.Key) []dlq.Entry
	// Redeliver puts the acknowledged message of key back in the group's
	// PEL, as a rewound group (XGROUP SETID to an older id, then a read)
	// delivers it again. Nil skips the cases that need it.
	Redeliver func(t *testing.T, key invocation.Key)
	// ClaimToken makes the next Claim of Store use token instead of one of
	// its own (through a token source of the harness's:
	// redisstate.WithTokenSource, WithTokenSource), so the suite can give
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
// It covers claims: a first claim and a live lease; retries not yet due
// and then due; an expired lease counted as a failed attempt, once, and
// exhaustion when it was the last or when a due retry is beyond the
// allowed attempts; the record of a message's invocations and Unfinished;
// probes, which record an invocation due uncharged where a claim would
// take an attempt and otherwise report what a claim would; exactly one
// winner among concurrent claims and within one batch; and a batch
// answering for each of its requests.
//
// Settle, transition by transition: Finish, Retry and its next attempt
// time, Release of first and later attempts without charging them,
// Exhaust writing the dead-letter entry with its ":dlq" marker, DeadLetter
// writing the entry of an invocation a claim found exhausted, both
// idempotent (applied again, they write no second entry) and both
// recording the entry's id in invocation.DLQField; the entry reading back
// field for field, its defaults filled and an invalid one refused; ErrStale
// for every transition whose attempt or token does not match, or whose
// state does not exist, and no dead-letter entry written by one; the trace
// lineage a Release, Retry or Exhaust stores for the next Claim (unless the
// harness sets NoTraceLineage).
//
// Settle, message by message: a settlement applied whole or not at all
// (a stale transition leaves the others unwritten, no entry written and
// the message pending); its Ack removing the message from the PEL and
// retaining its state (__terminal and a TTL) or, at retention 0, deleting
// it, its dead-letter entries kept; a Stateless ack creating no state;
// a Cleared settlement refused while the message is pending and applying
// the retention once it left; ErrTerminal for every transition, a Terminal
// claim and a refused pin once the message left the PEL, whatever its
// retention, or before it was ever delivered, so a stale delivery changes
// nothing and writes no entry; a rewound message inert while its state is
// retained and handled afresh once it is deleted or expired (unless
// Redeliver is nil); the retention TTL not extended by a second retention;
// settlements of a batch answered one by one.
//
// And: independence of fields and keys; first-writer-wins pins; rejection
// of ill-formed claims and settlements before anything changes; and, for a
// relay.ClaimVoider, a claim given back whether it ran before Void or
// arrives after it (unless ClaimToken is nil), uncharged, idempotently,
// and ErrTerminal once the message left the PEL.
//
// Gates (invocation.Gate, docs/flow-control.md): slots bounding the
// attempts running at once per slot key, Throttled beyond them with the
// earliest lease's end, given back by Finish, Retry and Release with the
// gate and by a lease's end, not by a stale transition; a throttled claim
// charging nothing, not even a lost attempt; a rate letting its burst
// start, then one per interval, per rate key, a throttled claim using no
// turn; debounce deferring an event for its period and a newer event of
// its key superseding it durably, an older one arriving late superseded
// at once; a deferred claim of an invocation without state recording it
// due, uncharged; a probe passing no gate; malformed gates refused. Running and
// NotDue claims carry the attempt.
func TestStateStore(t *testing.T, newHarness func(t *testing.T) StateStoreHarness) {
	for _, c := range stateCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Store == nil || h.Now == nil || h.Advance == nil || h.Short <= 0 || h.Deliver == nil || h.Ack == nil ||
				h.Pending == nil || h.State == nil || h.DeadLetters == nil {
				t.Fatal("relaytest: StateStoreHarness needs Store, Now, Advance, a positive Short, Deliver, Ack, Pending, State and DeadLetters")
			}
			c.run(t, &stateSuite{h: h, key: h.Deliver(t), other: h.Deliver(t)})
		})
	}
}

// stateCases are the cases of TestStateStore, in the order they run. Each
// is a function named state<case>, in contract_state_attempts.go,
// contract_state_settle.go, contract_state_guards.go,
// contract_state_retention.go, contract_state_void.go or
// contract_state_gates.go; a failure names
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
	{"ExhaustWritesTheDeadLetter", stateExhaustWritesTheDeadLetter},
	{"DeadLetterNeedsExhausted", stateDeadLetterNeedsExhausted},
	{"DeadLetterWrittenOnce", stateDeadLetterWrittenOnce},
	{"DeadLetterEntryReadsBack", stateDeadLetterEntryReadsBack},
	{"InvalidDeadLetterEntriesRefused", stateInvalidDeadLetterEntriesRefused},
	{"ReleaseFirstAttempt", stateReleaseFirstAttempt},
	{"ReleaseLaterAttempt", stateReleaseLaterAttempt},
	{"Probe", stateProbe},
	{"ProbeTakesNoLease", stateProbeTakesNoLease},
	{"FencingRejectsAnotherLease", stateFencingRejectsAnotherLease},
	{"TransitionsWithoutState", stateTransitionsWithoutState},
	{"SettlementIsAtomic", stateSettlementIsAtomic},
	{"AckRetainsTheState", stateAckRetainsTheState},
	{"AckWithoutRetentionLeavesNoState", stateAckWithoutRetentionLeavesNoState},
	{"StatelessAck", stateStatelessAck},
	{"BatchesAnswerPerItem", stateBatchesAnswerPerItem},
	{"UnfinishedListsWhatIsNotFinal", stateUnfinishedListsWhatIsNotFinal},
	{"ClaimRecordsTheMessagesInvocations", stateClaimRecords},
	{"IncompleteRecord", stateIncompleteRecord},
	{"RecordArgumentsChecked", stateRecordArguments},
	{"AckMakesStateInert", stateAckMakesStateInert},
	{"StaleDeliveryAfterAck", stateStaleDeliveryAfterAck},
	{"StaleDeliveryAfterAckWithoutRetention", stateStaleDeliveryAfterAckWithoutRetention},
	{"AckedWithoutState", stateAckedWithoutState},
	{"UndeliveredMessageIsInert", stateUndeliveredMessageIsInert},
	{"ClearedRefusedWhilePending", stateClearedRefusedWhilePending},
	{"ClearedRetainsOnceTheMessageLeft", stateClearedRetainsOnceTheMessageLeft},
	{"RedeliveredWhileRetained", stateRedeliveredWhileRetained},
	{"RedeliveredAfterDeletion", stateRedeliveredAfterDeletion},
	{"RetentionExpires", stateRetentionExpires},
	{"SecondRetentionDoesNotExtendTTL", stateSecondRetentionDoesNotExtendTTL},
	{"FieldsAndKeysAreIndependent", stateFieldsAndKeysAreIndependent},
	{"ConcurrentClaimsHaveOneWinner", stateConcurrentClaimsHaveOneWinner},
	{"PinFirstWriterWins", statePinFirstWriterWins},
	{"TraceLineage", stateTraceLineage},
	{"InvalidClaims", stateInvalidClaims},
	{"InvalidSettlements", stateInvalidSettlements},
	{"VoidAfterTheClaimRan", stateVoidAfterTheClaimRan},
	{"VoidBeforeTheClaimLands", stateVoidBeforeTheClaimLands},
	{"VoidAfterTheMessageLeft", stateVoidAfterTheMessageLeft},
	{"WaitingClaimsCarryTheAttempt", stateWaitingClaimsCarryTheAttempt},
	{"GateSlots", stateGateSlots},
	{"GateSlotLapsesWithTheLease", stateGateSlotLapsesWithTheLease},
	{"GateSlotsFollowTheTransitions", stateGateSlotsFollowTheTransitions},
	{"GateThrottleChargesNothing", stateGateThrottleChargesNothing},
	{"GateRate", stateGateRate},
	{"GateDebounce", stateGateDebounce},
	{"GateDebounceOlderArrivesLate", stateGateDebounceOlderArrivesLate},
	{"GateProbePassesNoGate", stateGateProbePassesNoGate},
	{"InvalidGates", stateInvalidGates},
}

const (
	field      = "app/handler"
	otherField = "app/other.handler"
)

type stateSuite struct {
	h          StateStoreHarness
	key, other invocation.Key // two messages of one stream, pending in their group
}

// needRedeliver skips a case the harness cannot rewind for.
func (s *stateSuite) needRedeliver(t *testing.T) {
	t.Helper()
	if s.h.Redeliver == nil {
		t.Skip("the harness cannot deliver an acknowledged message again (StateStoreHarness.Redeliver)")
	}
}

// claimOf claims f of key's message, with no record, and fails the test
// on an error.
func (s *stateSuite) claimOf(t *testing.T, key invocation.Key, f string, lease time.Duration, maxAttempts int) invocation.Claim {
	t.Helper()
	r := s.claimReq(t, invocation.ClaimRequest{Key: key, Field: f, Lease: lease, MaxAttempts: maxAttempts})
	if r.Err != nil {
		t.Fatalf("claim %s: %v", f, r.Err)
	}
	return r.Claim
}

// claim claims f of s.key's message; see claimOf.
func (s *stateSuite) claim(t *testing.T, f string, lease time.Duration, maxAttempts int) invocation.Claim {
	t.Helper()
	return s.claimOf(t, s.key, f, lease, maxAttempts)
}

// claimReq runs one request alone and returns its result.
func (s *stateSuite) claimReq(t *testing.T, r invocation.ClaimRequest) invocation.ClaimResult {
	t.Helper()
	res := s.h.Store.Claim(t.Context(), []invocation.ClaimRequest{r})
	if len(res) != 1 {
		t.Fatalf("Claim of one request returned %d results", len(res))
	}
	return res[0]
}

// settleOne runs one settlement alone and returns its result.
func (s *stateSuite) settleOne(t *testing.T, st invocation.Settlement) invocation.SettleResult {
	t.Helper()
	res := s.h.Store.Settle(t.Context(), []invocation.Settlement{st})
	if len(res) != 1 {
		t.Fatalf("Settle of one settlement returned %d results", len(res))
	}
	r := res[0]
	if r.Err == nil && len(r.Transitions) != len(st.Transitions) {
		t.Fatalf("applied settlement of %d transitions returned %d transition results", len(st.Transitions), len(r.Transitions))
	}
	return r
}

// transit settles the transitions ts of the message of their leases,
// without an ack, and returns the settlement's error.
func (s *stateSuite) transit(t *testing.T, ts ...invocation.Transition) invocation.SettleResult {
	t.Helper()
	return s.settleOne(t, invocation.Settlement{Key: ts[0].Lease.Key, Transitions: ts})
}

// apply settles ts as transit does and fails the test unless all of it
// applied; it returns the transitions' results.
func (s *stateSuite) apply(t *testing.T, what string, ts ...invocation.Transition) []invocation.TransitionResult {
	t.Helper()
	r := s.transit(t, ts...)
	if r.Err != nil {
		t.Fatalf("%s: %v", what, r.Err)
	}
	return r.Transitions
}

func finish(l invocation.Lease) invocation.Transition {
	return invocation.Transition{Kind: invocation.Finish, Lease: l}
}

func retry(l invocation.Lease, backoff time.Duration) invocation.Transition {
	return invocation.Transition{Kind: invocation.Retry, Lease: l, Backoff: backoff}
}

func release(l invocation.Lease) invocation.Transition {
	return invocation.Transition{Kind: invocation.Release, Lease: l}
}

// exhaust is the Exhaust of l with deadLetter(l)'s entry.
func exhaust(l invocation.Lease) invocation.Transition {
	e := deadLetter(l)
	return invocation.Transition{Kind: invocation.Exhaust, Lease: l, Entry: &e}
}

// markDead is the DeadLetter of l with deadLetter(l)'s entry.
func markDead(l invocation.Lease) invocation.Transition {
	e := deadLetter(l)
	return invocation.Transition{Kind: invocation.DeadLetter, Lease: l, Entry: &e}
}

// deadLetter is a valid entry of the invocation of l, with the defaults
// (OriginalStream, Timestamp) left to the store.
func deadLetter(l invocation.Lease) dlq.Entry {
	app, handler := invocation.SplitField(l.Field)
	return dlq.Entry{
		OriginalID: l.Key.MessageID, Group: l.Key.Group, Consumer: "relaytest",
		Event: `{"type":"signup"}`, Reason: "handler exited with code 3", App: app, Handler: handler,
		Deliveries: 1, HandlerAttempts: max(l.Attempt, 1),
	}
}

// The single-transition settlements the suite runs, failing the test
// unless they apply.

func (s *stateSuite) finish(t *testing.T, l invocation.Lease) {
	t.Helper()
	s.apply(t, "finish", finish(l))
}

func (s *stateSuite) retry(t *testing.T, l invocation.Lease, backoff time.Duration) time.Time {
	t.Helper()
	return s.apply(t, "retry", retry(l, backoff))[0].Next
}

func (s *stateSuite) release(t *testing.T, l invocation.Lease) {
	t.Helper()
	s.apply(t, "release", release(l))
}

// exhaust applies the Exhaust of l and returns the id of the entry it
// wrote.
func (s *stateSuite) exhaust(t *testing.T, l invocation.Lease) string {
	t.Helper()
	return s.apply(t, "exhaust", exhaust(l))[0].DLQID
}

// markDead applies the DeadLetter of l and returns the id of the entry it
// wrote, "" when it found one written.
func (s *stateSuite) markDead(t *testing.T, l invocation.Lease) string {
	t.Helper()
	return s.apply(t, "dead-letter", markDead(l))[0].DLQID
}

// ack settles key's message as the Engine's ack path does, with no
// transitions: acknowledged, its state retained for retention (deleted
// with 0).
func (s *stateSuite) ack(t *testing.T, key invocation.Key, retention time.Duration) {
	t.Helper()
	if r := s.settleOne(t, invocation.Settlement{Key: key, Ack: true, Retention: retention}); r.Err != nil {
		t.Fatalf("ack settlement: %v", r.Err)
	}
}

// clear settles key's message as a PEL reference cleared for a missing
// payload does (Cleared) and returns the error.
func (s *stateSuite) clear(t *testing.T, key invocation.Key, retention time.Duration) error {
	t.Helper()
	return s.settleOne(t, invocation.Settlement{Key: key, Cleared: true, Retention: retention}).Err
}

func (s *stateSuite) wantErr(t *testing.T, what string, want, err error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Errorf("%s: %v, want %v", what, err, want)
	}
}

// wantAllStale runs every kind of transition with l, each in a settlement
// of its own, and those that may, with an Ack too, and expects want from
// each (ErrStale or ErrTerminal); none may write a dead-letter entry and,
// for ErrStale, the message stays pending.
func (s *stateSuite) wantAllStale(t *testing.T, l invocation.Lease, want error) {
	t.Helper()
	before := len(s.h.DeadLetters(t, l.Key))
	pending := s.h.Pending(t, l.Key)
	for _, c := range []struct {
		name string
		t    invocation.Transition
		ack  bool
	}{
		{"finish", finish(l), false},
		{"retry", retry(l, time.Minute), false},
		{"release", release(l), false},
		{"exhaust", exhaust(l), false},
		{"dead-letter", markDead(l), false},
		{"finish and ack", finish(l), true},
		{"exhaust and ack", exhaust(l), true},
		{"dead-letter and ack", markDead(l), true},
	} {
		r := s.settleOne(t, invocation.Settlement{Key: l.Key, Transitions: []invocation.Transition{c.t}, Ack: c.ack, Retention: time.Hour})
		s.wantErr(t, c.name, want, r.Err)
	}
	if after := s.h.DeadLetters(t, l.Key); len(after) != before {
		t.Errorf("refused transitions wrote %d dead-letter entries: %+v", len(after)-before, after[before:])
	}
	if got := s.h.Pending(t, l.Key); got != pending {
		t.Errorf("refused settlements changed whether the message is pending: %v, was %v", got, pending)
	}
}

// wantPending asserts whether key's message is in its group's PEL.
func (s *stateSuite) wantPending(t *testing.T, what string, key invocation.Key, want bool) {
	t.Helper()
	if got := s.h.Pending(t, key); got != want {
		t.Errorf("%s: message pending %v, want %v", what, got, want)
	}
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
