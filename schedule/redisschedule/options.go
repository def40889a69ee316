package redisschedule

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/schedule"
)

const (
	// DefaultCatchUpWindow is how far back startup catch-up looks for the
	// latest missed occurrence of each schedule
	// (docs/schedules.md#missed-occurrences-and-daylight-saving-time).
	DefaultCatchUpWindow = 24 * time.Hour
	// DefaultOutboxInterval is how often a running Scheduler retries the
	// occurrences in its outbox.
	DefaultOutboxInterval = 10 * time.Second
	// DefaultPublishTimeout bounds one publish attempt (the script round
	// trip) and one read of the server clock.
	DefaultPublishTimeout = 5 * time.Second
	// DefaultMaxSleep is the longest the Scheduler sleeps before looking at
	// its clock again, so a clock step or a suspended host is noticed
	// within this time rather than after a long timer.
	DefaultMaxSleep = time.Second
	// DedupTTL is the lifetime of an occurrence's dedup key
	// (docs/schedules.md#one-occurrence-however-many-workers). An occurrence
	// is published at most once while its key lives. It is not configurable:
	// every worker must agree on it.
	DedupTTL = 7 * 24 * time.Hour
)

// DefaultPublishBackoff returns the waits between publish attempts of one
// occurrence, from docs/schedules.md#when-redis-is-unreachable: 100ms, 500ms,
// 2s, 5s, so an occurrence is tried five times before it goes to the outbox.
// A new slice is returned on each call.
func DefaultPublishBackoff() []time.Duration {
	return []time.Duration{100 * time.Millisecond, 500 * time.Millisecond, 2 * time.Second, 5 * time.Second}
}

// Option configures a Scheduler (New) or a Publisher (NewPublisher). Every
// option is accepted by New; NewPublisher accepts only WithTracerProvider
// and reports any other option as an error.
type Option func(*options) error

// The constructors an option may configure.
type target uint8

const (
	forScheduler target = 1 << iota
	forPublisher
)

type options struct {
	building target // the constructor applying the options

	stateDir       string
	backoff        []time.Duration
	outboxInterval time.Duration
	catchUpWindow  time.Duration
	publishTimeout time.Duration
	maxSleep       time.Duration
	logger         *slog.Logger
	clock          func() time.Time
	now            func(context.Context) (time.Time, error)
	tracerProvider trace.TracerProvider
	observer       func(schedule.Spec, time.Time, Result)
}

func defaultOptions(building target) options {
	return options{
		building:       building,
		backoff:        DefaultPublishBackoff(),
		outboxInterval: DefaultOutboxInterval,
		catchUpWindow:  DefaultCatchUpWindow,
		publishTimeout: DefaultPublishTimeout,
		maxSleep:       DefaultMaxSleep,
	}
}

func (o *options) apply(opts []Option) error {
	for _, opt := range opts {
		if opt == nil {
			return fmt.Errorf("nil Option")
		}
		if err := opt(o); err != nil {
			return err
		}
	}
	return nil
}

// check rejects an option the constructor being run does not take.
func (o *options) check(name string, accepts target) error {
	if o.building&accepts == 0 {
		return fmt.Errorf("%s configures a Scheduler: pass it to New, not NewPublisher", name)
	}
	return nil
}

// WithStateDir keeps the outbox durable in dir/schedule-outbox/, one file
// per occurrence, written atomically (temporary file, fsync, rename,
// directory fsync) and deleted only once the occurrence is published or
// found already published. Run creates the directory and fails at start,
// naming it, when it is not writable. dir must not be empty.
//
// Default: no state directory; the outbox lives in memory, is still retried
// while the Scheduler runs, and is lost when it stops. The relay binary
// always sets it (--state-dir, RELAY_STATE_DIR).
func WithStateDir(dir string) Option {
	return func(o *options) error {
		if err := o.check("WithStateDir", forScheduler); err != nil {
			return err
		}
		if dir == "" {
			return fmt.Errorf("WithStateDir: directory must not be empty")
		}
		o.stateDir = dir
		return nil
	}
}

// WithPublishBackoff sets the waits between publish attempts of an
// occurrence: entry i is the wait after attempt i+1 fails, so len(waits)+1
// attempts are made before the occurrence goes to the outbox. Each wait
// must be > 0; an empty list means one attempt. Default:
// DefaultPublishBackoff().
func WithPublishBackoff(waits []time.Duration) Option {
	return func(o *options) error {
		if err := o.check("WithPublishBackoff", forScheduler); err != nil {
			return err
		}
		for i, d := range waits {
			if d <= 0 {
				return fmt.Errorf("WithPublishBackoff: wait %d is %s, must be > 0", i, d)
			}
		}
		o.backoff = append([]time.Duration(nil), waits...)
		return nil
	}
}

