package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stats"
)

// Defaults of Config. The reference binary fixes the timing ones
// (docs/operations.md#configuration); the library exposes them so tests and
// embedders can shrink them.
const (
	// DefaultConcurrency is the worker-global bound on concurrent
	// invocations (MAX_CONCURRENCY).
	DefaultConcurrency = 8
	// DefaultConcurrencyWait bounds how long an invocation waits for a
	// concurrency slot before its message is left pending
	// (docs/delivery.md#attempts-retries-backoff). It matches the reclaim
	// cadence: a message that gives up waits for a reclaim after
	// MinPendingIdle, so a short wait turns a burst on one app into
	// minute-long delays.
	DefaultConcurrencyWait = 30 * time.Second
	// DefaultMinPendingIdle is how long an entry stays pending before
	// XAUTOCLAIM takes it (docs/delivery.md#from-entry-to-acknowledgement).
	DefaultMinPendingIdle = time.Minute
	// DefaultReclaimInterval is the reclaim cadence.
	DefaultReclaimInterval = 30 * time.Second
	// DefaultLeaseGrace is added to a rule's timeout to form the running
	// lease, covering container start and teardown.
	DefaultLeaseGrace = 30 * time.Second
	// DefaultShutdownTimeout bounds how long Run waits for running
	// invocations after its context is cancelled.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultRetention is how long a finished message's invocation state is
	// kept after it left the PEL: 48h (docs/delivery.md#invocation-state).
	DefaultRetention = invocation.DefaultRetention
	// DeleteOnAck as Config.Retention keeps no invocation state after the
	// ack: a message's hash is deleted in the script that acknowledges it
	// (REDIS_INVOCATION_RETENTION=0, docs/delivery.md#invocation-state).
	// A negative sentinel, as Disabled is for the other retentions; any
	// other negative Retention is an error.
	DeleteOnAck time.Duration = -2
	// DefaultWriteTimeout bounds the retries of one write that records an
	// outcome (state, dead-letter entry, acknowledgement), so a Redis
	// restart as a handler finishes does not lose its result.
	DefaultWriteTimeout = 10 * time.Second
	// DefaultMaxEventBytes is the largest "event" field decoded
	// (MAX_EVENT_BYTES); a larger one is dead-lettered undecoded.
	DefaultMaxEventBytes = 1 << 20
	// DefaultSettleLinger is how long the first settlement of a read waits
	// for the others of the read (Config.SettleLinger).
	DefaultSettleLinger = 2 * time.Millisecond
	// DefaultStatsInterval is how often an Engine adds what it counted to
	// the cluster-wide counters (Config.Stats).
	DefaultStatsInterval = stats.DefaultFlushInterval
	// DefaultMaxWaiting is how many messages an Engine keeps for their
	// next step's time (Config.MaxWaiting).
	DefaultMaxWaiting = 10_000
	// DefaultThrottlePoll is how often a worker tries again an invocation
	// throttled by its rule's cross-worker concurrency (Config.ThrottlePoll).
	DefaultThrottlePoll = 100 * time.Millisecond
)

// DefaultBackoff is the fixed retry schedule after the 1st, 2nd, 3rd and
// later failed attempts (docs/delivery.md#attempts-retries-backoff):
// invocation.DefaultBackoff.
var DefaultBackoff = invocation.DefaultBackoff

