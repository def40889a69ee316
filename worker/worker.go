package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redisinfo"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule/redisschedule"
)

// ErrNoApps is returned by Worker.Run when its AppSource holds no app:
// every event would be acknowledged as unmatched.
var ErrNoApps = errors.New("worker: no apps")

// ErrRan is returned by a second call of Worker.Run.
var ErrRan = errors.New("worker: already ran")

// Worker runs what one relay start process runs (docs/operations.md): an
// Engine per stream sharing one concurrency Limiter, the Scheduler of
// every app's schedules publishing into the first stream, and the
// services that keep them: the reloader of changed apps, one sweeper of
// the Runner's leftovers, the watch of Redis's eviction policy, and per
// stream the retainer of the stream and its dead-letter stream, the
// janitor of leaked invocation state and the watch of its Redis memory.
// Create it with New and run it with Run. Safe for concurrent use.
type Worker struct {
	cfg      Config
	log      *slog.Logger
	streams  []*streamParts
	reloader *reloader
	policy   *policyWatch
	sweeper  *sweeper // nil: the Runner is no relay.Sweeper
	schedCfg scheduleConfig
	// sched is set by Run before the reloader runs.
	sched *scheduleRunner
	ran   atomic.Bool
}

// New validates cfg and builds the Worker's Engines and services,
// registering their metrics. It does not connect: Run does. The error
// names every missing or invalid field, and, when the Runner serves a
// fixed set of Go functions (a runtime.HandlerChecker such as
// runtime.Func), every handler of the apps that has no function
// (relay.CheckHandlers, docs/embedding.md#go-handlers): New loads the apps
// once for that check, from templates too (template.Dir reads its files),
// and leaves a source that cannot be read to Run, which loads and checks
// them again.
func New(cfg Config) (*Worker, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	log := cfg.Engine.Logger
	if log == nil {
		log = slog.Default()
	}
	reg := cfg.Engine.Metrics
	if reg == nil {
		reg = prometheus.NewRegistry() // kept, not exported
	}
	if err := checkHandlers(cfg); err != nil {
		return nil, err
	}
	w := &Worker{cfg: cfg, log: log, policy: &policyWatch{redis: cfg.Redis, interval: cfg.PolicyCheckInterval, log: log}}
	if sw, ok := cfg.Runner.(relay.Sweeper); ok {
		w.sweeper = &sweeper{runner: sw, interval: cfg.SweepInterval, log: log}
	}
	if w.schedCfg, err = newScheduleConfig(cfg, log, reg); err != nil {
		return nil, err
	}
	if w.reloader, err = newReloader(cfg, log, reg, w.serve); err != nil {
		return nil, err
	}
	for _, name := range cfg.Streams {
		p, err := newStreamParts(cfg, name, reg, log)
		if err != nil {
			return nil, err
		}
		w.streams = append(w.streams, p)
	}
	return w, nil
}

// checkHandlers refuses apps naming a Go function the Runner does not
// serve, so that a handler typo fails New rather than Run. Only a Runner
// that says which functions it serves is checked; New takes no context,
// and the sources that load from files or memory need none.
func checkHandlers(cfg Config) error {
	if _, ok := cfg.Runner.(runtime.HandlerChecker); !ok {
		return nil
	}
	apps, err := cfg.Apps.Load(context.Background())
	if err != nil || apps == nil {
		return nil // Run reports it
	}
	if err := relay.CheckHandlers(apps, cfg.Runner); relay.Refuses(err) {
		return fmt.Errorf("worker: New: %w", err)
	}
	return nil
}

// newScheduleConfig is what the Worker's Schedulers are built from; it
// registers their metrics.
func newScheduleConfig(cfg Config, log *slog.Logger, reg prometheus.Registerer) (scheduleConfig, error) {
	sm, err := redisschedule.NewMetrics(reg)
	if err != nil {
		return scheduleConfig{}, fmt.Errorf("worker: register schedule metrics: %w", err)
	}
	tp := cfg.Engine.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return scheduleConfig{redis: cfg.Redis, stream: cfg.Streams[0], tracer: tp, stateDir: cfg.StateDir,
		log: log, observe: sm.Observe, opts: cfg.ScheduleOptions}, nil
}

