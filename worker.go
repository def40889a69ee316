package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redisinfo"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stream"
)

// DefaultSweepInterval is how often a Worker asks a Runner that is a
// Sweeper to remove leftovers.
const DefaultSweepInterval = time.Minute

// ErrNoApps is returned by Worker.Run when its AppSource holds no app:
// every event would be acknowledged as unmatched.
var ErrNoApps = errors.New("relay: no apps")

// ErrWorkerRan is returned by a second call of Worker.Run.
var ErrWorkerRan = errors.New("relay: worker already ran")

// AppSource supplies a Worker's apps. Package app/template reads them from
// an apps root (template.Dir); Static serves a set built in Go.
type AppSource interface {
	// Load returns the apps as they are now. An error means the source
	// itself cannot be read (a missing apps root), not that an app is
	// invalid: invalid apps come back unavailable, with their errors.
	Load(ctx context.Context) (*app.Set, error)
}

// Static is an AppSource that always returns its set.
func Static(set *app.Set) AppSource { return staticApps{set} }

type staticApps struct{ set *app.Set }

func (s staticApps) Load(context.Context) (*app.Set, error) { return s.set, nil }

// WorkerConfig configures a Worker (docs/embedding.md#worker). Redis,
// Streams, Group, Apps and Runner are required; every other zero field
// takes its default.
type WorkerConfig struct {
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
	// Runner runs the handlers of every stream. When it is a Sweeper, the
	// Worker sweeps its leftovers at start and every SweepInterval.
	Runner Runner
	// StateDir holds the schedule outbox, so occurrences that could not be
	// published survive a restart. Default: none (the outbox is in memory).
	StateDir string
	// SweepInterval is how often the Runner is swept. Default:
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// DisableStats turns off the cluster-wide counters of relay stats.
	DisableStats bool
	// ScheduleOptions are passed to every schedule.Scheduler the worker
	// runs (after its own), so tests can shrink its timings.
	ScheduleOptions []schedule.Option
	// ReloadInterval is how often the apps are rescanned even when the
	// AppSource reported no change (docs/apps.md#changing-apps). Default:
	// DefaultReloadInterval.
	ReloadInterval time.Duration
	// PrepareWait is how long start waits for the preparations of a
	// Runner that is a Preparer (images, dependency images, secrets)
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
	// wrappers must keep each part's contract (docs/embedding.md#worker);
	// the Worker's own retention, janitor and reload keep using the parts
	// it built. Optional.
	WrapComponents func(Components) Components
	// Config holds the tunables of every stream's Engine. MaxConcurrency
	// and each app's concurrency bound the worker as a whole, whatever the
	// number of streams; with several streams, metrics carry a stream
	// label.
	Config
}

// Worker runs what one relay start process runs (docs/operations.md): an
// Engine per stream sharing one concurrency Limiter, the Scheduler of
// every app's schedules publishing into the first stream, one sweeper of the
// Runner's leftovers, the reload of changed apps, and per stream the
// retention of the stream and its dead-letter stream and the janitor of
// leaked invocation state. Create it with NewWorker and run it with Run.
// Safe for concurrent use.
type Worker struct {
	cfg          WorkerConfig
	log          *slog.Logger
	engines      []*Engine
	streams      []streamParts
	scheduleObs  func(schedule.Spec, time.Time, schedule.Result)
	reloadErrors *prometheus.CounterVec
	// reloads holds a pending request to reload (Reload).
	reloads chan struct{}
	// invalid holds, by app name, the invalid template last reported
	// (newlyInvalid); used by Run before the reload loop starts, then by it.
	invalid map[string]string
	// preps holds, by app name, the preparation of an app that is running
	// or whose result no reload has used yet (prepareApps); waiting, the
	// version of each app last logged as being prepared (reportPreparing).
	// Both are used by Run before the reload loop starts, then by it.
	preps   map[string]*preparation
	waiting map[string]*app.App
	// prepareFailed: a preparation of the last load failed (prepareApps),
	// so the reload loop retries (retryTimer).
	prepareFailed bool
	// policies holds, by server address, the maxmemory-policy last read
	// (checkMemoryPolicy); used by Run before policyLoop starts, then by it.
	policies map[string]string
	// preparing owns the goroutines of the preparations.
	preparing sync.WaitGroup
	ran       atomic.Bool
	mu        sync.Mutex
	apps      *app.Set
}

