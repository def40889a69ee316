package invocation

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Key identifies the per-message invocation hash: one hash per stream entry of
// one consumer group (docs/delivery.md#data-layout-in-redis).
type Key struct {
	Stream    string
	Group     string
	MessageID string
}

// Field is the invocation field of handler of app in its message's hash:
// "<app>/<handler>" (docs/delivery.md#data-layout-in-redis). App names
// have no "/", so SplitField takes it apart again.
func Field(app, handler string) string { return app + "/" + handler }

// SplitField returns the app and handler of an invocation field; handler
// is "" when field has no "/".
func SplitField(field string) (app, handler string) {
	app, handler, _ = strings.Cut(field, "/")
	return app, handler
}

// Status is what Claim found for one invocation field.
type Status int

const (
	// Claimed: the caller owns a new attempt (Lease is set) and must run it.
	Claimed Status = iota + 1
	// Running: another delivery holds an unexpired running lease; do not run.
	Running
	// NotDue: a retry is scheduled for NextAttemptAt; do not run yet.
	NotDue
	// Succeeded: the invocation finished successfully ("ok").
	Succeeded
	// Exhausted: retries are used up but no DLQ entry is recorded yet; the
	// caller writes it with a DeadLetter transition on Lease.
	Exhausted
	// DeadLettered: exhausted and its DLQ entry is persisted.
	DeadLettered
	// Probed: a ClaimRequest.Probe found the invocation claimable and
	// recorded it due instead (Lease has the attempts used, in Attempt,
	// and the token of the record).
	Probed
	// Terminal: the message already left the group's PEL (acknowledged, or
	// its reference cleared), or its hash is retained (__terminal set, a
	// rewound group delivering it again): every transition is inert.
	Terminal
	// Throttled: the invocation was due, but its Gate's concurrency slots
	// are all held or its rate is used up (Limit says which): nothing was
	// written or charged; NextAttemptAt is the earliest time the limit is
	// sure to allow it (docs/flow-control.md#waiting).
	Throttled
	// Debounced: the invocation was due, but its Gate's debounce period
	// runs until NextAttemptAt; a newer event with its key in the meantime
	// supersedes it (docs/flow-control.md#debounce).
	Debounced
	// Superseded: a newer event with the invocation's debounce key was
	// recorded, so this one never runs: the field is final
	// ("superseded:<newer message id>"), and SupersededBy names the newer
	// message.
	Superseded
)

func (s Status) String() string {
	switch s {
	case Claimed:
		return "claimed"
	case Running:
		return "running"
	case NotDue:
		return "not_due"
	case Succeeded:
		return "succeeded"
	case Exhausted:
		return "exhausted"
	case DeadLettered:
		return "dead_lettered"
	case Probed:
		return "probed"
	case Terminal:
		return "terminal"
	case Throttled:
		return "throttled"
	case Debounced:
		return "debounced"
	case Superseded:
		return "superseded"
	}
	return "unknown"
}

// Lease is a fencing handle on one attempt of one invocation. Every
// transition compares Attempt and Token with the stored value, so a stale
// owner can never overwrite a newer claim.
type Lease struct {
	Key Key
	// Field is "<app>/<handler>".
	Field string
	// Attempt is the 1-based real handler execution count of this attempt.
	Attempt int
	// Token is a random value unique to this claim.
	Token string
	// Deadline is when the running lease expires (Redis server clock).
	Deadline time.Time
	// Trace is the trace lineage of this attempt, set by the caller after the
	// claim and opaque to the store (the Engine puts the W3C traceparent of the
	// attempt's function.invoke span here). The Retry, Exhaust and Release
	// transitions store a non-empty Trace beside the field, so the next Claim
	// returns it in Claim.PrevTrace; no transition fences on it, and Claim never
	// sets it.
	Trace string
}

// Record is what a message's first delivery records with its first claim
// (docs/delivery.md#from-entry-to-acknowledgement): the message's other
// invocation fields, stored as due and with no attempt used unless they have
// state, so that a redelivery drives them even if it no longer matches
// them, or if the first delivery's worker died before claiming them.
// Complete says Fields and the claimed field are every invocation the
// message has (no app's rules were unreadable); a redelivery then drives
// exactly those (Unfinished.Complete) instead of matching the event again.
// The zero Record records nothing.
type Record struct {
	Fields   []string
	Complete bool
}

// Unfinished is the result of StateStore.Unfinished.
type Unfinished struct {
	// Fields are the invocation fields whose state is not final, sorted.
	Fields []string
	// Complete reports that the message's first delivery recorded every
	// invocation it has (Record.Complete): Fields are all that is left.
	Complete bool
}

// Claim is the result of StateStore.Claim.
type Claim struct {
	Status Status
	// Lease is set for Claimed (the new attempt) and for Exhausted and
	// DeadLettered (the last attempt, for a DeadLetter transition and DLQ
	// entries), and for Probed (the attempts used and the record's token).
	Lease Lease
	// NextAttemptAt is set for NotDue, Throttled and Debounced, and
	// RunningUntil for Running. Lease.Attempt is set for NotDue and
	// Running too: the attempts used, and the attempt running.
	NextAttemptAt time.Time
	RunningUntil  time.Time
	// Limit names the limit of a Throttled claim: LimitConcurrency or
	// LimitRate.
	Limit string
	// SupersededBy is the message id of a Superseded claim's newer event.
	SupersededBy string
	// PrevTrace is set for Claimed, Exhausted and DeadLettered: the
	// Lease.Trace of the latest attempt that stored one (see Lease.Trace),
	// or empty. The Engine links the new attempt's span to it.
	PrevTrace string
	// NotPending is set for Terminal when the message is not in the
	// group's PEL, rather than its state retained: another consumer
	// acknowledged it, or Redis lost it with its data. Nothing says it
	// ran to its end.
	NotPending bool
	// Lost is set for Claimed and Exhausted when this claim found the
	// previous attempt running with an expired lease: its worker died (or
	// stalled) mid-run, and the attempt, number Lost, is charged as failed.
	// Exactly one claim reports each lost attempt, so callers count them
	// (outcome "lost" of relay_invocations_total). 0 otherwise.
	Lost int
}

var (
	// ErrStale is returned by a transition whose lease no longer matches the
	// stored attempt and token: another delivery owns the invocation now.
	ErrStale = errors.New("invocation: stale lease")
	// ErrTerminal is returned by a transition once the message left the
	// consumer group's PEL (acknowledged, or its reference cleared), or on
	// a retained hash: the state is frozen, or gone with retention 0
	// (docs/delivery.md#invocation-state).
	ErrTerminal = errors.New("invocation: the message is no longer pending or its state is final")
)

// ClaimUnknownError is the error of a Claim whose reply was lost (a
// timeout, a connection that broke or froze): its script may have run, or
// may still run later, recording a lease nobody uses, whose expiry would
// charge an attempt that never ran. Lease has the claim's Key, Field and
// Token, but no Attempt: give it to redisstate.Store.Void (relay.ClaimVoider)
// once the store answers again (docs/delivery.md#lost-replies).
type ClaimUnknownError struct {
	Lease Lease
	Err   error
}

func (e *ClaimUnknownError) Error() string {
	return fmt.Sprintf("reply of claim %s lost: %v", e.Lease.Token, e.Err)
}

func (e *ClaimUnknownError) Unwrap() error { return e.Err }
