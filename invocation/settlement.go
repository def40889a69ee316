package invocation

import (
	"errors"
	"fmt"
	"time"

	"github.com/relaydev/relay/dlq"
)

// ClaimRequest asks a StateStore for the next attempt of one invocation of
// one message (docs/delivery.md#attempts-retries-backoff). A StateStore
// takes several at once, of any messages of one stream and group.
type ClaimRequest struct {
	Key Key
	// Field is the invocation, "<app>/<handler>" (Target.Field).
	Field string
	// Lease is how long a claimed attempt may run before it counts as lost
	// (at least 1ms, used with millisecond precision): the rule's timeout
	// plus the Engine's lease grace.
	Lease time.Duration
	// MaxAttempts is the rule's retries + 1 (at least 1).
	MaxAttempts int
	// Record, given by a message's first delivery only, records the
	// message's other invocations in the same write (see Record).
	Record Record
	// Probe asks for what a claim would find without taking an attempt:
	// where Claim would claim one, the invocation is recorded due now with
	// its attempts unchanged (next_attempt_at:<now>:<attempts used>:<token>,
	// uncharged) and the status is Probed. A delivery that cannot start the
	// invocation (its app is unavailable, no slot freed, the worker stops)
	// probes it, so its redelivery drives it and a lost attempt is still
	// charged, without a lease a crash could leave to be charged.
	Probe bool
	// Gate is the invocation's flow control that holds across workers
	// (docs/flow-control.md); the zero Gate has none. A claim that would
	// take an attempt first passes it: a newer event with its debounce key
	// makes it Superseded, a debounce period not over makes it Debounced,
	// and held slots or a used-up rate make it Throttled, each without
	// writing the field or charging anything. A probe passes no gate.
	Gate Gate
}

// Names of the limits a Throttled claim reports in Claim.Limit.
const (
	LimitConcurrency = "concurrency"
	LimitRate        = "rate"
)

// Gate is the part of one rule's flow control that a StateStore enforces
// for every worker of a consumer group, at claim time, for one event
// (docs/flow-control.md). Each limit is off at its zero value. The keys are
// the event's limit keys (app.KeyOf): every invocation of a rule whose
// event has the same key shares one bound, one rate and one debounce group.
type Gate struct {
	// Slots, when > 0, bounds the attempts of the rule's invocations with
	// SlotKey that run at once. A claimed attempt holds its slot until a
	// transition ends it (Finish, Retry, Exhaust, Release with the same
	// Gate) or its lease expires, whichever comes first, so a worker
	// killed mid-run holds it one lease at most.
	Slots   int
	SlotKey string
	// Interval, when > 0, is the rate limit's emission interval (period ÷
	// count, microsecond precision, at least 1µs): a GCRA per RateKey lets
	// Burst attempts start at once after a quiet spell, then one per
	// Interval (docs/flow-control.md#rate-limits). Burst is at least 1.
	Interval time.Duration
	Burst    int
	RateKey  string
	// Period, when > 0, is the debounce period (millisecond precision, at
	// least 1ms): of the events with DebounceKey, an invocation runs only
	// once Period passed since its event was recorded without a newer one
	// (docs/flow-control.md#debounce).
	Period      time.Duration
	DebounceKey string
}

// DebounceKeep is how long a debounce group's latest event is remembered
// after its period ends: an older event of the group claimed within it
// (redelivered late, say, from a dead worker's PEL) is superseded by the
// one that ran; one claimed later counts as the group's newest and runs
// (docs/flow-control.md#debounce).
const DebounceKeep = time.Hour

// IsZero reports whether g sets no limit.
func (g Gate) IsZero() bool { return g.Slots == 0 && g.Interval == 0 && g.Period == 0 }

// Check reports whether g is well-formed: no negative limit, a Burst of
// at least 1 with an Interval, an Interval of at least 1µs and a Period of
// at least 1ms.
func (g Gate) Check() error {
	switch {
	case g.Slots < 0:
		return fmt.Errorf("gate slots %d: must be >= 0", g.Slots)
	case g.Interval < 0 || g.Interval > 0 && g.Interval < time.Microsecond:
		return fmt.Errorf("gate rate interval %v: must be 0 or at least 1µs", g.Interval)
	case g.Interval > 0 && g.Burst < 1:
		return fmt.Errorf("gate rate burst %d: must be at least 1", g.Burst)
	case g.Period < 0 || g.Period > 0 && g.Period < time.Millisecond:
		return fmt.Errorf("gate debounce period %v: must be 0 or at least 1ms", g.Period)
	}
	return nil
}

// Check reports whether r is well-formed: its field, lease, attempts and
// record as CheckClaim and CheckRecord want them. Every StateStore refuses
// what it refuses, with ClaimResult.Err.
func (r ClaimRequest) Check() error {
	if err := CheckClaim(r.Field, r.Lease, r.MaxAttempts); err != nil {
		return err
	}
	if err := r.Gate.Check(); err != nil {
		return err
	}
	return CheckRecord(r.Field, r.Record)
}

// ClaimResult is what a StateStore found for one ClaimRequest: the Claim,
// or Err (a malformed request or stored value, or the store's failure,
// which may be a *ClaimUnknownError when the reply was lost).
type ClaimResult struct {
	Claim
	Err error
}

// TransitionKind is what one transition does to one invocation's state
// (docs/delivery.md#invocation-state).
type TransitionKind int

