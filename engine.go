package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
)

// ErrEngineRunning is returned by Run when the Engine is already running.
var ErrEngineRunning = errors.New("relay: engine already running")

// ErrNotConsuming is returned by Engine.Ping when the Engine is not
// running, or its last read of the stream failed.
var ErrNotConsuming = errors.New("relay: engine not consuming")

// Components are the Engine's parts and the identity of the consumer it
// runs as (docs/embedding.md#engine).
type Components struct {
	// Matcher classifies events. Optional: the default matches every rule
	// of the Engine's apps (app.Set.Matcher).
	Matcher Matcher
	Source  StreamSource
	// State keeps invocation state and settles messages: it acknowledges
	// them and writes their dead-letter entries, so it must act on
	// Source's stream and group (redisstate.Store does, on the same Redis
	// as a redisstream.Source).
	State  StateStore
	Runner Runner
	// Stream, Group and Consumer name the source stream, the consumer group
	// and this consumer; they key invocation state and fill DLQ entries.
	Stream, Group, Consumer string
}

// Engine consumes one stream through one consumer group and runs the
// matched handlers of its apps with the delivery semantics of
// docs/delivery.md. It is the supervisor (docs/architecture.md): it runs
// the read, reclaim and heartbeat loops and hands each message to the
// delivery pipeline (pipeline.go), bounds the concurrency, and stops
// gracefully. Create it with NewEngine and start it with Run; a
// worker.Worker runs one Engine per stream. Safe for concurrent use.
type Engine struct {
	c   Components
	cfg Config
	log *slog.Logger
	p   *pipeline
	// gen is the app generation new deliveries use; a delivery keeps the
	// one it started with.
	gen atomic.Pointer[generation]

	running atomic.Bool
	// kept is Run's set of messages kept for their next step (later.go),
	// nil before Run.
	kept atomic.Pointer[later]
	// consuming is set while Run's read loop runs and its last read of the
	// stream succeeded (Ping, readiness).
	consuming atomic.Bool
	// uncheckedWarned is set once SetApps warned that the Go handlers of
	// its apps cannot be checked against the Runner.
	uncheckedWarned atomic.Bool
}

// NewEngine validates c and cfg and returns an Engine serving apps. It
// fails naming every missing component and invalid setting, and when apps
// is not empty and the Runner serves a fixed set of Go functions, every
// handler that does not match (CheckHandlers).
func NewEngine(apps *app.Set, c Components, cfg Config) (*Engine, error) {
	var errs []error
	if apps == nil {
		errs = append(errs, errors.New("relay: NewEngine: nil apps"))
	}
	// In field order, so the error reads the same on every run.
	for _, f := range []struct {
		name    string
		missing bool
	}{
		{"Source", c.Source == nil}, {"State", c.State == nil}, {"Runner", c.Runner == nil},
		{"Stream", c.Stream == ""}, {"Group", c.Group == ""}, {"Consumer", c.Consumer == ""},
	} {
		if f.missing {
			errs = append(errs, fmt.Errorf("relay: NewEngine: Components.%s is required", f.name))
		}
	}
	cfg, err := cfg.withDefaults()
	errs = append(errs, err)
	var unused error
	if apps != nil && len(apps.List()) > 0 && c.Runner != nil {
		err := CheckHandlers(apps, c.Runner)
		if Refuses(err) {
			errs = append(errs, fmt.Errorf("relay: NewEngine: %w", err))
		}
		unused = err
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, fmt.Errorf("relay: register metrics: %w", err)
	}
	// Every line names the stream: a worker runs one Engine per stream
	// into one log.
	log := cfg.Logger.With(slog.String("stream", c.Stream))
	e := &Engine{c: c, cfg: cfg, log: log, p: newPipeline(c, cfg, m, log)}
	if cfg.Metrics != nil {
		if err := errors.Join(cfg.Metrics.Register(holdsCollector{e}), cfg.Metrics.Register(waitingCollector{e})); err != nil {
			return nil, fmt.Errorf("relay: register metrics: %w", err)
		}
	}
	e.SetApps(apps)
	if cfg.MaxWaiting == 0 {
		for _, b := range cfg.Backoff {
			if b < cfg.MinPendingIdle+cfg.ReclaimInterval {
				log.Warn("MaxWaiting keeps no message, so a retry runs only when a reclaim finds it due: a backoff shorter than MinPendingIdle plus ReclaimInterval runs late",
					slog.Duration("backoff", b), slog.Duration("min_pending_idle", cfg.MinPendingIdle), slog.Duration("reclaim_interval", cfg.ReclaimInterval))
				break
			}
		}
	}
	if unused != nil {
		log.Warn("Go functions are registered that no rule or schedule names", slog.Any("error", unused))
	}
	return e, nil
}

