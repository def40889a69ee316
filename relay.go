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

// Matcher classifies one external event (events.md "Pattern syntax",
// "Combining conditions").
type Matcher interface {
	// Match returns every (app, rule) target the event matches, apps in
	// sorted name order and rules in declaration order; an empty result
	// means unmatched. event is the raw value of the entry's "event" field.
	// The error wraps matcher.ErrMalformed when event is not a JSON object.
	// Safe for concurrent use.
	Match(event []byte) ([]matcher.Target, error)
}

// StreamSource reads a Redis Stream through one consumer group
// (events.md "Delivery, retry, and ACK").
type StreamSource interface {
	// Read returns up to count new entries for this consumer, blocking at
	// most a few seconds; it returns (nil, nil) when none arrived.
	Read(ctx context.Context, count int) ([]stream.Message, error)
	// Reclaim takes over entries idle for at least minIdle (XAUTOCLAIM),
	// walking the cursor once around the PEL. deleted lists PEL ids whose
	// stream entry no longer exists; their references are cleared.
	Reclaim(ctx context.Context, minIdle time.Duration) (msgs []stream.Message, deleted []string, err error)
	// Ack acknowledges ids (XACK). Acking an unknown id is not an error.
	Ack(ctx context.Context, ids ...string) error
	// Publish appends an entry and returns its id (XADD).
	Publish(ctx context.Context, fields map[string]string) (string, error)
}

// Heartbeater is an optional StreamSource capability: it resets the PEL idle
// time of entries this consumer is still working on, so other consumers do
// not reclaim live work.
type Heartbeater interface {
	Heartbeat(ctx context.Context, ids ...string) error
}

// Sweeper is an optional Runner capability: it removes what earlier or
// failed invocations left behind (containers whose removal failed while the
// runtime was down, leftovers of a crashed process) without touching
// invocations in flight. The Engine calls it at start and then every sweep
// interval.
//
// Optional capabilities are found by type assertion on the value passed in
// Components, so a wrapper (a Runner that adds a circuit breaker, a
// StreamSource that adds logging) hides them unless it implements them
// too and forwards the call; examples/custom-runner shows one that does.
// Two speed-ups apply only to the package's own components, unwrapped: a
// *stream.Source and an *invocation.Store on one client share the XACK and
// the switch to retention in one round trip, and a *stream.Source reclaims
// only as many entries as the Engine has free slots for.
type Sweeper interface {
	Sweep(ctx context.Context) error
}

// Pinger is an optional capability of a component that can check its
// backend (relay health, /readyz).
type Pinger interface {
	Ping(ctx context.Context) error
}

// StateStore keeps durable per-invocation state, one method per transition
// (events.md "Invocation state persistence"). Every transition on a lease
// returns invocation.ErrStale when the lease lost its fencing token and
// invocation.ErrTerminal when the hash is retained. Implementations are safe
// for concurrent use.
//
// Trace lineage (reference.md "Observability") rides on the existing
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
	Claim(ctx context.Context, key invocation.Key, field string, lease time.Duration, maxAttempts int) (invocation.Claim, error)
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
	// is not final: running, waiting for a retry, or exhausted without a
	// recorded DLQ entry; none once retained. On a redelivery the Engine
	// drives these too, even when the event no longer matches their rule
	// (a now() cutoff passed, a template changed), so that no message is
	// acknowledged while an invocation is unresolved (events.md
	// "Guarantees summary").
	Unfinished(ctx context.Context, key invocation.Key) ([]string, error)
}

// Runner runs one attempt of one invocation (DESIGN.md "Handler contract").
// It returns nil on success, an error wrapping *runtime.ExitError when the
// handler failed (an attempt is used), and any other error for an
// infrastructure failure (no attempt is charged; wrap runtime.ErrUnavailable
// when the app cannot run at all right now). Safe for concurrent use.
type Runner interface {
	Run(ctx context.Context, req runtime.Request) (runtime.Result, error)
}

// DLQWriter persists one dead-letter entry (events.md "Dead-letter queue")
// and returns its id. Safe for concurrent use.
type DLQWriter interface {
	Write(ctx context.Context, e dlq.Entry) (string, error)
}
