package relay

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/invocation"
)

// AttemptResult says how one handler attempt ended, or why it could not
// start. It is the outcome label of relay_invocations_total and the result
// attribute of a function.invoke span (docs/observability.md#metrics).
// ResultOf derives it from a Runner's error; a runtime.Result is only the
// run's duration, and a manual.Result one run by hand.
type AttemptResult string

// The results, a closed set.
const (
	// ResultSuccess: the handler exited 0.
	ResultSuccess AttemptResult = "success"
	// ResultFailure: the handler exited non-zero (or returned an error).
	ResultFailure AttemptResult = "failure"
	// ResultTimeout: the handler was killed at its rule's timeout.
	ResultTimeout AttemptResult = "timeout"
	// ResultOOM: the handler was killed at its memory limit.
	ResultOOM AttemptResult = "oom"
	// ResultUnavailable: the runtime could not run the app now (image
	// missing, containerd down); no attempt was charged.
	ResultUnavailable AttemptResult = "unavailable"
	// ResultError: the run failed for another reason outside the handler,
	// or its outcome was lost; see the log line.
	ResultError AttemptResult = "error"
	// ResultLost: an earlier attempt whose worker stopped or stalled
	// mid-run; a later claim found its lease expired and charged it.
	ResultLost AttemptResult = "lost"
)

// OutcomeKind is what a delivery did with one invocation
// (docs/delivery.md#outcomes). The first five (Kind.Terminal) are terminal: the invocation
// needs nothing more, so it does not hold its message. Every other kind
// leaves the message pending for a later delivery.
type OutcomeKind int

const (
	// Succeeded: the handler ran and its success is recorded.
	Succeeded OutcomeKind = iota + 1
	// DeadLettered: the invocation is exhausted and its dead-letter entry
	// is written and recorded.
	DeadLettered
	// Done: an earlier delivery finished the invocation (succeeded or
	// dead-lettered) or its message's state is already retained.
	Done
	// Dropped: an unfinished invocation of a handler that is no longer
	// declared, which never had an attempt charged, was dropped with its
	// rule.
	Dropped
	// Superseded: a newer event with the same debounce key runs instead,
	// and is recorded (docs/flow-control.md#debounce); nothing ran.
	Superseded

	// Retrying: the handler failed; the next attempt is recorded for Next.
	Retrying
	// NotDue: the next attempt is not due before Next.
	NotDue
	// Leased: an earlier delivery holds the running lease until Next.
	Leased
	// Unavailable: the app has template errors; nothing ran.
	Unavailable
	// NoSlot: no concurrency slot freed within the wait; nothing ran.
	NoSlot
	// Stopping: the Engine is shutting down; nothing ran.
	Stopping
	// NotRun: the runtime could not run the handler, or the shutdown
	// timeout stopped it; the attempt was given back uncharged.
	NotRun
	// OutcomeUnknown: the handler may have run but its result was lost;
	// its lease is kept, and counts as a failed attempt when it expires.
	OutcomeUnknown
	// Throttled: a limit of the rule's (its concurrency across workers,
	// its rate) lets no attempt start before Next; nothing ran and no
	// attempt is charged. Reason names the limit
	// (docs/flow-control.md).
	Throttled
	// Debounced: the invocation waits for its debounce period to end at
	// Next, in case a newer event with its key supersedes it.
	Debounced
	// Gone: the message left the consumer group's PEL while its handler
	// ran, or before its claim (another consumer acknowledged it, or Redis
	// lost its data); a running handler was stopped, and nothing of it is
	// recorded.
	Gone
	// WriteFailed: recording a transition, writing a dead-letter entry or
	// claiming failed (Outcome.WriteErr says which); the next delivery
	// reads the state again.
	WriteFailed
)

