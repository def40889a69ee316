package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/invocation"
)

// Defaults of the Engine's options. The reference binary fixes the timing
// ones (reference.md "Configuration"); the library exposes them so tests and
// embedders can shrink them.
const (
	// DefaultConcurrency is the worker-global bound on concurrent
	// invocations (MAX_CONCURRENCY).
	DefaultConcurrency = 8
	// DefaultConcurrencyWait bounds how long an invocation waits for a
	// concurrency slot before its message is left pending (events.md
	// "Delivery, retry, and ACK"). It matches the reclaim cadence: a
	// message that gives up waits for a reclaim after MinPendingIdle, so a
	// short wait turns a burst on one app into minute-long delays.
	DefaultConcurrencyWait = 30 * time.Second
	// DefaultMinPendingIdle is how long an entry stays pending before
	// XAUTOCLAIM takes it (events.md "Recovery").
	DefaultMinPendingIdle = time.Minute
	// DefaultReclaimInterval is the reclaim cadence.
	DefaultReclaimInterval = 30 * time.Second
	// DefaultLeaseGrace is added to a rule's timeout to form the running
	// lease, covering container start and teardown.
	DefaultLeaseGrace = 30 * time.Second
	// DefaultShutdownTimeout bounds how long Run waits for running
	// invocations after its context is cancelled.
	DefaultShutdownTimeout = 30 * time.Second
	// DefaultSweepInterval is how often the Engine asks a Runner that is a
	// Sweeper to remove leftovers.
	DefaultSweepInterval = time.Minute
	// DefaultRetention is how long a finished message's invocation state is
	// kept after it left the PEL (events.md "Invocation state persistence").
	DefaultRetention = invocation.DefaultRetention
)

// DefaultBackoff is the fixed retry schedule after the 1st, 2nd, 3rd and
// later failed attempts (events.md "Delivery, retry, and ACK"):
// invocation.DefaultBackoff.
var DefaultBackoff = invocation.DefaultBackoff

// Option configures an Engine.
type Option func(*options) error

type options struct {
	concurrency     int
	limiter         *Limiter
	concurrencyWait time.Duration
	minPendingIdle  time.Duration
	reclaimInterval time.Duration
	heartbeat       time.Duration
	leaseGrace      time.Duration
	shutdownTimeout time.Duration
	sweepInterval   time.Duration
	retention       time.Duration
	backoff         []time.Duration
	logger          *slog.Logger
	registerer      prometheus.Registerer
	statsClient     rueidis.Client
	statsInterval   time.Duration
	tracerProvider  trace.TracerProvider
	set             map[string]bool
}

func (o *options) once(name string) error {
	if o.set[name] {
		return fmt.Errorf("relay: %s given twice", name)
	}
	o.set[name] = true
	return nil
}

func positive(name string, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("relay: %s: must be > 0, got %s", name, d)
	}
	return nil
}

// WithConcurrency sets the worker-global bound on concurrent invocations;
// each app's effective bound is min(its concurrency, n). n must be > 0.
// Default: DefaultConcurrency.
func WithConcurrency(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("relay: WithConcurrency: must be > 0, got %d", n)
		}
		o.concurrency = n
		return o.once("WithConcurrency")
	}
}

// WithLimiter makes the Engine take invocation slots from l, shared with
// other Engines (one per stream of a worker), instead of its own Limiter of
// WithConcurrency slots. The Engine still holds at most twice
// WithConcurrency messages. Default: none.
func WithLimiter(l *Limiter) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("relay: WithLimiter: nil Limiter")
		}
		o.limiter = l
		return o.once("WithLimiter")
	}
}

// WithConcurrencyWait bounds the wait for a concurrency slot. d must be > 0.
// Default: DefaultConcurrencyWait.
func WithConcurrencyWait(d time.Duration) Option {
	return func(o *options) error {
		o.concurrencyWait = d
		return errors.Join(positive("WithConcurrencyWait", d), o.once("WithConcurrencyWait"))
	}
}

// WithMinPendingIdle sets the reclaim threshold. d must be > 0.
// Default: DefaultMinPendingIdle.
func WithMinPendingIdle(d time.Duration) Option {
	return func(o *options) error {
		o.minPendingIdle = d
		return errors.Join(positive("WithMinPendingIdle", d), o.once("WithMinPendingIdle"))
	}
}

// WithReclaimInterval sets how often idle pending entries are reclaimed.
// d must be > 0. Default: DefaultReclaimInterval, or MinPendingIdle/2 when
// that is shorter.
func WithReclaimInterval(d time.Duration) Option {
	return func(o *options) error {
		o.reclaimInterval = d
		return errors.Join(positive("WithReclaimInterval", d), o.once("WithReclaimInterval"))
	}
}

// WithHeartbeatInterval sets how often the engine resets the PEL idle time
// of messages it is still working on. d must be > 0 and shorter than
// MinPendingIdle. Default: MinPendingIdle/3.
func WithHeartbeatInterval(d time.Duration) Option {
	return func(o *options) error {
		o.heartbeat = d
		return errors.Join(positive("WithHeartbeatInterval", d), o.once("WithHeartbeatInterval"))
	}
}