// NewWorker validates cfg and builds the Worker's Engines, registering
// their metrics. It does no I/O: Run loads the apps and connects.
func NewWorker(cfg WorkerConfig) (*Worker, error) {
	var errs []error
	for name, missing := range map[string]bool{
		"Redis": cfg.Redis == nil, "Streams": len(cfg.Streams) == 0, "Group": cfg.Group == "",
		"Apps": cfg.Apps == nil, "Runner": cfg.Runner == nil,
	} {
		if missing {
			errs = append(errs, fmt.Errorf("relay: NewWorker: WorkerConfig.%s is required", name))
		}
	}
	for i, s := range cfg.Streams {
		if s == "" || slices.Contains(cfg.Streams[:i], s) {
			errs = append(errs, fmt.Errorf("relay: NewWorker: WorkerConfig.Streams: %q is empty or listed twice", s))
		}
	}
	for name, d := range map[string]time.Duration{
		"SweepInterval": cfg.SweepInterval, "ReloadInterval": cfg.ReloadInterval,
		"RetentionInterval": cfg.RetentionInterval, "JanitorInterval": cfg.JanitorInterval,
		"PrepareWait": cfg.PrepareWait, "PrepareRetry": cfg.PrepareRetry,
		"PolicyCheckInterval": cfg.PolicyCheckInterval,
	} {
		if d < 0 {
			errs = append(errs, fmt.Errorf("relay: NewWorker: WorkerConfig.%s: must be >= 0, got %s", name, d))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if cfg.Consumer == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return nil, errors.New("relay: NewWorker: WorkerConfig.Consumer is empty and the hostname cannot be read; set a consumer name")
		}
		cfg.Consumer = h
	}
	for _, d := range []struct {
		v   *time.Duration
		def time.Duration
	}{
		{&cfg.SweepInterval, DefaultSweepInterval}, {&cfg.ReloadInterval, DefaultReloadInterval},
		{&cfg.RetentionInterval, DefaultRetentionInterval}, {&cfg.JanitorInterval, DefaultJanitorInterval},
		{&cfg.StreamRetention, DefaultStreamRetention}, {&cfg.DLQRetention, DefaultDLQRetention},
		{&cfg.ConsumerIdle, DefaultConsumerIdle}, {&cfg.PrepareWait, DefaultPrepareWait},
		{&cfg.PrepareRetry, DefaultPrepareRetry}, {&cfg.PolicyCheckInterval, DefaultPolicyCheckInterval},
	} {
		if *d.v == 0 {
			*d.v = d.def
		}
	}
	if cfg.Limiter == nil {
		n := cfg.MaxConcurrency
		if n == 0 {
			n = DefaultConcurrency
		}
		l, err := NewLimiter(n)
		if err != nil {
			return nil, fmt.Errorf("relay: NewWorker: WorkerConfig.MaxConcurrency: %w", err)
		}
		cfg.Limiter = l
	}
	w := &Worker{cfg: cfg, reloads: make(chan struct{}, 1), invalid: map[string]string{},
		preps: map[string]*preparation{}, waiting: map[string]*app.App{}}
	reg := cfg.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry() // kept, not exported
	}
	sm, err := schedule.NewMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("relay: register schedule metrics: %w", err)
	}
	w.scheduleObs = sm.Observe
	w.reloadErrors = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "relay", Name: "app_reload_errors_total",
		Help: "Reloads that found an app's template invalid (its previous version, if any, keeps serving)."}, []string{"app"})
	if err := reg.Register(w.reloadErrors); err != nil {
		return nil, fmt.Errorf("relay: register reload metrics: %w", err)
	}
	empty, _ := app.NewSet()
	for _, name := range cfg.Streams {
		ecfg := cfg.Config
		if len(cfg.Streams) > 1 {
			ecfg.Metrics = prometheus.WrapRegistererWith(prometheus.Labels{"stream": name}, reg)
		}
		if !cfg.DisableStats {
			ecfg.Stats = stats.NewRecorder(cfg.Redis, name, cfg.Group)
		}
		var srcOpts []stream.Option
		if ecfg.Logger != nil {
			srcOpts = append(srcOpts, stream.WithLogger(ecfg.Logger))
		}
		src := stream.New(cfg.Redis, name, cfg.Group, cfg.Consumer, srcOpts...)
		store := invocation.New(cfg.Redis)
		// A dead-letter entry's written marker lives as long as the
		// invocation state it guards (docs/delivery.md#dead-letter-queue).
		dlqw := dlq.NewWriter(cfg.Redis, name, dlq.WithWrittenTTL(stateRetention(ecfg)))
		c := Components{
			Source: src, State: store, Runner: cfg.Runner, DLQ: dlqw,
			// The source and the store share the client: a message's last
			// transition, its XACK and its retention take one script.
			Settler: store,
			Stream:  name, Group: cfg.Group, Consumer: cfg.Consumer,
		}
		if cfg.WrapComponents != nil {
			c = cfg.WrapComponents(c)
		}
		e, err := NewEngine(empty, c, ecfg)
		if err != nil {
			return nil, fmt.Errorf("relay: NewWorker: stream %s: %w", name, err)
		}
		w.engines = append(w.engines, e)
		w.streams = append(w.streams, streamParts{engine: e, source: src, dlq: dlqw, state: store})
	}
	w.log = w.engines[0].cfg.Logger
	return w, nil
}

