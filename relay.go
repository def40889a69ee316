package relay

import (
	"context"
	"time"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stream"
)

// The four parts an Engine wires (docs/embedding.md#engine), and the
// counters it may keep. Each has a production implementation in its own
// package and an in-memory fake in relaytest; the contract suites of
// relaytest run against both.

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
// consumer (docs/delivery.md#from-entry-to-acknowledgement). It neither
// publishes nor acknowledges: producers write to the stream on their own,
// and a message is acknowledged by the StateStore's Settle, in the same
// step as its last transitions. Implementations are safe for concurrent
// use.
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
	// Heartbeat resets the idle time of the entries of ids this consumer is
	// still working on, so that no other consumer reclaims live work, and
	// returns the ids that are no longer pending in the group
	// (acknowledged, or lost with Redis's data): the Engine ends what it
	// runs for them (docs/delivery.md#concurrency-and-heartbeat).
	Heartbeat(ctx context.Context, ids ...string) (gone []string, err error)
}

// StateStore keeps durable per-invocation state and settles messages
// (docs/delivery.md#invocation-state): it decides claims, and it applies
// each Settlement, the transitions of one message's invocations with their
// dead-letter entries and, once every invocation is terminal, the
// message's acknowledgement and the retention of its state, atomically
// per message. Claim and Settle take batches: the Engine gathers the
// claims and the settlements of concurrent deliveries and hands each
// batch over in one call (docs/delivery.md#batched-transitions). Every
// transition is fenced: a settlement one of whose leases lost its token
// fails with invocation.ErrStale, one of a message no longer pending, or
// of retained state, with invocation.ErrTerminal, and then nothing of it
// applied. Implementations are safe for concurrent use.
//
// Trace lineage (docs/observability.md#traces) rides on the transitions:
// the Engine sets Lease.Trace to the traceparent of the attempt's span in
// the Retry, Exhaust and Release that end it, and expects the next claim
// of that invocation (on any worker) to return it in Claim.PrevTrace. It
// is opaque to the store. A store that ignores it loses only the links
// between retry spans.
type StateStore interface {
	// Claim decides each of reqs: whether its delivery may run a new
	// attempt of the invocation (recording it running with a deadline of
	// now+Lease on the store's clock) or, for a Probe, records it due
	// uncharged. A running lease that expired counts as a failed attempt;
	// when that attempt was the last the invocation becomes Exhausted.
	// It returns one result per request, in order.
	Claim(ctx context.Context, reqs []invocation.ClaimRequest) []invocation.ClaimResult
	// Settle applies each of ss atomically (see invocation.Settlement) and
	// returns one result per settlement, in order.
	Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult
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

// Stats keeps the cluster-wide counters and the outcome feed of relay
// stats and the console (docs/delivery.md#cluster-wide-counters). Add and
// Record only count in memory and never wait; Flush writes what was
// counted, keeping it for the next Flush when it fails. redisstats.Recorder
// implements it on Redis. Safe for concurrent use.
type Stats interface {
	Add(c stats.Counter)
	Record(ev stats.Event)
	Flush(ctx context.Context) error
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
// lease whose expiry charges an attempt: redisstate.Store.Void says how.
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