// Run loads the apps and runs the Worker until ctx is cancelled, then stops
// every part gracefully (relay.Engine.Run) and returns nil. It waits at
// most PrepareWait for the apps' preparations (relay.Preparer) before it
// starts consuming; an app whose preparation is still running then is
// unavailable until it ends (docs/apps.md#changing-apps). It returns an
// error when the worker cannot start: the apps cannot be loaded or there
// are none (ErrNoApps), a stream violates the Redis Cluster key layout,
// the Redis user lacks a permission (the error quotes the server's
// refusal), Redis did not answer within StartupWait (ErrRedisUnreachable),
// a consumer group cannot be created, or the Scheduler fails.
// When one part fails the others are stopped: a worker never runs with a
// stream or its schedules silently left out. Run runs once (ErrRan).
func (w *Worker) Run(ctx context.Context) error {
	if !w.ran.CompareAndSwap(false, true) {
		return ErrRan
	}
	apps, err := w.reloader.load(ctx)
	if err != nil {
		return err
	}
	if err := w.waitForRedis(ctx); err != nil {
		return err
	}
	if err := w.checkLayout(ctx); err != nil {
		return err
	}
	if err := w.checkAccess(ctx); err != nil {
		return err
	}
	if err := w.checkStreams(ctx); err != nil {
		return err
	}
	if w.cfg.StateDir != "" && len(apps.ScheduleSpecs()) > 0 {
		// The Scheduler would find out only once the worker had started.
		if err := redisschedule.CheckStateDir(w.cfg.StateDir); err != nil {
			return fmt.Errorf("worker: Config.StateDir: %w", err)
		}
	}
	w.policy.check(ctx)

	ctx, stop := context.WithCancel(ctx)
	defer func() {
		// A preparation still running ends with ctx.
		stop()
		w.reloader.preparing.Wait()
	}()
	if !w.reloader.start(ctx, apps) {
		return nil // stopped while preparing: nothing was started
	}
	w.log.LogAttrs(ctx, slog.LevelInfo, "worker started", slog.Any("streams", w.cfg.Streams),
		slog.String("group", w.cfg.Group), slog.String("consumer", w.cfg.Consumer))
	if err := w.runServices(ctx, stop); err != nil {
		return err
	}
	w.log.LogAttrs(context.WithoutCancel(ctx), slog.LevelInfo, "worker stopped")
	return nil
}

// runServices runs the Engines, the schedules and every service until ctx
// ends or one part fails, which stops the others.
func (w *Worker) runServices(ctx context.Context, stop context.CancelFunc) error {
	apps := w.reloader.Apps()
	w.setEngineApps(apps)
	var mu sync.Mutex
	var errs []error
	fail := func(err error) {
		mu.Lock()
		errs = append(errs, err)
		mu.Unlock()
		stop()
	}
	var parts sync.WaitGroup
	for _, p := range w.streams {
		parts.Go(func() {
			if err := p.engine.Run(ctx); err != nil && !(ctx.Err() != nil && errors.Is(err, context.Canceled)) {
				fail(err)
			}
		})
	}
	w.sched = &scheduleRunner{cfg: w.schedCfg, fail: fail}
	w.sched.replace(ctx, apps)
	defer w.sched.stop()
	status := &statusPublisher{redis: w.cfg.Redis, group: w.cfg.Group, consumer: w.cfg.Consumer,
		interval: statusInterval(w.cfg), streams: w.streams, limiter: w.cfg.Engine.Limiter, log: w.log}
	services := []interface{ Run(context.Context) }{w.reloader, w.policy, status}
	if w.sweeper != nil {
		services = append(services, w.sweeper)
	}
	for _, p := range w.streams {
		services = append(services, p.retainer, p.janitor)
		if p.memory != nil {
			services = append(services, p.memory)
		}
	}
	for _, s := range services {
		parts.Go(func() { s.Run(ctx) })
	}
	parts.Wait()
	w.sched.stop()
	mu.Lock()
	defer mu.Unlock()
	return errors.Join(errs...)
}