// Config holds an Engine's tunables. The zero value is the production
// configuration: every zero field takes its default. A negative duration
// or count is an error naming the field.
type Config struct {
	// MaxConcurrency bounds concurrent invocations; each app's bound is
	// min(its concurrency, MaxConcurrency). The Engine holds at most twice
	// as many messages, so that messages waiting for one app's slot do not
	// starve other apps. Default: Limiter.Max() when Limiter is set, else
	// DefaultConcurrency. With a Limiter, at most Limiter.Max().
	MaxConcurrency int
	// Limiter, when set, is where the Engine takes invocation slots,
	// shared with the other Engines of a worker (one per stream). Default:
	// the Engine's own Limiter of MaxConcurrency slots.
	Limiter *Limiter
	// ConcurrencyWait bounds the wait for a concurrency slot. Default:
	// DefaultConcurrencyWait.
	ConcurrencyWait time.Duration
	// MinPendingIdle is the reclaim threshold; when set, at least 1ms
	// (Redis counts idle times in milliseconds). Default:
	// DefaultMinPendingIdle.
	MinPendingIdle time.Duration
	// ReclaimInterval is how often idle pending entries are reclaimed.
	// Default: DefaultReclaimInterval, or MinPendingIdle/2 when shorter.
	ReclaimInterval time.Duration
	// HeartbeatInterval is how often the Engine resets the PEL idle time of
	// the messages it holds; it must be shorter than MinPendingIdle.
	// Default: MinPendingIdle/3.
	HeartbeatInterval time.Duration
	// LeaseGrace is added to a rule's timeout to form its running lease; a
	// lease that expires counts as a failed attempt. An attempt whose claim
	// took half of it or more is given back unrun (docs/delivery.md#leases),
	// so it must be well above twice a claim's round trip to Redis: a grace
	// of a few milliseconds gives every attempt back, and one under 1ms is
	// refused. Default: DefaultLeaseGrace.
	LeaseGrace time.Duration
	// ShutdownTimeout bounds how long Run lets running invocations finish
	// after its context is cancelled; then they are abandoned and their
	// messages stay pending. Their contexts are cancelled, and Run still
	// waits for every handler to return: a Go function (runtime.Func)
	// that ignores its context keeps Run from returning until it does,
	// and its success, if it succeeds within its rule's timeout, is
	// recorded (docs/embedding.md#go-handlers).
	// Default: DefaultShutdownTimeout.
	ShutdownTimeout time.Duration
	// Retention is the TTL of a message's invocation state after the
	// message left the PEL (REDIS_INVOCATION_RETENTION); DeleteOnAck
	// deletes it with the ack instead. A stale delivery stays inert either
	// way (docs/delivery.md#invocation-state). Default: DefaultRetention.
	Retention time.Duration
	// SettleLinger bounds how long a claim or a settlement waits for those
	// of other deliveries made ready with it (the messages of one read),
	// to go with them in one StateStore call
	// (docs/delivery.md#batched-transitions). It cannot be turned off, and
	// must be under half of WriteTimeout (so a WriteTimeout of 4ms or less
	// needs a shorter SettleLinger too). Default: DefaultSettleLinger.
	SettleLinger time.Duration
	// WriteTimeout bounds the retries of one outcome write; writes share
	// deadlines, so one may run up to 10ms (or 1/64 of a shorter
	// WriteTimeout) longer (docs/embedding.md#config). Default:
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// Backoff is the retry schedule: entry i is the wait after the (i+1)th
	// failed attempt; the last entry repeats. Every entry must be > 0.
	// Default: DefaultBackoff.
	Backoff []time.Duration
	// Logger receives the Engine's log lines; each carries a stream
	// attribute. Default: slog.Default().
	Logger *slog.Logger
	// Metrics is where the Engine registers its Prometheus collectors
	// (docs/observability.md#metrics). Default: none (kept, not exported).
	Metrics prometheus.Registerer
	// TracerProvider is where the Engine's spans go
	// (docs/observability.md#traces). Default: otel.GetTracerProvider(),
	// which records nothing unless the program installs a provider; trace
	// context found in stream entries is still handed on to handlers
	// (TRACEPARENT) and DLQ entries.
	TracerProvider trace.TracerProvider
	// Stats, when set, keeps the cluster-wide counters of relay stats. The
	// Engine counts in memory and flushes every StatsInterval and once more
	// when Run returns; a failed write is logged and retried with the next,
	// never charged to a message. Default: none.
	Stats Stats
	// StatsInterval is how often Stats is flushed. Default:
	// DefaultStatsInterval.
	StatsInterval time.Duration
	// MaxEventBytes bounds the "event" field the Engine decodes; a larger
	// event is dead-lettered once, undecoded, with a summary in place of
	// its payload, and acknowledged (docs/delivery.md#oversized-events).
	// Default: DefaultMaxEventBytes; a negative value means no limit.
	MaxEventBytes int
	// MaxWaiting bounds the messages the Engine keeps for the time of their
	// next step, a retry's due time or the end of another delivery's lease,
	// and delivers again at that time, within a second of it, rather than
	// when a reclaim finds them idle (docs/delivery.md#attempts-retries-backoff).
	// They stay pending and owned, heartbeated while kept; one that finds
	// the bound reached waits for a reclaim, as does every message after a
	// crash. A negative value keeps none: retries then run when the reclaim
	// (MinPendingIdle, every ReclaimInterval) finds them due. Each kept
	// message holds its entry in memory. Default: DefaultMaxWaiting.
	MaxWaiting int
	// ThrottlePoll is how soon an invocation whose rule's concurrency
	// slots across workers are all held is claimed again: a slot freed by
	// another worker is seen within it (docs/flow-control.md#waiting). The
	// waiters of one rule and limit key are spread a ThrottlePoll ÷ slots
	// apart, so a backlog costs the store slots ÷ ThrottlePoll claims a
	// second, not one per waiter. Default: DefaultThrottlePoll.
	ThrottlePoll time.Duration
	// OnOutcome, when set, is told every invocation outcome once, after
	// the Engine's own log line, metrics, cluster stats and span
	// (docs/observability.md); messageID is the stream entry's id. It runs
	// on the delivery's goroutine before the message is settled, so it
	// must return quickly and must not keep o.Err for long. Default: none.
	OnOutcome func(ctx context.Context, messageID string, o Outcome)
}