var outcomeKindNames = map[OutcomeKind]string{
	Succeeded: "succeeded", DeadLettered: "dead-lettered", Done: "done", Dropped: "dropped", Superseded: "superseded",
	Throttled: "throttled", Debounced: "debounced",
	Retrying: "retrying", NotDue: "not due", Leased: "leased", Unavailable: "unavailable",
	NoSlot: "no slot", Stopping: "stopping", NotRun: "not run", OutcomeUnknown: "outcome unknown",
	Gone: "gone", WriteFailed: "write failed",
}

func (k OutcomeKind) String() string {
	if s, ok := outcomeKindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("OutcomeKind(%d)", int(k))
}

// Terminal reports whether an invocation with this outcome lets its message
// be acknowledged.
func (k OutcomeKind) Terminal() bool { return k >= Succeeded && k <= Superseded }

// Outcome is what one delivery did with one invocation: the value the
// claim and run stage (attempt.go) returns, which the Engine reports once
// to its observers (log, metrics, cluster stats, trace) and from which the
// decide stage (settle.go) says whether the message is acknowledged.
type Outcome struct {
	Kind         OutcomeKind
	App, Handler string
	// Attempt is the attempt this delivery ran, or the last one recorded;
	// MaxAttempts is the rule's retries + 1 (0 when not known).
	Attempt, MaxAttempts int
	// Result says how the attempt ended when this delivery ran a handler
	// or failed to start one; empty otherwise.
	Result AttemptResult
	// Duration is how long the handler ran (with its runtime's setup).
	Duration time.Duration
	// Err is why the attempt failed or did not run: the runner's error,
	// the app's template errors (Unavailable), or the reason an attempt was
	// given back before it ran.
	Err error
	// WriteErr is the write that failed, for WriteFailed, or that failed
	// without changing the kind (giving an attempt back); nil otherwise.
	WriteErr *WriteError
	// Next is the earliest next attempt (Retrying, NotDue, Throttled,
	// Debounced) or the end of the running lease (Leased).
	Next time.Time
	// DLQID and Reason describe the entry written for DeadLettered.
	DLQID, Reason string
	// Lost is an earlier attempt this delivery found lost (its worker
	// stopped mid-run) and charged as failed; 0 when none.
	Lost int
	// Waited is set when the invocation had to wait for a concurrency slot.
	Waited bool
	// Orphan is set for an unfinished invocation whose app or rule is no
	// longer loaded.
	Orphan bool

	// span is the attempt's function.invoke span when a handler ran;
	// reporting the outcome ends it.
	span trace.Span
}

// field is the invocation's field in its message's state hash.
func (o Outcome) field() string { return invocation.Field(o.App, o.Handler) }

// Op names a write that records what a delivery did (the op attribute of
// its log line).
type Op int

// The writes.
const (
	OpClaim   Op = iota + 1 // StateStore.Claim (a probe too)
	OpRelease               // a Release settled: an attempt given back
	OpFinish                // a Finish settled
	OpRetry                 // a Retry settled
	OpExhaust               // an Exhaust settled, with its dead-letter entry
	OpDLQ                   // a DeadLetter settled: the entry of an exhausted invocation
)

var opNames = [...]string{OpClaim: "claim", OpRelease: "release", OpFinish: "finish", OpRetry: "retry",
	OpExhaust: "exhaust", OpDLQ: "dlq"}

func (op Op) String() string {
	if op > 0 && int(op) < len(opNames) {
		return opNames[op]
	}
	return fmt.Sprintf("Op(%d)", int(op))
}

// WriteError is a write that failed: which one, and the store's or the
// DLQ's error (invocation.ErrStale and invocation.ErrTerminal among them).
type WriteError struct {
	Op  Op
	Err error
}

func (e *WriteError) Error() string { return e.Op.String() + ": " + e.Err.Error() }

func (e *WriteError) Unwrap() error { return e.Err }

// failed sets o to WriteFailed by the write op's error err.
func (o *Outcome) failed(op Op, err error) {
	o.Kind, o.WriteErr = WriteFailed, &WriteError{Op: op, Err: err}
}