// serve makes next, which follows prev, the apps every Engine uses for
// deliveries from now on, and replaces the Scheduler when the schedules
// changed. Only the reloader calls it, from Run.
func (w *Worker) serve(ctx context.Context, prev, next *app.Set) {
	w.setEngineApps(next)
	if !sameSchedules(prev, next) {
		w.sched.replace(ctx, next)
	}
}

func (w *Worker) setEngineApps(apps *app.Set) {
	for _, p := range w.streams {
		p.engine.SetApps(apps)
	}
}

// Apps returns the apps the Worker serves; nil before Run loaded them.
func (w *Worker) Apps() *app.Set { return w.reloader.Apps() }

// Reload asks the Worker to load its apps again now (relay start does on
// SIGHUP). It does not wait for the reload; a reload already asked for and
// not yet done absorbs the new request. Safe for concurrent use.
func (w *Worker) Reload() { w.reloader.Reload() }

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
		return fmt.Errorf("worker: %w", err)
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
			return fmt.Errorf("worker: stream %s: %w; grant the user the ACL rules of docs/deployment.md (ACL users)", name, err)
		}
		if err != nil {
			w.log.LogAttrs(ctx, slog.LevelWarn, "cannot check the Redis user's permissions", slog.String("stream", name), slog.Any("error", err))
		}
	}
	return nil
}

// checkStreams warns about each stream that does not exist yet, which
// starting creates empty: a misspelled name would otherwise wait forever
// without a word. With RequireStreams it refuses to start instead. An error
// of the probe is left to the parts that follow.
func (w *Worker) checkStreams(ctx context.Context) error {
	for _, name := range w.cfg.Streams {
		n, err := w.cfg.Redis.Do(ctx, w.cfg.Redis.B().Exists().Key(name).Build()).AsInt64()
		switch {
		case err != nil || n > 0:
		case w.cfg.RequireStreams:
			return fmt.Errorf("worker: stream %s does not exist (RequireStreams); check its name, or publish to it first", name)
		default:
			w.log.LogAttrs(ctx, slog.LevelWarn, "stream does not exist; creating it empty with the consumer group: check its name if events were expected",
				slog.String("stream", name), slog.String("group", w.cfg.Group))
		}
	}
	return nil
}

// Ready reports whether the Worker can do its job now
// (docs/embedding.md#worker): Redis answers on every stream,
// every Engine is consuming, and the Runner answers when it is a
// relay.Pinger. The error names each part that is not ready. The checks
// run at once, each with all of ctx's time: a Redis that hangs until the
// deadline must not make a healthy runner look unreachable.
func (w *Worker) Ready(ctx context.Context) error {
	several := len(w.streams) > 1
	errs := make([]error, 2*len(w.streams)+1)
	var wg sync.WaitGroup
	for i, p := range w.streams {
		redisName, consumingName := "redis", "consuming"
		if several {
			redisName, consumingName = "redis "+p.name, "consuming "+p.name
		}
		wg.Go(func() {
			if err := p.ping.Ping(ctx); err != nil {
				errs[2*i] = fmt.Errorf("%s: %w", redisName, err)
			}
		})
		if err := p.engine.Ping(ctx); err != nil {
			errs[2*i+1] = fmt.Errorf("%s: %w", consumingName, err)
		}
	}
	if p, ok := w.cfg.Runner.(relay.Pinger); ok {
		wg.Go(func() {
			if err := p.Ping(ctx); err != nil {
				errs[len(errs)-1] = fmt.Errorf("runner: %w", err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