// withDefaults returns c with every zero field set, or an error naming each
// invalid field.
func (c Config) withDefaults() (Config, error) {
	if err := c.check(); err != nil {
		return c, err
	}
	orDefault := func(d *time.Duration, def time.Duration) {
		if *d == 0 {
			*d = def
		}
	}
	if c.MaxConcurrency == 0 {
		c.MaxConcurrency = DefaultConcurrency
		if c.Limiter != nil {
			c.MaxConcurrency = c.Limiter.Max()
		}
	}
	if c.Limiter != nil && c.MaxConcurrency > c.Limiter.Max() {
		// The Engine would read and hold messages no slot can run, which
		// then wait ConcurrencyWait and stay pending until a reclaim.
		return c, fmt.Errorf("relay: Config.MaxConcurrency: %d is over Limiter.Max() %d, so the Engine could never run that many; lower it, or leave it 0 for Limiter.Max()",
			c.MaxConcurrency, c.Limiter.Max())
	}
	orDefault(&c.ConcurrencyWait, DefaultConcurrencyWait)
	orDefault(&c.MinPendingIdle, DefaultMinPendingIdle)
	orDefault(&c.ReclaimInterval, min(DefaultReclaimInterval, c.MinPendingIdle/2))
	orDefault(&c.HeartbeatInterval, c.MinPendingIdle/3)
	orDefault(&c.LeaseGrace, DefaultLeaseGrace)
	orDefault(&c.ShutdownTimeout, DefaultShutdownTimeout)
	if orDefault(&c.Retention, DefaultRetention); c.Retention == DeleteOnAck {
		c.Retention = 0 // the stores' "delete" (invocation.CheckRetention)
	}
	orDefault(&c.WriteTimeout, DefaultWriteTimeout)
	lingerSet := c.SettleLinger != 0
	orDefault(&c.SettleLinger, DefaultSettleLinger)
	orDefault(&c.StatsInterval, DefaultStatsInterval)
	orDefault(&c.ThrottlePoll, DefaultThrottlePoll)
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = DefaultMaxEventBytes
	}
	switch {
	case c.MaxWaiting == 0:
		c.MaxWaiting = DefaultMaxWaiting
	case c.MaxWaiting < 0:
		c.MaxWaiting = 0
	}
	if c.SettleLinger >= c.WriteTimeout/2 {
		// A settlement waits for its batch within its write's deadline.
		if !lingerSet {
			// Name the field that was set: the linger is the default.
			return c, fmt.Errorf("relay: Config.WriteTimeout: %s must be over twice SettleLinger %s (the default; lower it too)", c.WriteTimeout, c.SettleLinger)
		}
		return c, fmt.Errorf("relay: Config.SettleLinger: %s must be under half of WriteTimeout %s", c.SettleLinger, c.WriteTimeout)
	}
	if c.HeartbeatInterval >= c.MinPendingIdle {
		return c, fmt.Errorf("relay: Config.HeartbeatInterval: %s must be shorter than MinPendingIdle %s", c.HeartbeatInterval, c.MinPendingIdle)
	}
	if len(c.Backoff) == 0 {
		c.Backoff = DefaultBackoff
	}
	c.Backoff = append([]time.Duration(nil), c.Backoff...)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.Limiter == nil {
		c.Limiter, _ = NewLimiter(c.MaxConcurrency) // > 0 here
	}
	return c, nil
}

