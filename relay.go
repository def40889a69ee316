package relay

import (
	"context"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// The five parts an Engine wires (docs/embedding.md#engine). Each has a
// production implementation in its own package and an in-memory fake in
// relaytest; the contract suites of relaytest run against both.

// Matcher classifies one external event (docs/apps.md#patterns).
type Matcher interface {
	// Match returns every (app, rule) target the event matches, apps in
	// sorted name order and rules in declaration order; an empty result
	// means unmatched. event is the raw value of the entry's "event" field.
	// The error wraps matcher.ErrMalformed when event is not a JSON object.
	// Safe for concurrent use.
	Match(event []byte) ([]matcher.Target, error)
}

// StreamSource consumes one stream through one consumer group as one
// consumer (docs/delivery.md#from-entry-to-acknowledgement). It never
// publishes: producers write to the stream on their own. Implementations
// are safe for concurrent use.
type StreamSource interface {
	// Read returns up to count new entries for this consumer, blocking at
	// most a few seconds; it returns (nil, nil) when none arrived.
	Read(ctx context.Context, count int) ([]stream.Message, error)
	// Reclaim takes over at most max (> 0) entries that have been pending
	// for at least minIdle, whoever holds them (XAUTOCLAIM). Successive
	// calls walk the PEL from where the last one stopped; done reports that
	// this call reached its end, so the next starts over. deleted lists PEL
	// ids whose stream entry no longer exists; their references are
	// cleared.
	Reclaim(ctx context.Context, minIdle time.Duration, max int) (msgs []stream.Message, deleted []string, done bool, err error)
	// Ack acknowledges ids (XACK). Acking an unknown id is not an error.
	Ack(ctx context.Context, ids ...string) error
	// Heartbeat resets the idle time of entries this consumer is still
	// working on, so that no other consumer reclaims live work. Ids that
	// are no longer pending are ignored.
	Heartbeat(ctx context.Context, ids ...string) error
}

// StateStore keeps durable per-invocation state, one method per transition
// (docs/delivery.md#invocation-state). Every transition on a lease returns
// invocation.ErrStale when the lease lost its fencing token and
// invocation.ErrTerminal when the hash is retained. Implementations are safe
// for concurrent use.
//
// Trace lineage (docs/observability.md#traces) rides on the existing
// transitions: the Engine sets Lease.Trace to the traceparent of the
// attempt's span before Release, ScheduleRetry or Exhaust, and expects the
// next Claim of that invocation (on any worker) to return the latest one
// stored in Claim.PrevTrace, for Claimed, Exhausted and DeadLettered. It is
// opaque to the store, written only when the transition applies and
// non-empty, and kept under the same retention as the invocation.
// Implementing it is optional: a store that ignores Lease.Trace and never
// sets PrevTrace loses only the links between retry spans.
type StateStore interface {
	// Claim decides whether this delivery may run a new attempt of the
	// invocation field ("<app>/<handler>") of message key. On Claimed it
	// records running with a deadline of now+lease on the store's clock. A
	// running lease that expired counts as a failed attempt; when that
	// attempt was the last of maxAttempts the invocation becomes Exhausted.
	// rec, given by a message's first delivery only, records its other
	// invocations in the same write (invocation.Record), so a redelivery
	// drives exactly what the message matched at first.
	Claim(ctx context.Context, key invocation.Key, field string, lease time.Duration, maxAttempts int, rec invocation.Record) (invocation.Claim, error)
	// Release gives a claimed attempt back without charging it (the runtime
	// was unavailable or the worker is shutting down).
	Release(ctx context.Context, l invocation.Lease) error
	// Finish records success ("ok").
	Finish(ctx context.Context, l invocation.Lease) error
	// ScheduleRetry records a failed attempt and the earliest time of the
	// next one, now+backoff on the store's clock; it returns that time.
	ScheduleRetry(ctx context.Context, l invocation.Lease, backoff time.Duration) (time.Time, error)
	// Exhaust records a failed last attempt ("exhausted:<attempt>:<token>").
	Exhaust(ctx context.Context, l invocation.Lease) error
	// MarkDLQ records that the DLQ entry of an exhausted invocation is
	// persisted ("exhausted:<attempt>:<token>:dlq"). Idempotent.
	MarkDLQ(ctx context.Context, l invocation.Lease) error
	// Retain switches the message's hash to terminal retention (__terminal
	// plus a TTL of ttl) after the message left the PEL. Idempotent.
	Retain(ctx context.Context, key invocation.Key, ttl time.Duration) error
	// Pin stores value in the reserved field ("__<name>") of key's state
	// unless one is stored already, and returns the stored value: the first
	// caller wins and later deliveries adopt its value. The schedule path
	// pins handler, timeout and retries at first claim ("__schedule").
	// invocation.ErrTerminal on retained state.
	Pin(ctx context.Context, key invocation.Key, field, value string) (string, error)
	// Unfinished returns, sorted, the invocation fields of key whose state
	// is not final: running, waiting for a retry (recorded ones included),
	// or exhausted without a recorded DLQ entry; none once retained. It
	// also says whether the first delivery recorded every invocation of
	// the message (invocation.Record.Complete). On a redelivery the Engine
	// drives these, even when the event no longer matches their rule (a
	// now() cutoff passed, a template changed), so that no message is
	// acknowledged while an invocation is unresolved; when the record is
	// complete it drives exactly these
	// (docs/delivery.md#from-entry-to-acknowledgement).
	Unfinished(ctx context.Context, key invocation.Key) (invocation.Unfinished, error)
}

// Runner runs one attempt of one invocation (docs/apps.md#the-handler-contract).
// It returns nil on success, an error wrapping *runtime.ExitError when the
// handler failed (an attempt is used), and any other error for an
// infrastructure failure (no attempt is charged; wrap runtime.ErrUnavailable
// when the app cannot run at all right now, runtime.ErrOutcomeUnknown when
// the handler may have run but its result was lost). Safe for concurrent
// use.
type Runner interface {
	Run(ctx context.Context, req runtime.Request) (runtime.Result, error)
}

// DLQWriter persists one dead-letter entry (docs/delivery.md#dead-letter-queue)
// and returns its id. It may refuse the entry of a message no longer
// pending in its group with an error wrapping dlq.ErrNotPending, as
// dlq.Writer does WithPELFence: the Engine then treats the delivery as
// stale, as it does a refused transition (docs/delivery.md#invocation-state).
// Safe for concurrent use.
type DLQWriter interface {
	Write(ctx context.Context, e dlq.Entry) (string, error)
}

// Settler is an explicit pairing of a StreamSource and a StateStore that
// can settle a message, its acknowledgement and the last transitions of its
// invocation state, in one step where separate calls would take a round
// trip each (docs/delivery.md#outcomes). Set it in Components.Settler only
// when it acts on the same stream, group and state as the Components'
// Source and State: invocation.Store does for a stream.Source on the same
// Redis client (and, under Redis Cluster, a stream with a hash tag), which
// is how worker.New pairs them.
type Settler interface {
	// Settle acknowledges the message of key and switches its state to
	// retention with a TTL of ttl, in place of Source.Ack then
	// State.Retain. ackErr is the acknowledgement's error; a retainErr
	// after a successful acknowledgement only delays retention (the Engine
	// retries it through State.Retain).
	Settle(ctx context.Context, key invocation.Key, ttl time.Duration) (ackErr, retainErr error)
	// FinishSettle records the success of lease l, the last unfinished
	// invocation of its message, acknowledges the message and switches its
	// state to retention, in place of State.Finish then Settle. Errors are
	// Finish's: invocation.ErrStale and invocation.ErrTerminal, after which
	// nothing was acknowledged.
	FinishSettle(ctx context.Context, l invocation.Lease, ttl time.Duration) error
}

// BatchSettler is an optional Settler capability: it settles the last
// attempts of several messages in one step. The Engine gathers the
// settlements of the messages of one read and hands them over together
// (docs/delivery.md#batched-transitions); without it each goes through
// FinishSettle alone.
type BatchSettler interface {
	// FinishSettleBatch is FinishSettle for each of ls, leases of messages
	// of the Settler's stream and group: it returns one error per lease, in
	// ls's order, each what FinishSettle would have returned for it. ctx
	// carries the values (span, log attributes) of one delivery of the
	// read, the first to join its batch, and the latest of the deliveries'
	// deadlines (none when one has none): a wrapper that traces the call
	// finds it under that delivery's span.
	FinishSettleBatch(ctx context.Context, ls []invocation.Lease, ttl time.Duration) []error
}

// Optional capabilities, found by type assertion on the value passed in
// Components or worker.Config. A wrapper (a Runner that adds a circuit
// breaker, a StreamSource that adds logging) hides them unless it
// implements them too and forwards the call; examples/custom-runner shows
// one that does. Engine.Run logs at start which of them are missing where
// that changes behaviour.

// GroupEnsurer is an optional StreamSource capability: it creates the
// consumer group (from id 0, with the stream) when it does not exist. Without
// it the group must exist before Engine.Run.
type GroupEnsurer interface {
	EnsureGroup(ctx context.Context) error
}

// PendingReporter is an optional StreamSource capability: the size of the
// consumer group's PEL and the age of its oldest entry (XPENDING), for the
// relay_pending_entries and relay_pending_oldest_age_seconds gauges.
type PendingReporter interface {
	Pending(ctx context.Context) (count int64, oldestAge time.Duration, err error)
}

// OwnerChecker is an optional StreamSource capability: which of ids are
// pending and delivered to this consumer. The Engine asks it, every
// reclaim interval, about the messages it holds pending for a reason
// outside them (docs/delivery.md#held-messages), and forgets those that
// another worker took over or acknowledged; without it they stay in its
// held counts until their app is fixed.
type OwnerChecker interface {
	Owned(ctx context.Context, ids []string) (map[string]bool, error)
}

// Sweeper is an optional Runner capability: it removes what earlier or
// failed invocations left behind (containers whose removal failed while the
// runtime was down, leftovers of a crashed process) without touching
// invocations in flight. A worker.Worker calls it at start and then every
// sweep interval.
type Sweeper interface {
	Sweep(ctx context.Context) error
}

// Preparer is an optional Runner capability: Prepare readies what an app
// needs before its handlers run, such as its image
// (docs/runtimes.md#images), its dependency image
// (docs/runtimes.md#dependencies) and its secrets (docs/apps.md#secrets),
// and waits for it until ctx ends. A worker.Worker calls it for every
// available app, at start and whenever a reload finds the app new or
// changed (or not ready before), and waits for it at most
// worker.Config.PrepareWait: a preparation still running then goes on in
// the background, the app is unavailable ("app being prepared") or, on a
// reload, its previous version keeps serving, and the Worker reloads when
// it ends. An error makes the app unavailable with the error as its
// reason, so its messages stay pending, and on a reload the app's previous
// version keeps serving; the next reload prepares it again. Safe for
// concurrent use.
type Preparer interface {
	Prepare(ctx context.Context, app string, spec runtime.Spec) error
}

// ClaimVoider is an optional StateStore capability: it gives back a claim
// whose outcome the Engine did not learn (docs/delivery.md#lost-replies),
// a Claim whose error wraps *invocation.ClaimUnknownError or an attempt
// whose Release failed, knowing only l's Key, Field and Token. Whether or
// not the claim ran, and even when it runs after Void, it must not leave a
// lease whose expiry charges an attempt: invocation.Store.Void says how.
// Idempotent. Without it such a lease expires and is charged as a failed
// attempt that never ran.
type ClaimVoider interface {
	Void(ctx context.Context, l invocation.Lease) error
}

// Pinger is an optional capability of any part that can check its backend
// (relay health, worker.Worker.Ready).
type Pinger interface {
	Ping(ctx context.Context) error
}
