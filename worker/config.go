package worker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/schedule/redisschedule"
	"github.com/relaydev/relay/stream"
)

// Defaults of Config (docs/operations.md#retention,
// docs/apps.md#changing-apps).
const (
	// DefaultSweepInterval is how often a Worker asks a Runner that is a
	// relay.Sweeper to remove leftovers.
	DefaultSweepInterval = time.Minute
	// DefaultReloadInterval is how often a Worker rescans its apps even
	// when nothing reported a change: the backstop for a watch that missed
	// one.
	DefaultReloadInterval = 30 * time.Second
	// DefaultPrepareRetry is the first delay before a Worker prepares again
	// an app whose preparation failed.
	DefaultPrepareRetry = time.Second
	// DefaultPrepareWait is how long a Worker waits at start for the
	// preparations it starts before it goes on without the ones still
	// running; a reload waits at most 1 second.
	DefaultPrepareWait = 10 * time.Second
	// DefaultPolicyCheckInterval is how often a Worker reads Redis's
	// maxmemory-policy again after start (docs/operations.md#redis-memory).
	DefaultPolicyCheckInterval = 10 * time.Minute
	// DefaultMemoryCheckInterval is how often a Worker measures each
	// stream's Redis memory and projects it (docs/operations.md#memory-budget).
	DefaultMemoryCheckInterval = 10 * time.Minute
	// DefaultStreamRetention is how long an entry stays in the source
	// stream once no consumer group needs it (REDIS_STREAM_RETENTION).
	DefaultStreamRetention = stream.DefaultRetention
	// DefaultDLQRetention is how long a dead-letter entry is kept
	// (REDIS_DLQ_RETENTION).
	DefaultDLQRetention = dlq.DefaultRetention
	// DefaultRetentionInterval is how often a worker trims each stream and
	// its dead-letter stream.
	DefaultRetentionInterval = time.Minute
	// DefaultJanitorInterval is how often a worker takes one step of its
	// scan for invocation state left without a TTL; steps are sized so a
	// pass takes at most an hour.
	DefaultJanitorInterval = 10 * time.Second
	// DefaultConsumerIdle is how long a consumer of the group stays idle
	// with nothing pending before a worker removes it.
	DefaultConsumerIdle = stream.DefaultConsumerIdle
	// Disabled turns a retention off: Config.StreamRetention, DLQRetention
	// or ConsumerIdle set to it keep entries (consumers) forever, and
	// Config.MemoryCheckInterval set to it measures nothing. Any other
	// negative value of those is an error.
	Disabled time.Duration = -1
)

// AppSource supplies a Worker's apps. Package app/template reads them from
// an apps root (template.Dir); Static serves a set built in Go.
type AppSource interface {
	// Load returns the apps as they are now. An error means the source
	// itself cannot be read (a missing apps root), not that an app is
	// invalid: invalid apps come back unavailable, with their errors.
	Load(ctx context.Context) (*app.Set, error)
}

// AppWatcher is an optional AppSource capability: Watch calls changed
// whenever the source may have changed, until ctx ends (template.Dir
// watches the apps root). A Worker reloads then, as well as every
// ReloadInterval and on Reload.
type AppWatcher interface {
	Watch(ctx context.Context, changed func()) error
}

// Static is an AppSource that always returns its set.
func Static(set *app.Set) AppSource { return staticApps{set} }

type staticApps struct{ set *app.Set }

func (s staticApps) Load(context.Context) (*app.Set, error) { return s.set, nil }