// stateRetention is the invocation state retention an Engine of cfg uses.
func stateRetention(cfg Config) time.Duration {
	if cfg.Retention > 0 {
		return cfg.Retention
	}
	return DefaultRetention
}

// Run loads the apps and runs the Worker until ctx is cancelled, then stops
// every part gracefully (Engine.Run) and returns nil. It waits at most
// PrepareWait for the apps' preparations (Preparer) before it starts
// consuming; an app whose preparation is still running then is unavailable
// until it ends (docs/apps.md#changing-apps). It returns an error
// when the worker cannot start: the apps cannot be loaded or there are none
// (ErrNoApps), a stream violates the Redis Cluster key layout, the Redis
// user lacks a permission (the error quotes the server's refusal), a consumer
// group cannot be created, or the Scheduler fails. When one part fails the
// others are stopped: a worker never runs with a stream or its schedules
// silently left out. Run runs once (ErrWorkerRan).
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return ErrWorkerRan
	}
	apps, err := w.cfg.Apps.Load(ctx)
	if err != nil {
		return fmt.Errorf("relay: load apps: %w", err)
	}
	if len(apps.List()) == 0 {
		return ErrNoApps
	}
	if err := w.checkLayout(ctx); err != nil {
		return err
	}
	if err := w.checkAccess(ctx); err != nil {
		return err
	}
	w.checkMemoryPolicy(ctx)

	ctx, stop := context.WithCancel(ctx)
	defer func() {
		// A preparation still running ends with ctx.
		stop()
		w.preparing.Wait()
	}()
	apps, waiting := w.prepareApps(ctx, nil, apps)
	if ctx.Err() != nil {
		// Stopped while preparing: an app whose preparation was cut short
		// is not ready, and nothing was started.
		return nil
	}
	w.logApps(ctx, apps, waiting)
	w.setApps(apps)

	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		stop()
	}
	var parts sync.WaitGroup
	for _, e := range w.engines {
		parts.Go(func() {
			if err := e.Run(ctx); err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
				fail(err)
			}
		})
	}
	sched := &scheduleRunner{w: w, fail: fail}
	sched.replace(ctx, apps)
	defer sched.stop()
	parts.Go(func() { w.reloadLoop(ctx, sched) })
	parts.Go(func() { w.sweepLoop(ctx) })
	parts.Go(func() { w.policyLoop(ctx) })
	for _, p := range w.streams {
		parts.Go(func() { w.retainLoop(ctx, p) })
		parts.Go(func() { w.janitorLoop(ctx, p) })
	}
	parts.Wait()
	sched.stop()
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(errs...)
}

