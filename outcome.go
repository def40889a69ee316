package relay

import (
	"fmt"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// Result says how one handler attempt ended, or why it could not start. It
// is the outcome label of relay_invocations_total and the result attribute
// of a function.invoke span (docs/observability.md#metrics).
type Result string

// The results, a closed set.
const (
	// ResultSuccess: the handler exited 0.
	ResultSuccess Result = "success"
	// ResultFailure: the handler exited non-zero (or returned an error).
	ResultFailure Result = "failure"
	// ResultTimeout: the handler was killed at its rule's timeout.
	ResultTimeout Result = "timeout"
	// ResultOOM: the handler was killed at its memory limit.
	ResultOOM Result = "oom"
	// ResultUnavailable: the runtime could not run the app now (image
	// missing, containerd down); no attempt was charged.
	ResultUnavailable Result = "unavailable"
	// ResultError: the run failed for another reason outside the handler,
	// or its outcome was lost; see the log line.
	ResultError Result = "error"
	// ResultLost: an earlier attempt whose worker stopped or stalled
	// mid-run; a later claim found its lease expired and charged it.
	ResultLost Result = "lost"
)

// OutcomeKind is what a delivery did with one invocation
// (docs/delivery.md#outcomes). The first four are terminal: the invocation
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
	// WriteFailed: recording a transition, writing a dead-letter entry or
	// claiming failed (Op names which); the next delivery reads the state
	// again.
	WriteFailed
)

var outcomeKindNames = map[OutcomeKind]string{
	Succeeded: "succeeded", DeadLettered: "dead-lettered", Done: "done", Dropped: "dropped",
	Retrying: "retrying", NotDue: "not due", Leased: "leased", Unavailable: "unavailable",
	NoSlot: "no slot", Stopping: "stopping", NotRun: "not run", OutcomeUnknown: "outcome unknown",
	WriteFailed: "write failed",
}

func (k OutcomeKind) String() string {
	if s, ok := outcomeKindNames[k]; ok {
		return s
	}
	return fmt.Sprintf("OutcomeKind(%d)", int(k))
}

// Terminal reports whether an invocation with this outcome lets its message
// be acknowledged.
func (k OutcomeKind) Terminal() bool { return k >= Succeeded && k <= Dropped }

// Outcome is what one delivery did with one invocation: the value the
// invoke stage returns, which the Engine reports once to its observers (log,
// metrics, cluster stats, trace) and which settles the message.
type Outcome struct {
	Kind         OutcomeKind
	App, Handler string
	// Attempt is the attempt this delivery ran, or the last one recorded;
	// MaxAttempts is the rule's retries + 1 (0 when not known).
	Attempt, MaxAttempts int
	// Result says how the attempt ended when this delivery ran a handler
	// or failed to start one; empty otherwise.
	Result Result
	// Duration is how long the handler ran (with its runtime's setup).
	Duration time.Duration
	// Err is the runner's error for a failed or unfinished run, or the
	// store's or DLQ's error for WriteFailed. A write that failed after a
	// run (giving an attempt back, say) is in WriteErr.
	Err      error
	WriteErr error
	// Op names the write that failed for WriteFailed: claim, finish,
	// retry, exhaust, dlq, mark_dlq, release or record.
	Op string
	// Next is the earliest next attempt (Retrying, NotDue) or the end of
	// the running lease (Leased).
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
	// Settled is set when recording this outcome also acknowledged the
	// message and retained its state (Settler.FinishSettle): it was the
	// last invocation to finish.
	Settled bool

	// span is the attempt's function.invoke span when a handler ran;
	// reporting the outcome ends it.
	span trace.Span
}

// field is the invocation's field in its message's state hash.
func (o Outcome) field() string { return o.App + "/" + o.Handler }
