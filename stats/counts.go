package stats

import "time"

// DefaultFlushInterval is how often a worker adds what it counted to the
// hash.
const DefaultFlushInterval = time.Second

// Counts are the cluster-wide counters of one stream and consumer group.
type Counts struct {
	// Received counts delivered stream entries.
	Received int64
	// Matched, Unmatched and Malformed classify them.
	Matched, Unmatched, Malformed int64
	// Successes and Failures count handler attempts that ran: Failures are
	// the ones that exited non-zero, timed out or were killed, and the ones
	// lost with their worker (charged when their lease expired). Attempts
	// that could not run (app unavailable, runtime down) count in neither.
	Successes, Failures int64
	// Retries counts failed attempts scheduled for another try, lost ones
	// (charged when their lease expired) included.
	Retries int64
	// DLQEntries counts dead-letter entries written.
	DLQEntries int64
	// Replays and ReplayFailures count the dead-letter replays of relay
	// console: replays whose handler succeeded (the entry was deleted),
	// and replays that failed or were refused (the entry was kept). They
	// are not deliveries, so no other counter counts them.
	Replays, ReplayFailures int64
	// Superseded counts invocations not run because a newer event with
	// their debounce key was recorded (docs/flow-control.md#debounce).
	Superseded int64
}

// Counter names one of the counters.
type Counter int

// The counters, in the order of Counts.
const (
	Received Counter = iota
	Matched
	Unmatched
	Malformed
	Successes
	Failures
	Retries
	DLQEntries
	Replays
	ReplayFailures
	Superseded
	// NumCounters is the number of counters: every Counter is below it.
	NumCounters
)