// logApps logs what each app is, at start; waiting holds the apps whose
// preparation is still running, by name.
func (w *Worker) logApps(ctx context.Context, apps *app.Set, waiting map[string]*app.App) {
	for _, a := range apps.List() {
		if v := waiting[a.Name]; v != nil {
			w.reportPreparing(ctx, v, false, w.prepareWait(nil))
			continue
		}
		if !a.Available() {
			w.newlyInvalid(a)
			w.logInvalid(ctx, a, false)
			continue
		}
		w.log.LogAttrs(ctx, slog.LevelInfo, "app loaded", slog.String("app", a.Name),
			slog.Int("rules", len(a.Rules)), slog.Int("schedules", len(a.Schedules)))
	}
}

// checkMemoryPolicy warns when a Redis server may evict keys; a server that
// does not tell (INFO refused) is logged at debug level.
func (w *Worker) checkMemoryPolicy(ctx context.Context) {
	first := w.policies == nil
	if first {
		w.policies = map[string]string{}
	}
	mems, err := redisinfo.MemoryPolicies(ctx, w.cfg.Redis)
	if err != nil && first {
		// Once: a user without INFO cannot read it at any check.
		w.log.LogAttrs(ctx, slog.LevelInfo, "cannot read Redis's maxmemory-policy; make sure it is noeviction", slog.Any("error", err))
	}
	for _, m := range mems {
		last, seen := w.policies[m.Addr]
		w.policies[m.Addr] = m.Policy
		switch {
		case m.Evicts() && m.Policy != last:
			warnEviction(ctx, w.log, m)
		case !m.Evicts() && seen && last != m.Policy:
			w.log.LogAttrs(ctx, slog.LevelInfo, "Redis no longer evicts keys (maxmemory-policy is noeviction)",
				slog.String("redis", m.Addr), slog.String("was", last))
		}
	}
}

// policyLoop reads Redis's maxmemory-policy again every
// PolicyCheckInterval, so that a CONFIG SET after start to a policy that
// evicts is warned about as at start (docs/operations.md#redis-memory).
func (w *Worker) policyLoop(ctx context.Context) {
	every(ctx, w.cfg.PolicyCheckInterval, func() { w.checkMemoryPolicy(ctx) })
}

// setApps makes apps the set every Engine uses for deliveries from now on.
func (w *Worker) setApps(apps *app.Set) {
	w.mu.Lock()
	w.apps = apps
	w.mu.Unlock()
	for _, e := range w.engines {
		e.SetApps(apps)
	}
}

// Apps returns the apps the Worker serves; nil before Run loaded them.
func (w *Worker) Apps() *app.Set {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.apps
}

// checkLayout applies the Redis Cluster key layout rule when the client is
// connected to a cluster, whatever the settings said (one address of a
// cluster node is enough for rueidis to go cluster-wide), and logs its
// warnings.
func (w *Worker) checkLayout(ctx context.Context) error {
	if w.cfg.Redis.Mode() != rueidis.ClientModeCluster {
		return nil
	}
	warnings, err := keys.CheckClusterLayout(w.cfg.Streams, w.cfg.Group)
	if err != nil {
		return fmt.Errorf("relay: %w", err)
	}
	for _, warning := range warnings {
		w.log.LogAttrs(ctx, slog.LevelWarn, "streams share a cluster hash slot", slog.String("detail", warning))
	}
	return nil
}

