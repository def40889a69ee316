package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// run is what the loops of one Engine.Run share to dispatch messages.
type run struct {
	// handlerCtx is what handlers run under: it outlives Run's context by
	// the shutdown timeout, so running handlers can finish.
	handlerCtx context.Context
	// msgs counts the message goroutines, which Run waits for.
	msgs sync.WaitGroup
}

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
	State   StateStore
	Runner  Runner
	DLQ     DLQWriter
	// Settler, when set, settles a message in one step where the Engine
	// would otherwise call Source.Ack and State.Retain, or State.Finish
	// before them. It must act on Source's stream and group and on State's
	// hashes (see Settler). Optional.
	Settler Settler
	// Stream, Group and Consumer name the source stream, the consumer group
	// and this consumer; they key invocation state and fill DLQ entries.
	Stream, Group, Consumer string
}

// Engine consumes one stream through one consumer group and runs the
// matched handlers of its apps with the delivery semantics of
// docs/delivery.md. Create it with NewEngine and start it with Run; a
// worker.Worker runs one Engine per stream. Safe for concurrent use.
type Engine struct {
	c      Components
	cfg    Config
	log    *slog.Logger
	tracer trace.Tracer
	m      *metrics
	obs    observers
	// writeEnds and successEnds share the deadlines of the writes that
	// record what deliveries did (detached, persistSuccess).
	writeEnds, successEnds sharedDeadlines
	// gen is the app generation new deliveries use; a delivery keeps the
	// one it started with.
	gen atomic.Pointer[generation]

	running atomic.Bool
	// runs are the handler attempts running now (Running).
	runs *runningSet
	// consuming is set while Run's read loop runs and its last read of the
	// stream succeeded (Ping, readiness).
	consuming atomic.Bool
	// claimFails counts the claims that failed in a row (a store error,
	// not a claim refused): while it is not 0 the read loop paces its
	// reads (readLoop).
	claimFails atomic.Int32
	// loopFailures keeps the read and reclaim loops' failure lines to one
	// per repeatWindow while they repeat (Redis gone).
	loopFailures *repeats
	// unsettled holds the claims to give back whose outcome was not
	// learnt (unsettled.go).
	unsettled *unsettledClaims

	// msgSlots bounds the messages this Engine holds.
	msgSlots chan struct{}
	// handoff hands a message to an idle handleLoop; dispatchDone is
	// closed when Run stops dispatching. Both are made by Run.
	handoff      chan job
	dispatchDone chan struct{}

	mu       sync.Mutex
	inFlight map[string]struct{}
	// waiting holds reclaimed messages this consumer now owns but has not
	// dispatched yet (no free message slot): they are heartbeated too, or
	// another worker would reclaim them while they wait.
	waiting map[string]struct{}

	// held counts the messages held pending by each reason (holds.go).
	held *heldSet
	// batchSettler is Components.Settler when it settles in batches
	// (readsettle.go), else nil.
	batchSettler BatchSettler
	// uncheckedWarned is set once SetApps warned that the Go handlers of
	// its apps cannot be checked against the Runner.
	uncheckedWarned atomic.Bool
}

// job is one message to deliver and the settle group of its read, nil
// for none.
type job struct {
	msg     stream.Message
	settles *readSettles
}

// generation is one set of apps and the matcher over its rules.
type generation struct {
	apps    *app.Set
	matcher Matcher
	// incomplete names apps whose rules could not all be read; while it is
	// non-empty no matched or unmatched message is acknowledged.
	incomplete []string
	// fields holds the invocation field ("app/handler") of each rule, by
	// app name and rule index, built once rather than per delivery.
	fields map[string][]string
}