// newPipeline builds the delivery pipeline of an Engine of c and cfg.
func newPipeline(c Components, cfg Config, m *metrics, log *slog.Logger) *pipeline {
	p := &pipeline{
		id: identity{c.Stream, c.Group, c.Consumer}, state: c.State, runner: c.Runner, limiter: cfg.Limiter, cfg: cfg,
		tracer: newTracer(cfg.TracerProvider), obs: newObservers(cfg, log, m, c.Consumer), m: m, log: log,
		act:  newActivity(),
		held: newHeldSet(), runs: newRunningSet(), pacer: newPacer(cfg.ThrottlePoll),
	}
	p.claims, p.settles = newClaims(c.State, p.act, cfg.SettleLinger), newSettles(c.State, p.act, cfg.SettleLinger)
	v, _ := c.State.(ClaimVoider)
	p.voids = &voider{claims: newUnsettledClaims(), v: v, writeCtx: p.writeCtx, voided: m.claimsVoided, log: log}
	return p
}

// CheckHandlers checks apps against r when r serves a fixed set of
// handlers (a runtime.HandlerChecker such as runtime.Func): the error
// (a *runtime.HandlerMismatch for a Func) lists every handler of a Go app
// that r does not serve and every function r serves that nothing names
// (docs/embedding.md#go-handlers). It is nil for any other Runner.
// Refuses tells whether the error stops a start.
func CheckHandlers(apps *app.Set, r Runner) error {
	hc, ok := r.(runtime.HandlerChecker)
	if !ok || apps == nil {
		return nil
	}
	return hc.CheckHandlers(apps.Targets())
}

// Refuses reports whether err, from CheckHandlers, stops an Engine or a
// Worker from starting: a handler has no function. Functions that nothing
// names only warn: an app was removed, or a handler renamed while
// retries or schedule occurrences of the old name are pending.
func Refuses(err error) bool {
	hm, ok := errors.AsType[*runtime.HandlerMismatch](err)
	return err != nil && (!ok || hm.Refuses())
}

// SetApps makes apps the set that deliveries starting from now use;
// deliveries in progress finish with the set they started with
// (docs/apps.md#changing-apps). With Components.Matcher set, that Matcher
// keeps classifying events: replace it by building a new Engine. Safe for
// concurrent use.
func (e *Engine) SetApps(apps *app.Set) {
	g := newGeneration(apps, e.c.Matcher)
	e.gen.Store(g)
	e.p.held.pruneFor(g)
	if names := uncheckedGoApps(apps, e.c.Runner); len(names) > 0 && e.uncheckedWarned.CompareAndSwap(false, true) {
		e.log.LogAttrs(context.Background(), slog.LevelWarn, "the Runner does not say which Go functions it serves (runtime.HandlerChecker), "+
			"so the handlers of these Go apps are not checked at start and a rule naming a missing function fails its attempts; "+
			"a Runner that wraps a runtime.Func must forward CheckHandlers", slog.Any("apps", names))
	}
}

// uncheckedGoApps names the apps whose handlers are Go functions (no
// image; runtime go, or none) when r is not a runtime.HandlerChecker,
// typically a wrapper of a runtime.Func that forwards Run only: nothing
// then checks at start that every handler has a function
// (docs/embedding.md#go-handlers).
func uncheckedGoApps(apps *app.Set, r Runner) []string {
	if _, ok := r.(runtime.HandlerChecker); ok || r == nil || apps == nil {
		return nil
	}
	var names []string
	for _, a := range apps.List() {
		if a.Spec.GoFunctions() {
			names = append(names, a.Name)
		}
	}
	return names
}

// Apps returns the set of apps new deliveries use.
func (e *Engine) Apps() *app.Set { return e.gen.Load().apps }