const (
	// Finish records the success of the running attempt of Lease: "ok".
	Finish TransitionKind = iota + 1
	// Retry records the failure of the running attempt of Lease and the
	// earliest time of the next one, the store's now + Backoff:
	// next_attempt_at:<time>:<attempt>:<token>.
	Retry
	// Exhaust records the failure of the last allowed attempt of Lease and
	// writes its dead-letter Entry: exhausted:<attempt>:<token>:dlq.
	Exhaust
	// DeadLetter writes the dead-letter Entry of an invocation a claim
	// found exhausted (Status Exhausted, exhausted:<attempt>:<token>) and
	// marks it written (":dlq"). One already marked is left as is.
	DeadLetter
	// Release gives the running attempt of Lease back uncharged (the
	// runtime could not run it, the worker stops): it becomes due now with
	// attempt-1 attempts used.
	Release
)

var transitionNames = [...]string{Finish: "finish", Retry: "retry", Exhaust: "exhaust", DeadLetter: "dead-letter", Release: "release"}

func (k TransitionKind) String() string {
	if k > 0 && int(k) < len(transitionNames) {
		return transitionNames[k]
	}
	return fmt.Sprintf("TransitionKind(%d)", int(k))
}

// Transition is one write of one invocation's state in a Settlement. Every
// transition is fenced on Lease's attempt and token: Finish, Retry,
// Exhaust and Release need the field running with them, DeadLetter needs
// it exhausted with them. Lease.Trace, when not empty, is stored as the
// invocation's lineage by Retry, Exhaust and Release.
type Transition struct {
	Kind  TransitionKind
	Lease Lease
	// Backoff is Retry's wait (>= 0, millisecond precision).
	Backoff time.Duration
	// Entry is the dead-letter entry Exhaust and DeadLetter write, in the
	// same step as the marker, validated and defaulted as redisdlq.Writer.Write
	// does: its ID is ignored, an empty OriginalStream is the message's
	// stream (any other is refused) and a zero Timestamp the current time.
	Entry *dlq.Entry
	// Gate is the claim's (ClaimRequest.Gate): Finish, Retry, Exhaust and
	// Release give its slot back.
	Gate Gate
}

// Settlement is what one delivery writes for one message at once
// (docs/delivery.md#from-entry-to-acknowledgement): the transitions of its
// invocations and, when every invocation is terminal after them, the
// message's acknowledgement and the retention of its state. A StateStore
// applies a settlement atomically: all of it, or, when one transition is
// stale or the message is no longer pending, none of it. Nothing else
// acknowledges a message that has invocation state.
type Settlement struct {
	// Key is the message; every transition's Lease.Key must be it.
	Key         Key
	Transitions []Transition
	// Ack acknowledges the message (XACK) after the transitions and
	// switches its state to retention: deleted with Retention 0, else
	// __terminal and a TTL of Retention. A message with no state (it
	// matched nothing) is acknowledged alone.
	Ack bool
	// Stateless, with Ack and no transitions, says the message never had
	// invocation state (a first delivery that matched nothing): the
	// acknowledgement touches no hash.
	Stateless bool
	// Cleared, without Ack or transitions, applies the retention to the
	// state of a message whose PEL reference was cleared (its stream entry
	// was deleted; docs/delivery.md#missing-payloads). It does nothing
	// while the message is pending.
	Cleared bool
	// Retention is CheckRetention's, for Ack and Cleared.
	Retention time.Duration
}

// Check reports whether s is well-formed: every lease of s's message and
// valid, a Retry backoff >= 0, an entry for every Exhaust and DeadLetter,
// and a retention CheckRetention accepts. Every StateStore refuses what it
// refuses, before changing anything.
func (s Settlement) Check() error {
	if err := CheckRetention(s.Retention); err != nil {
		return err
	}
	if s.Cleared && (s.Ack || len(s.Transitions) > 0) {
		return errors.New("a Cleared settlement has no Ack and no transitions")
	}
	seen := map[string]bool{}
	for _, t := range s.Transitions {
		if err := t.Lease.Check(); err != nil {
			return fmt.Errorf("%s: %w", t.Kind, err)
		}
		switch {
		case t.Lease.Key != s.Key:
			return fmt.Errorf("%s %s: the lease is of message %s, not %s", t.Kind, t.Lease.Field, t.Lease.Key.MessageID, s.Key.MessageID)
		case seen[t.Lease.Field]:
			return fmt.Errorf("%s %s: a settlement writes an invocation once", t.Kind, t.Lease.Field)
		case t.Kind < Finish || t.Kind > Release:
			return fmt.Errorf("unknown transition %s", t.Kind)
		case t.Kind == Retry && t.Backoff < 0:
			return fmt.Errorf("retry %s: backoff %v: must be >= 0", t.Lease.Field, t.Backoff)
		case (t.Kind == Exhaust || t.Kind == DeadLetter) && t.Entry == nil:
			return fmt.Errorf("%s %s: no dead-letter entry", t.Kind, t.Lease.Field)
		case s.Ack && (t.Kind == Retry || t.Kind == Release):
			return fmt.Errorf("%s %s: a settlement that acknowledges leaves no invocation unfinished", t.Kind, t.Lease.Field)
		}
		seen[t.Lease.Field] = true
	}
	return nil
}

// SettleResult is what a StateStore did with one Settlement. Err is nil
// when all of it applied; ErrStale (a transition's lease lost its token:
// another delivery owns the invocation now) or ErrTerminal (the message is
// no longer pending, or its state is retained) when none of it did; any
// other error when the store failed, in which case it may or may not have
// applied (a lost reply). Transitions has one entry per transition of an
// applied settlement, in order.
type SettleResult struct {
	Err         error
	Transitions []TransitionResult
}

// TransitionResult is what one applied transition wrote.
type TransitionResult struct {
	// Next is Retry's next attempt time, on the store's clock.
	Next time.Time
	// DLQID is the id of the dead-letter entry Exhaust or DeadLetter
	// wrote; empty when the transition found it written already (an
	// Exhaust applied before, a DeadLetter of a field marked ":dlq").
	DLQID string
}