// checkAccess refuses to start when the Redis user may not run what Relay
// needs on a stream's keys (docs/deployment.md#connecting-to-redis): such
// a worker would read messages and then fail every claim, leaving them
// pending while it looked healthy. Any other error of the probe is logged
// and left to the parts that follow, which report it themselves.
func (w *Worker) checkAccess(ctx context.Context) error {
	for _, name := range w.cfg.Streams {
		err := redisinfo.Access(ctx, w.cfg.Redis, keys.StreamAndDerived(name, w.cfg.Group))
		if errors.Is(err, redisinfo.ErrNoPermission) {
			return fmt.Errorf("relay: stream %s: %w; grant the user the ACL rules of docs/deployment.md (ACL users)", name, err)
		}
		if err != nil {
			w.log.LogAttrs(ctx, slog.LevelWarn, "cannot check the Redis user's permissions", slog.String("stream", name), slog.Any("error", err))
		}
	}
	return nil
}

// scheduler builds the Scheduler of every app's schedules, publishing into
// the first stream, or nil when no app has a schedule.
func (w *Worker) scheduler(apps *app.Set) (*schedule.Scheduler, error) {
	specs := apps.ScheduleSpecs()
	if len(specs) == 0 {
		return nil, nil
	}
	pub, err := schedule.NewPublisher(w.cfg.Redis, w.cfg.Streams[0], schedule.WithTracerProvider(w.engines[0].cfg.TracerProvider))
	if err != nil {
		return nil, fmt.Errorf("relay: schedules: %w", err)
	}
	opts := []schedule.Option{schedule.WithLogger(w.log), schedule.WithObserver(w.scheduleObs)}
	if w.cfg.StateDir != "" {
		opts = append(opts, schedule.WithStateDir(w.cfg.StateDir))
	}
	s, err := schedule.New(pub, specs, append(opts, w.cfg.ScheduleOptions...)...)
	if err != nil {
		return nil, fmt.Errorf("relay: schedules: %w", err)
	}
	return s, nil
}

// sweepLoop has a Sweeper runner remove leftovers now and every sweep
// interval: a container whose removal failed while its runtime was down
// would otherwise run on past its timeout.
func (w *Worker) sweepLoop(ctx context.Context) {
	sw, ok := w.cfg.Runner.(Sweeper)
	if !ok {
		return
	}
	sweep := func() {
		if err := sw.Sweep(ctx); err != nil && ctx.Err() == nil {
			w.log.LogAttrs(ctx, slog.LevelWarn, "sweeping leftovers failed", slog.Any("error", err))
		}
	}
	sweep()
	every(ctx, w.cfg.SweepInterval, sweep)
}

// Ready reports whether the Worker can do its job now
// (docs/embedding.md#worker): Redis answers on every stream,
// every Engine is consuming, and the Runner answers when it is a Pinger.
// The error names each part that is not ready. The checks run at once,
// each with all of ctx's time: a Redis that hangs until the deadline must
// not make a healthy runner look unreachable.
func (w *Worker) Ready(ctx context.Context) error {
	several := len(w.engines) > 1
	errs := make([]error, 2*len(w.engines)+1)
	var wg sync.WaitGroup
	for i, e := range w.engines {
		redisName, consumingName := "redis", "consuming"
		if several {
			redisName, consumingName = "redis "+e.c.Stream, "consuming "+e.c.Stream
		}
		wg.Go(func() {
			if err := w.streams[i].source.Ping(ctx); err != nil {
				errs[2*i] = fmt.Errorf("%s: %w", redisName, err)
			}
		})
		if err := e.Ping(ctx); err != nil {
			errs[2*i+1] = fmt.Errorf("%s: %w", consumingName, err)
		}
	}
	if p, ok := w.cfg.Runner.(Pinger); ok {
		wg.Go(func() {
			if err := p.Ping(ctx); err != nil {
				errs[len(errs)-1] = fmt.Errorf("runner: %w", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