// Run consumes until ctx is cancelled, then stops gracefully: it stops
// reading and reclaiming, lets running invocations finish for up to the
// shutdown timeout, abandons the rest (their contexts are cancelled, no
// attempt is charged and their messages stay pending; a handler that
// ignores its context and then succeeds has its success recorded) and
// returns nil once every handler returned. It returns an error only when the
// engine cannot start (the consumer group cannot be created).
func (e *Engine) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return ErrEngineRunning
	}
	defer e.running.Store(false)
	defer e.consuming.Store(false)
	if g, ok := e.c.Source.(GroupEnsurer); ok {
		if err := g.EnsureGroup(ctx); err != nil {
			return fmt.Errorf("relay: ensure consumer group %q on stream %q: %w", e.c.Group, e.c.Stream, err)
		}
	} else {
		e.log.LogAttrs(ctx, slog.LevelInfo, "the stream source cannot create its consumer group; it must exist already",
			slog.String("group", e.c.Group))
	}
	e.logStart(ctx)

	// Invocations run under handlerCtx, which outlives ctx by the shutdown
	// timeout so running handlers can finish.
	handlerCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	kept := newLater(e.cfg.MaxWaiting)
	e.kept.Store(kept)
	ds := newDispatcher(e.p, e.gen.Load, handlerCtx, 2*e.cfg.MaxConcurrency, kept)
	fail := &loopLog{log: e.log, repeats: newRepeats()}
	src, p, cfg := e.c.Source, e.p, e.cfg
	services := []func(context.Context){
		(&reader{src: src, ds: ds, p: p, fail: fail, consuming: &e.consuming}).run,
		(&reclaimer{src: src, ds: ds, p: p, fail: fail, interval: cfg.ReclaimInterval, minIdle: cfg.MinPendingIdle}).run,
		(&heartbeat{src: src, ds: ds, p: p, interval: cfg.HeartbeatInterval}).run,
		(&pendingSampler{src: src, ds: ds, p: p, interval: cfg.ReclaimInterval}).run,
		p.voids.run,
		func(ctx context.Context) { kept.run(ctx, ds) },
	}
	var feed *statsFeed
	if cfg.Stats != nil {
		feed = &statsFeed{stats: cfg.Stats, p: p, interval: cfg.StatsInterval}
		services = append(services, feed.run)
	}
	var loops sync.WaitGroup
	for _, run := range services {
		loops.Go(func() { run(ctx) })
	}
	<-ctx.Done()
	loops.Wait()
	close(ds.done) // idle handler goroutines exit; Run waits for them as ds.msgs

	done := make(chan struct{})
	go func() { ds.msgs.Wait(); close(done) }()
	e.log.LogAttrs(context.Background(), slog.LevelInfo, "engine stopping", slog.Int("in_flight_messages", ds.inFlightCount()))
	select {
	case <-done:
	case <-time.After(cfg.ShutdownTimeout):
		e.log.LogAttrs(context.Background(), slog.LevelWarn, "shutdown timeout: abandoning running invocations; their messages stay pending",
			slog.Duration("timeout", cfg.ShutdownTimeout))
		abandon()
		<-done
	}
	p.voids.flush()
	if feed != nil {
		feed.flush(ctx)
	}
	e.log.LogAttrs(context.Background(), slog.LevelInfo, "engine stopped")
	return nil
}

// logStart logs, as Run starts, which optional capabilities the parts
// lack where that changes behaviour, and the Engine's identity.
func (e *Engine) logStart(ctx context.Context) {
	if _, ok := e.c.Source.(PendingReporter); !ok {
		e.log.LogAttrs(ctx, slog.LevelInfo, "the stream source does not report its PEL; relay_pending_entries stays 0")
	}
	if _, ok := e.c.State.(ClaimVoider); !ok {
		e.log.LogAttrs(ctx, slog.LevelInfo, "the state store cannot give back claims whose reply was lost; their leases will be charged as failed attempts when they expire")
	}
	if _, ok := e.c.Source.(OwnerChecker); !ok {
		e.log.LogAttrs(ctx, slog.LevelDebug, "the stream source cannot say which messages it still owns; held counts keep messages other workers took over")
	}
	if inc := e.gen.Load().incomplete; len(inc) > 0 {
		e.log.LogAttrs(ctx, slog.LevelError, "apps have rules that could not be read; no message will be acknowledged until their templates are fixed",
			slog.Any("apps", inc))
	}
	e.log.LogAttrs(ctx, slog.LevelInfo, "engine started",
		slog.String("group", e.c.Group), slog.String("consumer", e.c.Consumer),
		slog.Int("apps", len(e.Apps().List())), slog.Int("max_concurrency", e.cfg.MaxConcurrency))
}

// Ping reports whether the Engine is consuming: Run is in its read loop and
// the last XREADGROUP succeeded. It implements Pinger, for readiness checks
// beside the Redis and runtime pings. Safe for concurrent use.
func (e *Engine) Ping(context.Context) error {
	if !e.running.Load() {
		return fmt.Errorf("%w: not running", ErrNotConsuming)
	}
	if !e.consuming.Load() {
		return fmt.Errorf("%w: starting, or its last read of stream %q failed", ErrNotConsuming, e.c.Stream)
	}
	return nil
}