// field is the invocation field of rule i of app name.
func (g *generation) field(name string, i int) string {
	if fs := g.fields[name]; i >= 0 && i < len(fs) {
		return fs[i]
	}
	return ""
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
		{"Source", c.Source == nil}, {"State", c.State == nil}, {"Runner", c.Runner == nil}, {"DLQ", c.DLQ == nil},
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
	e := &Engine{
		c: c, cfg: cfg, m: m, log: log, tracer: newTracer(cfg.TracerProvider),
		obs:          newObservers(cfg, log, m, c.Consumer),
		msgSlots:     make(chan struct{}, 2*cfg.MaxConcurrency),
		inFlight:     map[string]struct{}{},
		waiting:      map[string]struct{}{},
		held:         newHeldSet(),
		loopFailures: newRepeats(),
		unsettled:    newUnsettledClaims(),
		runs:         newRunningSet(),
	}
	if cfg.Metrics != nil {
		if err := cfg.Metrics.Register(holdsCollector{e}); err != nil {
			return nil, fmt.Errorf("relay: register metrics: %w", err)
		}
	}
	e.batchSettler, _ = c.Settler.(BatchSettler)
	e.SetApps(apps)
	if unused != nil {
		log.Warn("Go functions are registered that no rule or schedule names", slog.Any("error", unused))
	}
	return e, nil
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
	g := &generation{apps: apps, matcher: e.c.Matcher, incomplete: apps.Incomplete(), fields: map[string][]string{}}
	for _, a := range apps.List() {
		fs := make([]string, len(a.Rules))
		for i, r := range a.Rules {
			fs[i] = a.Name + "/" + r.Handler
		}
		g.fields[a.Name] = fs
	}
	if g.matcher == nil {
		g.matcher = apps.Matcher()
	}
	e.gen.Store(g)
	e.pruneHolds(g)
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
// shutdown timeout, abandons the rest (their messages stay pending, no
// attempt is charged) and returns nil. It returns an error only when the
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
	if _, ok := e.c.Source.(PendingReporter); !ok {
		e.log.LogAttrs(ctx, slog.LevelInfo, "the stream source does not report its PEL; relay_pending_entries stays 0")
	}
	if _, ok := e.c.State.(ClaimVoider); !ok {
		e.log.LogAttrs(ctx, slog.LevelInfo, "the state store cannot give back claims whose reply was lost; their leases will be charged as failed attempts when they expire")
	}
	if _, ok := e.c.Source.(OwnerChecker); !ok {
		e.log.LogAttrs(ctx, slog.LevelDebug, "the stream source cannot say which messages it still owns; held counts keep messages other workers took over")
	}
	if e.c.Settler != nil && e.batchSettler == nil {
		// Only slower: each message is settled in a call of its own.
		e.log.LogAttrs(ctx, slog.LevelDebug, "the Settler is not a BatchSettler; a read's messages are settled one by one")
	}
	if inc := e.gen.Load().incomplete; len(inc) > 0 {
		e.log.LogAttrs(ctx, slog.LevelError, "apps have rules that could not be read; no message will be acknowledged until their templates are fixed",
			slog.Any("apps", inc))
	}
	e.log.LogAttrs(ctx, slog.LevelInfo, "engine started",
		slog.String("group", e.c.Group), slog.String("consumer", e.c.Consumer),
		slog.Int("apps", len(e.Apps().List())), slog.Int("max_concurrency", e.cfg.MaxConcurrency))

	// Invocations run under handlerCtx, which outlives ctx by the shutdown
	// timeout so running handlers can finish.
	handlerCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	e.handoff, e.dispatchDone = make(chan job), make(chan struct{})
	r := &run{handlerCtx: handlerCtx}
	var loops sync.WaitGroup
	loops.Go(func() { e.readLoop(ctx, r) })
	loops.Go(func() { e.reclaimLoop(ctx, r) })
	loops.Go(func() { e.heartbeatLoop(ctx) })
	loops.Go(func() { e.pendingLoop(ctx) })
	loops.Go(func() { e.statsLoop(ctx) })
	loops.Go(func() { e.voidLoop(ctx) })
	<-ctx.Done()
	loops.Wait()
	close(e.dispatchDone) // idle handler goroutines exit; Run waits for them as r.msgs

	done := make(chan struct{})
	go func() { r.msgs.Wait(); close(done) }()
	e.log.LogAttrs(context.Background(), slog.LevelInfo, "engine stopping", slog.Int("in_flight_messages", e.inFlightCount()))
	select {
	case <-done:
	case <-time.After(e.cfg.ShutdownTimeout):
		e.log.LogAttrs(context.Background(), slog.LevelWarn, "shutdown timeout: abandoning running invocations; their messages stay pending",
			slog.Duration("timeout", e.cfg.ShutdownTimeout))
		abandon()
		<-done
	}
	e.flushUnsettled()
	e.flushStats(ctx)
	e.log.LogAttrs(context.Background(), slog.LevelInfo, "engine stopped")
	return nil
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

func (e *Engine) inFlightCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.inFlight)
}

// track marks id in flight; false means this worker is already on it (a
// reclaim of our own slow message).
func (e *Engine) track(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, busy := e.inFlight[id]; busy {
		return false
	}
	e.inFlight[id] = struct{}{}
	return true
}

func (e *Engine) untrack(id string) {
	e.mu.Lock()
	delete(e.inFlight, id)
	e.mu.Unlock()
}

// ownedIDs lists the messages this consumer owns: in flight or waiting for
// a slot.
func (e *Engine) ownedIDs() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids := make([]string, 0, len(e.inFlight)+len(e.waiting))
	for id := range e.inFlight {
		ids = append(ids, id)
	}
	for id := range e.waiting {
		if _, dup := e.inFlight[id]; !dup {
			ids = append(ids, id)
		}
	}
	return ids
}

func (e *Engine) setWaiting(msgs []stream.Message, waiting bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, m := range msgs {
		if waiting {
			e.waiting[m.ID] = struct{}{}
		} else {
			delete(e.waiting, m.ID)
		}
	}
}