// Config configures a Worker (docs/embedding.md#worker). Redis, Streams,
// Group, Apps and Runner are required; every other zero field takes its
// default.
type Config struct {
	// Redis is the client every part of the worker shares. The Worker never
	// closes it.
	Redis rueidis.Client
	// Streams are consumed through Group, one Engine each. Under Redis
	// Cluster every stream needs a hash tag (docs/deployment.md#redis-cluster-one-hash-slot-per-stream).
	Streams []string
	Group   string
	// Consumer names this worker in every group. Default: the hostname.
	Consumer string
	// Apps supplies the apps every stream serves.
	Apps AppSource
	// Runner runs the handlers of every stream. When it is a
	// relay.Sweeper, the Worker sweeps its leftovers at start and every
	// SweepInterval; when it is a relay.Preparer, the Worker prepares each
	// app before serving it.
	Runner relay.Runner
	// StateDir holds the schedule outbox, so occurrences that could not be
	// published survive a restart; when an app has schedules, Run refuses
	// one that cannot hold it before the worker starts. Default: none (the
	// outbox is in memory).
	StateDir string
	// SweepInterval is how often the Runner is swept. Default:
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// DisableStats turns off the cluster-wide counters of relay stats.
	DisableStats bool
	// ScheduleOptions are passed to every redisschedule.Scheduler the worker
	// runs (after its own), so tests can shrink its timings.
	ScheduleOptions []redisschedule.Option
	// ReloadInterval is how often the apps are rescanned even when the
	// AppSource reported no change (docs/apps.md#changing-apps). Default:
	// DefaultReloadInterval.
	ReloadInterval time.Duration
	// PrepareWait is how long start waits for the preparations of a
	// Runner that is a relay.Preparer (images, dependency images, secrets)
	// before going on without the ones still running, and each reload at
	// most 1 second of it, so that one app's pull or build does not hold
	// up the other apps' changes: those still running go on in the
	// background, their app unavailable or, on a reload, its previous
	// version serving, and the Worker reloads when each ends
	// (docs/apps.md#changing-apps). Default: DefaultPrepareWait.
	PrepareWait time.Duration
	// PolicyCheckInterval is how often Redis's maxmemory-policy is read
	// again after start, to warn when it changed to one that evicts
	// (docs/operations.md#redis-memory). Default: DefaultPolicyCheckInterval.
	PolicyCheckInterval time.Duration
	// MemoryCheckInterval is how often each stream's Redis memory is
	// measured and projected at the worker's retentions
	// (redisstats.MeasureMemory): the projection is exported as a gauge, and
	// a projection over 90% of maxmemory is warned about once, then when it
	// changes (docs/operations.md#memory-budget). Default:
	// DefaultMemoryCheckInterval; Disabled turns the measurement off.
	MemoryCheckInterval time.Duration
	// PrepareRetry is how long after a failed preparation the Worker
	// reloads to prepare the app again; the delay doubles while the
	// preparations keep failing, up to ReloadInterval, and starts again
	// from PrepareRetry once none fails (docs/apps.md#changing-apps).
	// Default: DefaultPrepareRetry.
	PrepareRetry time.Duration
	// StreamRetention is how long an entry stays in each source stream once
	// no consumer group needs it; entries still pending or not yet
	// delivered to any group are never removed (docs/operations.md#retention).
	// Default: DefaultStreamRetention; Disabled keeps every entry.
	StreamRetention time.Duration
	// DLQRetention is how long a dead-letter entry is kept. Default:
	// DefaultDLQRetention; Disabled keeps every entry.
	DLQRetention time.Duration
	// RetentionInterval is how often the streams and dead-letter streams
	// are trimmed. Default: DefaultRetentionInterval.
	RetentionInterval time.Duration
	// JanitorInterval is how often the scan for leaked invocation state
	// takes a step. Default: DefaultJanitorInterval.
	JanitorInterval time.Duration
	// ConsumerIdle is how long another consumer of the group must have
	// been idle, with nothing pending, before the retention round removes
	// it from the group: workers that restart under new names (a pod's
	// hostname) would otherwise pile up in XINFO CONSUMERS
	// (docs/operations.md#retention). Default: DefaultConsumerIdle;
	// Disabled keeps every consumer.
	ConsumerIdle time.Duration
	// WrapComponents, when set, is given the Components of each stream's
	// Engine as the Worker built them and returns the ones the Engine
	// gets: a hook to observe or decorate a part (count its calls, record
	// what it does) while the Worker still runs everything else. The
	// wrappers must keep each part's contract and the Source's optional
	// capabilities: New refuses them otherwise, naming what is hidden
	// (docs/embedding.md#wrapping-the-parts). The Worker's own retention,
	// janitor and reload keep using the parts it built. Optional.
	WrapComponents func(relay.Components) relay.Components
	// StartupWait is how long Run waits at start for Redis to answer a
	// PING, retrying with backoff and logging once per 10 s, when the
	// client cannot reach it (a Redis restarting, or not started yet; make
	// a client that cannot be made yet with Connect), before it fails
	// with ErrRedisUnreachable (docs/embedding.md#starting-before-redis).
	// Default: 0, no wait: Run fails at once when the first PING gets no
	// answer within 2 s, as a library should not hide a wrong address for
	// a minute unasked.
	StartupWait time.Duration
	// RequireStreams refuses to start (Run) when a stream of Streams does
	// not exist yet; by default it is created with its group, with a WARN
	// naming it, so that a misspelled name shows.
	RequireStreams bool
	// Engine holds the tunables of every stream's Engine. MaxConcurrency
	// and each app's concurrency bound the worker as a whole, whatever the
	// number of streams; with several streams, metrics carry a stream
	// label.
	Engine relay.Config
}