// WithLeaseGrace sets what is added to the concurrency wait and a rule's
// timeout to form its running lease; a lease that expires counts as a
// failed attempt. d must be > 0. Default: DefaultLeaseGrace.
func WithLeaseGrace(d time.Duration) Option {
	return func(o *options) error {
		o.leaseGrace = d
		return errors.Join(positive("WithLeaseGrace", d), o.once("WithLeaseGrace"))
	}
}

// WithShutdownTimeout bounds how long Run lets running invocations finish
// after its context is cancelled; then they are abandoned and their
// messages stay pending. d must be > 0. Default: DefaultShutdownTimeout.
func WithShutdownTimeout(d time.Duration) Option {
	return func(o *options) error {
		o.shutdownTimeout = d
		return errors.Join(positive("WithShutdownTimeout", d), o.once("WithShutdownTimeout"))
	}
}

// WithSweepInterval sets how often a Runner that is a Sweeper removes
// leftovers. d must be > 0. Default: DefaultSweepInterval.
func WithSweepInterval(d time.Duration) Option {
	return func(o *options) error {
		o.sweepInterval = d
		return errors.Join(positive("WithSweepInterval", d), o.once("WithSweepInterval"))
	}
}

// WithRetention sets the TTL of a message's invocation state after the
// message left the PEL. d must be > 0. Default: DefaultRetention.
func WithRetention(d time.Duration) Option {
	return func(o *options) error {
		o.retention = d
		return errors.Join(positive("WithRetention", d), o.once("WithRetention"))
	}
}

// WithBackoff sets the retry schedule: entry i is the wait after the
// (i+1)th failed attempt; the last entry repeats. Every entry must be > 0.
// Default: DefaultBackoff.
func WithBackoff(schedule ...time.Duration) Option {
	return func(o *options) error {
		if len(schedule) == 0 {
			return errors.New("relay: WithBackoff: needs at least one duration")
		}
		for _, d := range schedule {
			if err := positive("WithBackoff", d); err != nil {
				return err
			}
		}
		o.backoff = append([]time.Duration(nil), schedule...)
		return o.once("WithBackoff")
	}
}

// WithLogger sets the logger. l must not be nil. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("relay: WithLogger: nil logger")
		}
		o.logger = l
		return o.once("WithLogger")
	}
}

// WithMetrics registers the engine's Prometheus collectors (reference.md
// "Observability") on r. Without it metrics are kept but not exported.
func WithMetrics(r prometheus.Registerer) Option {
	return func(o *options) error {
		if r == nil {
			return errors.New("relay: WithMetrics: nil registerer")
		}
		o.registerer = r
		return o.once("WithMetrics")
	}
}

// WithStats keeps the cluster-wide counters read by relay stats (Stats,
// ReadStats) in Redis through client, in the hash keys.Stats of the
// Engine's stream and group. The Engine counts in memory and adds its counts
// every stats interval and once more when Run returns; a failed write is
// logged and retried with the next one, never charged to a message. Without
// it no stats are kept. The Engine never closes client.
func WithStats(client rueidis.Client) Option {
	return func(o *options) error {
		if client == nil {
			return errors.New("relay: WithStats: nil client")
		}
		o.statsClient = client
		return o.once("WithStats")
	}
}

// WithStatsInterval sets how often the counts of WithStats are written.
// d must be > 0. Default: DefaultStatsInterval.
func WithStatsInterval(d time.Duration) Option {
	return func(o *options) error {
		o.statsInterval = d
		return errors.Join(positive("WithStatsInterval", d), o.once("WithStatsInterval"))
	}
}

// WithTracerProvider sets where the Engine's spans go (reference.md
// "Observability"): stream.message per delivery, function.invoke per
// attempt, linked to the previous attempt. Given to Invoke or Replay it
// sets where app.manual_invoke or dlq.replay goes. tp must not be nil.
// Default: otel.GetTracerProvider(), the global provider, which records
// nothing unless the program installs one; trace context found in stream
// entries is still handed on to handlers (TRACEPARENT) and DLQ entries.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) error {
		if tp == nil {
			return errors.New("relay: WithTracerProvider: nil provider")
		}
		o.tracerProvider = tp
		return o.once("WithTracerProvider")
	}
}

func buildOptions(opts []Option) (*options, error) {
	o := &options{
		concurrency:     DefaultConcurrency,
		concurrencyWait: DefaultConcurrencyWait,
		minPendingIdle:  DefaultMinPendingIdle,
		leaseGrace:      DefaultLeaseGrace,
		shutdownTimeout: DefaultShutdownTimeout,
		sweepInterval:   DefaultSweepInterval,
		retention:       DefaultRetention,
		backoff:         DefaultBackoff,
		statsInterval:   DefaultStatsInterval,
		set:             map[string]bool{},
	}
	var errs []error
	for _, opt := range opts {
		if opt == nil {
			errs = append(errs, errors.New("relay: nil Option"))
			continue
		}
		if err := opt(o); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.reclaimInterval == 0 {
		o.reclaimInterval = min(DefaultReclaimInterval, o.minPendingIdle/2)
	}
	if o.heartbeat == 0 {
		o.heartbeat = o.minPendingIdle / 3
	}
	if o.heartbeat >= o.minPendingIdle {
		return nil, fmt.Errorf("relay: WithHeartbeatInterval: %s must be shorter than MinPendingIdle %s", o.heartbeat, o.minPendingIdle)
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.tracerProvider == nil {
		o.tracerProvider = otel.GetTracerProvider()
	}
	return o, nil
}