// check names every invalid field of c.
func (c Config) check() error {
	var errs []error
	nonNegative := func(name string, d time.Duration) {
		if d < 0 {
			errs = append(errs, fmt.Errorf("relay: Config.%s: must be >= 0 (0 means the default), got %s", name, d))
		}
	}
	if c.MaxConcurrency < 0 {
		errs = append(errs, fmt.Errorf("relay: Config.MaxConcurrency: must be >= 0 (0 means the default), got %d", c.MaxConcurrency))
	}
	// atLeastMs refuses a duration set below a millisecond: Redis counts
	// idle times and leases in milliseconds, and such a value is most often
	// a bare number meant as seconds (MinPendingIdle: 60 is 60ns). A
	// MinPendingIdle under 3ns would also derive a zero heartbeat and
	// reclaim interval, which panics in time.NewTicker.
	atLeastMs := func(name string, d time.Duration) {
		if d > 0 && d < time.Millisecond {
			errs = append(errs, fmt.Errorf("relay: Config.%s: must be 0 (the default) or at least 1ms, got %s (a time.Duration: write 2 * time.Second, not 2)", name, d))
		}
	}
	nonNegative("ConcurrencyWait", c.ConcurrencyWait)
	nonNegative("MinPendingIdle", c.MinPendingIdle)
	atLeastMs("MinPendingIdle", c.MinPendingIdle)
	atLeastMs("LeaseGrace", c.LeaseGrace)
	nonNegative("SettleLinger", c.SettleLinger)
	nonNegative("ReclaimInterval", c.ReclaimInterval)
	atLeastMs("ReclaimInterval", c.ReclaimInterval) // a loop of XAUTOCLAIM otherwise
	nonNegative("HeartbeatInterval", c.HeartbeatInterval)
	atLeastMs("HeartbeatInterval", c.HeartbeatInterval)
	nonNegative("LeaseGrace", c.LeaseGrace)
	nonNegative("ShutdownTimeout", c.ShutdownTimeout)
	nonNegative("ThrottlePoll", c.ThrottlePoll)
	atLeastMs("ThrottlePoll", c.ThrottlePoll)
	if c.Retention != DeleteOnAck {
		nonNegative("Retention", c.Retention)
		if c.Retention > 0 && c.Retention < time.Millisecond {
			// TTLs are in milliseconds: the stores would refuse every
			// settlement (invocation.CheckRetention) at run time, after
			// the handler ran.
			errs = append(errs, fmt.Errorf("relay: Config.Retention: must be DeleteOnAck, 0 (the default) or at least 1ms, got %s", c.Retention))
		}
	}
	nonNegative("WriteTimeout", c.WriteTimeout)
	nonNegative("StatsInterval", c.StatsInterval)
	for i, d := range c.Backoff {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("relay: Config.Backoff[%d]: must be > 0, got %s", i, d))
		}
	}
	return errors.Join(errs...)
}