// withDefaults returns c with every zero field set, or an error naming
// each missing or invalid field.
func (c Config) withDefaults() (Config, error) {
	if err := c.check(); err != nil {
		return c, err
	}
	if c.Consumer == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return c, errors.New("worker: New: Config.Consumer is empty and the hostname cannot be read; set a consumer name")
		}
		c.Consumer = h
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&c.SweepInterval, DefaultSweepInterval}, {&c.ReloadInterval, DefaultReloadInterval},
		{&c.RetentionInterval, DefaultRetentionInterval}, {&c.JanitorInterval, DefaultJanitorInterval},
		{&c.StreamRetention, DefaultStreamRetention}, {&c.DLQRetention, DefaultDLQRetention},
		{&c.ConsumerIdle, DefaultConsumerIdle}, {&c.PrepareWait, DefaultPrepareWait},
		{&c.PrepareRetry, DefaultPrepareRetry}, {&c.PolicyCheckInterval, DefaultPolicyCheckInterval},
		{&c.MemoryCheckInterval, DefaultMemoryCheckInterval},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if c.Engine.Limiter == nil {
		n := c.Engine.MaxConcurrency
		if n == 0 {
			n = relay.DefaultConcurrency
		}
		l, err := relay.NewLimiter(n)
		if err != nil {
			return c, fmt.Errorf("worker: New: Config.Engine.MaxConcurrency: %w", err)
		}
		c.Engine.Limiter = l
	}
	return c, nil
}

// check names every required field that is missing and every invalid one.
func (c Config) check() error {
	var errs []error
	for name, missing := range map[string]bool{
		"Redis": c.Redis == nil, "Streams": len(c.Streams) == 0, "Group": c.Group == "",
		"Apps": c.Apps == nil, "Runner": c.Runner == nil,
	} {
		if missing {
			errs = append(errs, fmt.Errorf("worker: New: Config.%s is required", name))
		}
	}
	for i, s := range c.Streams {
		if s == "" || slices.Contains(c.Streams[:i], s) {
			errs = append(errs, fmt.Errorf("worker: New: Config.Streams: %q is empty or listed twice", s))
		}
	}
	for name, d := range map[string]time.Duration{
		"SweepInterval": c.SweepInterval, "ReloadInterval": c.ReloadInterval,
		"RetentionInterval": c.RetentionInterval, "JanitorInterval": c.JanitorInterval,
		"PrepareWait": c.PrepareWait, "PrepareRetry": c.PrepareRetry,
		"PolicyCheckInterval": c.PolicyCheckInterval, "StartupWait": c.StartupWait,
	} {
		switch {
		case d < 0:
			errs = append(errs, fmt.Errorf("worker: New: Config.%s: must be >= 0 (0 means the default), got %s", name, d))
		case d > 0 && d < time.Millisecond && name != "StartupWait":
			// A bare number is nanoseconds, and a loop that short spins.
			errs = append(errs, fmt.Errorf("worker: New: Config.%s: must be 0 (the default) or at least 1ms, got %s (a time.Duration: write 2 * time.Second, not 2)", name, d))
		}
	}
	// The settings that Disabled turns off.
	for name, d := range map[string]time.Duration{
		"StreamRetention": c.StreamRetention, "DLQRetention": c.DLQRetention,
		"ConsumerIdle": c.ConsumerIdle, "MemoryCheckInterval": c.MemoryCheckInterval,
	} {
		if d < 0 && d != Disabled || d > 0 && d < time.Millisecond {
			errs = append(errs, fmt.Errorf("worker: New: Config.%s: must be 0 (the default), Disabled (off) or at least 1ms, got %s", name, d))
		}
	}
	return errors.Join(errs...)
}

// stateRetention is the invocation state retention the Engines of c use:
// 0 when they delete it with the acknowledgement (relay.DeleteOnAck), as
// the janitor must then do with what a crash left behind.
func (c Config) stateRetention() time.Duration {
	switch {
	case c.Engine.Retention == relay.DeleteOnAck:
		return 0
	case c.Engine.Retention > 0:
		return c.Engine.Retention
	}
	return relay.DefaultRetention
}