// WithOutboxInterval sets how often a running Scheduler retries its outbox
// (it also does so once at start). d must be > 0. Default:
// DefaultOutboxInterval.
func WithOutboxInterval(d time.Duration) Option {
	return func(o *options) error {
		if err := o.check("WithOutboxInterval", forScheduler); err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("WithOutboxInterval: must be > 0, got %s", d)
		}
		o.outboxInterval = d
		return nil
	}
}

// WithCatchUpWindow sets how far back startup catch-up looks: at start, each
// schedule publishes its latest firing in (now-d, now], if any. d must be
// >= 0; 0 turns catch-up off. Default: DefaultCatchUpWindow (24h, fixed by
// docs/schedules.md#missed-occurrences-and-daylight-saving-time).
func WithCatchUpWindow(d time.Duration) Option {
	return func(o *options) error {
		if err := o.check("WithCatchUpWindow", forScheduler); err != nil {
			return err
		}
		if d < 0 {
			return fmt.Errorf("WithCatchUpWindow: must be >= 0, got %s", d)
		}
		o.catchUpWindow = d
		return nil
	}
}

// WithPublishTimeout bounds each publish attempt and each read of the
// server clock. d must be > 0. Default: DefaultPublishTimeout.
func WithPublishTimeout(d time.Duration) Option {
	return func(o *options) error {
		if err := o.check("WithPublishTimeout", forScheduler); err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("WithPublishTimeout: must be > 0, got %s", d)
		}
		o.publishTimeout = d
		return nil
	}
}

// WithMaxSleep sets the longest the Scheduler sleeps before it reads its
// clock again. Sleeps end earlier when an occurrence is due. d must be > 0.
// Default: DefaultMaxSleep.
func WithMaxSleep(d time.Duration) Option {
	return func(o *options) error {
		if err := o.check("WithMaxSleep", forScheduler); err != nil {
			return err
		}
		if d <= 0 {
			return fmt.Errorf("WithMaxSleep: must be > 0, got %s", d)
		}
		o.maxSleep = d
		return nil
	}
}

// WithLogger sets the logger. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if err := o.check("WithLogger", forScheduler); err != nil {
			return err
		}
		if l == nil {
			return fmt.Errorf("WithLogger: logger must not be nil")
		}
		o.logger = l
		return nil
	}
}

// WithClock sets the local clock the Scheduler measures sleeps with; it
// adds the last known offset of the server clock (see WithNow) to decide
// when an occurrence is due. Tests inject a fake to place the Scheduler
// anywhere in time. Sleeps stay real: the Scheduler looks at the clock at
// least every WithMaxSleep. Default: time.Now.
func WithClock(now func() time.Time) Option {
	return func(o *options) error {
		if err := o.check("WithClock", forScheduler); err != nil {
			return err
		}
		if now == nil {
			return fmt.Errorf("WithClock: clock must not be nil")
		}
		o.clock = now
		return nil
	}
}

// WithNow sets the authoritative clock read before an occurrence is
// published and at start. Default: the Redis server's TIME
// (Publisher.ServerTime), so workers with skewed clocks agree on what is
// due. When it fails, the Scheduler carries on with its local clock plus
// the last known offset, and logs a warning.
func WithNow(now func(context.Context) (time.Time, error)) Option {
	return func(o *options) error {
		if err := o.check("WithNow", forScheduler); err != nil {
			return err
		}
		if now == nil {
			return fmt.Errorf("WithNow: clock must not be nil")
		}
		o.now = now
		return nil
	}
}

// WithTracerProvider sets where schedule.publish spans go. Each publish
// attempt is one span (attributes app, schedule, scheduled_at, published),
// and the stream entry it writes carries the span's W3C trace context in the
// fields traceparent and tracestate, so the consumer continues the trace
// (docs/observability.md#spans). Accepted by NewPublisher and New; given to
// New, it applies to the publishes that Scheduler makes. Default:
// otel.GetTracerProvider() at construction time.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(o *options) error {
		if tp == nil {
			return fmt.Errorf("WithTracerProvider: provider must not be nil")
		}
		o.tracerProvider = tp
		return nil
	}
}

// WithObserver registers f to be told the outcome of every occurrence the
// Scheduler handles: due occurrences, catch-up, and outbox retries. f runs
// on the Scheduler's goroutine and must return quickly; the relay package
// counts Published and Duplicate in
// relay_schedule_occurrences_published_total and
// relay_schedule_occurrences_duplicate_total. For an outbox retry of a
// schedule the Scheduler no longer knows, the Spec holds only App, Name
// and Handler. Default: none.
func WithObserver(f func(s schedule.Spec, at time.Time, r Result)) Option {
	return func(o *options) error {
		if err := o.check("WithObserver", forScheduler); err != nil {
			return err
		}
		if f == nil {
			return fmt.Errorf("WithObserver: function must not be nil")
		}
		o.observer = f
		return nil
	}
}
