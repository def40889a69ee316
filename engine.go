package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/telemetry"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// ErrEngineRunning is returned by Run when the Engine is already running.
var ErrEngineRunning = errors.New("relay: engine already running")

// Components are the Engine's required parts and the identity of the
// consumer it runs as. Matcher may be nil: the default matches every rule of
// the Engine's apps.
type Components struct {
	Matcher Matcher
	Source  StreamSource
	State   StateStore
	Runner  Runner
	DLQ     DLQWriter
	// Stream, Group and Consumer name the source stream, the consumer group
	// and this consumer; they key invocation state and fill DLQ entries.
	Stream, Group, Consumer string
}

// Engine consumes one stream through one consumer group and runs the
// matched handlers of its apps with the delivery semantics of events.md.
// Create it with New and start it with Run.
type Engine struct {
	c       Components
	apps    *Apps
	o       *options
	log     *slog.Logger
	m       *metrics
	tracer  trace.Tracer
	stats   *statsRecorder // nil without WithStats
	running atomic.Bool
	// consuming is set while Run's read loop is running and its last read
	// of the stream succeeded (Ping, /readyz).
	consuming atomic.Bool
	// ackRetain, when set, acknowledges and retains a message in one round
	// trip (pipelinedAck).
	ackRetain ackRetainer

	msgSlots chan struct{}
	// handlers hands a message to an idle handleLoop; dispatchDone is
	// closed when Run stops dispatching. Both are made by Run.
	handlers     chan func()
	dispatchDone chan struct{}
	limiter      *Limiter

	mu       sync.Mutex
	inFlight map[string]struct{}
	// waiting holds reclaimed messages this consumer now owns but has not
	// dispatched yet (no free message slot): they are heartbeated too, or
	// another worker would reclaim them while they wait.
	waiting map[string]struct{}

	// incomplete names apps whose rules could not all be read; while it is
	// non-empty no matched or unmatched message is acknowledged.
	incomplete []string
}

// groupEnsurer is implemented by sources that create their consumer group.
type groupEnsurer interface {
	EnsureGroup(ctx context.Context) error
}

// ackRetainer is the optional StateStore capability behind pipelinedAck.
type ackRetainer interface {
	AckRetain(ctx context.Context, key invocation.Key, ttl time.Duration) (ackErr, retainErr error)
}

// pipelinedAck returns the state store as an ackRetainer when it may stand
// in for Source.Ack followed by StateStore.Retain: the source is a
// *stream.Source reading c.Stream in c.Group and the store an
// *invocation.Store on the same Redis client. Acknowledging is then one
// round trip instead of two (invocation.Store.AckRetain), which the
// pipeline benchmark (bench/pipeline) shows as the largest share of a
// message's time in a worker: a message holds its slot for a read, claim,
// finish, ack and retain, each a round trip. Any other pairing, including
// wrapped components, keeps the two calls.
func pipelinedAck(c Components) ackRetainer {
	src, ok := c.Source.(*stream.Source)
	if !ok || src.Stream() != c.Stream || src.Group() != c.Group {
		return nil
	}
	st, ok := c.State.(*invocation.Store)
	if !ok || !sameClient(src.Client(), st.Client()) {
		return nil
	}
	return st
}

// sameClient reports whether a and b are the same client value; clients of
// a type that cannot be compared are never the same.
func sameClient(a, b rueidis.Client) bool {
	if a == nil || b == nil {
		return false
	}
	ta, tb := reflect.TypeOf(a), reflect.TypeOf(b)
	return ta == tb && ta.Comparable() && a == b
}

// New validates c and opts and returns an Engine for apps. It fails naming
// the missing component or the bad option.
func New(apps *Apps, c Components, opts ...Option) (*Engine, error) {
	var errs []error
	if apps == nil {
		errs = append(errs, errors.New("relay: New: nil apps"))
	}
	if c.Matcher == nil && apps != nil {
		c.Matcher = apps.Matcher()
	}
	for name, missing := range map[string]bool{
		"Source": c.Source == nil, "State": c.State == nil, "Runner": c.Runner == nil, "DLQ": c.DLQ == nil,
		"Stream": c.Stream == "", "Group": c.Group == "", "Consumer": c.Consumer == "",
	} {
		if missing {
			errs = append(errs, fmt.Errorf("relay: New: Components.%s is required", name))
		}
	}
	o, err := buildOptions(opts)
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	m, err := newMetrics(o.registerer)
	if err != nil {
		return nil, fmt.Errorf("relay: register metrics: %w", err)
	}
	e := &Engine{
		c: c, apps: apps, o: o, m: m,
		// Every line names the stream: a worker may run one Engine per
		// stream into one log.
		log: o.logger.With(slog.String("stream", c.Stream)), tracer: newTracer(o.tracerProvider),
		// Messages waiting for an app slot must not starve other apps, so
		// twice as many messages as invocations may be in flight.
		msgSlots:   make(chan struct{}, 2*o.concurrency),
		limiter:    o.limiter,
		inFlight:   map[string]struct{}{},
		waiting:    map[string]struct{}{},
		incomplete: apps.Incomplete(),
		stats:      newStatsRecorder(o.statsClient, c.Stream, c.Group),
		ackRetain:  pipelinedAck(c),
	}
	if e.limiter == nil {
		e.limiter, _ = NewLimiter(o.concurrency) // o.concurrency > 0: checked by WithConcurrency
	}
	return e, nil
}

// Run consumes until ctx is cancelled, then stops gracefully: it stops
// reading and reclaiming, lets running invocations finish for up to the
// shutdown timeout, abandons the rest (their messages stay pending, no
// attempt is charged) and returns nil. It returns an error only when the
// engine cannot start (for example the consumer group cannot be created).
func (e *Engine) Run(ctx context.Context) error {
	if !e.running.CompareAndSwap(false, true) {
		return ErrEngineRunning
	}
	defer e.running.Store(false)
	defer e.consuming.Store(false)
	if g, ok := e.c.Source.(groupEnsurer); ok {
		if err := g.EnsureGroup(ctx); err != nil {
			return fmt.Errorf("relay: ensure consumer group %q on stream %q: %w", e.c.Group, e.c.Stream, err)
		}
	}
	if len(e.incomplete) > 0 {
		e.log.LogAttrs(ctx, slog.LevelError, "apps have rules that could not be read; no message will be acknowledged until their templates are fixed",
			slog.Any("apps", e.incomplete))
	}
	e.log.LogAttrs(ctx, slog.LevelInfo, "worker started",
		slog.String("group", e.c.Group), slog.String("consumer", e.c.Consumer),
		slog.Int("apps", len(e.apps.List())), slog.Int("max_concurrency", e.o.concurrency))

	// Invocations run under runCtx, which outlives ctx by the shutdown
	// timeout so running handlers can finish.
	runCtx, abandon := context.WithCancel(context.WithoutCancel(ctx))
	defer abandon()
	e.handlers, e.dispatchDone = make(chan func()), make(chan struct{})
	var msgs sync.WaitGroup
	var loops sync.WaitGroup
	loops.Go(func() { e.readLoop(ctx, runCtx, &msgs) })
	loops.Go(func() { e.reclaimLoop(ctx, runCtx, &msgs) })
	loops.Go(func() { e.heartbeatLoop(ctx) })
	loops.Go(func() { e.pendingLoop(ctx) })
	loops.Go(func() { e.sweepLoop(ctx) })
	loops.Go(func() { e.statsLoop(ctx) })
	<-ctx.Done()
	loops.Wait()
	close(e.dispatchDone) // idle handler goroutines exit; Run waits for them as msgs

	done := make(chan struct{})
	go func() { msgs.Wait(); close(done) }()
	e.log.LogAttrs(context.Background(), slog.LevelInfo, "worker stopping", slog.Int("in_flight_messages", e.inFlightCount()))
	select {
	case <-done:
	case <-time.After(e.o.shutdownTimeout):
		e.log.LogAttrs(context.Background(), slog.LevelWarn, "shutdown timeout: abandoning running invocations; their messages stay pending",
			slog.Duration("timeout", e.o.shutdownTimeout))
		abandon()
		<-done
	}
	e.flushStats(ctx)
	e.log.LogAttrs(context.Background(), slog.LevelInfo, "worker stopped")
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

// heldIDs lists the messages this worker holds: in flight or waiting for
// a slot.
func (e *Engine) heldIDs() []string {
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

// ErrNotConsuming is returned by Engine.Ping when the Engine is not
// running, or its last read of the stream failed.
var ErrNotConsuming = errors.New("relay: engine not consuming")

// Ping reports whether the Engine is consuming: Run is in its read loop and
// the last XREADGROUP succeeded. It implements Pinger, for readiness
// checks beside the Redis and runtime pings. Safe for concurrent use.
func (e *Engine) Ping(context.Context) error {
	if !e.running.Load() {
		return fmt.Errorf("%w: not running", ErrNotConsuming)
	}
	if !e.consuming.Load() {
		return fmt.Errorf("%w: starting, or its last read of stream %q failed", ErrNotConsuming, e.c.Stream)
	}
	return nil
}

// readLoop reads new entries whenever a message slot is free. Taking the
// slot before reading is the back-pressure: a worker holds at most twice
// MAX_CONCURRENCY messages; one whose app has no free slot waits for it
// (bounded by the concurrency wait) while other apps' messages proceed.
func (e *Engine) readLoop(ctx, runCtx context.Context, msgs *sync.WaitGroup) {
	// The group exists (Run ensured it): consuming until a read fails.
	e.consuming.Store(true)
	defer e.consuming.Store(false)
	var fails int
	idle := true // until a read finds entries
	for {
		n, ok := e.takeSlots(ctx, !idle)
		if !ok {
			return
		}
		batch, err := e.c.Source.Read(ctx, n)
		// A read that finds nothing blocks for seconds holding its slots.
		// While the stream is idle (at start, and after a read found
		// nothing) read one entry at a time: as it blocks, the other slots
		// stay free for reclaimed messages, which otherwise waited for
		// every block to end (bench/pipeline -modes reclaim). The first
		// entry of a burst then comes alone and the rest with the next
		// read, right after.
		idle = err == nil && len(batch) == 0
		e.consuming.Store(err == nil && ctx.Err() == nil)
		if err != nil && ctx.Err() == nil {
			fails++
			e.log.LogAttrs(ctx, slog.LevelError, "stream read failed; retrying", slog.Int("failures", fails), slog.Any("error", err))
		} else {
			fails = 0
		}
		for _, msg := range batch {
			n--
			e.dispatch(ctx, runCtx, msgs, msg)
		}
		for ; n > 0; n-- {
			<-e.msgSlots
		}
		if fails > 0 && !ctxtime.Sleep(ctx, retryDelay(fails)) {
			return
		}
	}
}

// takeSlots waits for a free message slot and, when all is set, takes
// every other one free at that moment; it returns how many it holds, and
// false once ctx is done.
func (e *Engine) takeSlots(ctx context.Context, all bool) (int, bool) {
	select {
	case e.msgSlots <- struct{}{}:
	case <-ctx.Done():
		return 0, false
	}
	if !all {
		return 1, true
	}
	return 1 + e.freeSlots(), true
}

// freeSlots takes every message slot free at this moment, without waiting,
// and returns how many it took.
func (e *Engine) freeSlots() int {
	for n := 0; ; n++ {
		select {
		case e.msgSlots <- struct{}{}:
		default:
			return n
		}
	}
}

// dispatch starts the goroutine of one message; the caller holds its slot.
func (e *Engine) dispatch(ctx, runCtx context.Context, msgs *sync.WaitGroup, msg stream.Message) {
	if !e.track(msg.ID) {
		<-e.msgSlots
		return
	}
	job := func() {
		defer func() { <-e.msgSlots }()
		defer e.untrack(msg.ID)
		e.handle(ctx, runCtx, msg)
	}
	select {
	case e.handlers <- job: // a handler goroutine was idle and took it
	default:
		msgs.Go(func() { e.handleLoop(job) })
	}
}

// handlerIdle is how long a message goroutine waits for another message
// before it exits.
const handlerIdle = time.Second

// handleLoop handles job and then every message handed to it while it is
// idle, until it has waited handlerIdle or Run has stopped dispatching. A
// goroutine per message spent 14-19% of a worker's CPU growing its stack
// (bench/pipeline profiles: claim, handler and acknowledgement go deep);
// one that handles message after message keeps the stack it grew. A new
// one starts only when none is idle, so there are about as many as
// messages were in flight in the last handlerIdle, which the message slots
// bound.
func (e *Engine) handleLoop(job func()) {
	idle := time.NewTimer(handlerIdle)
	defer idle.Stop()
	for {
		job()
		idle.Reset(handlerIdle)
		select {
		case job = <-e.handlers:
		case <-idle.C:
			return
		case <-e.dispatchDone:
			return
		}
	}
}

// boundedReclaimer is an optional StreamSource capability: Reclaim
// claiming at most max entries (stream.Source.ReclaimUpTo).
type boundedReclaimer interface {
	ReclaimUpTo(ctx context.Context, minIdle time.Duration, max int) (msgs []stream.Message, deleted []string, done bool, err error)
}

// reclaimLoop is the message-level backstop of events.md "Recovery": it
// takes over entries idle beyond MinPendingIdle, whoever owned them.
func (e *Engine) reclaimLoop(ctx, runCtx context.Context, msgs *sync.WaitGroup) {
	var fails int
	br, bounded := e.c.Source.(boundedReclaimer)
	every(ctx, e.o.reclaimInterval, func() {
		if bounded {
			e.reclaimBounded(ctx, runCtx, msgs, br, &fails)
			return
		}
		batch, deleted, err := e.c.Source.Reclaim(ctx, e.o.minPendingIdle)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			fails++
			e.log.LogAttrs(ctx, slog.LevelError, "reclaim failed; retrying", slog.Int("failures", fails), slog.Any("error", err))
		} else {
			fails = 0
		}
		for _, id := range deleted {
			e.missingPayload(ctx, id)
		}
		e.dispatchWaiting(ctx, runCtx, msgs, batch)
	})
}

// dispatchWaiting dispatches reclaimed messages as message slots free up.
// While they wait they count as held, so the heartbeat keeps them from
// looking idle to other workers. It returns false when ctx ended the wait.
func (e *Engine) dispatchWaiting(ctx, runCtx context.Context, msgs *sync.WaitGroup, batch []stream.Message) bool {
	e.setWaiting(batch, true)
	defer e.setWaiting(batch, false)
	for i, msg := range batch {
		select {
		case e.msgSlots <- struct{}{}:
			e.dispatch(ctx, runCtx, msgs, msg)
			e.setWaiting(batch[i:i+1], false)
		case <-ctx.Done():
			// The rest stay pending for the next reclaim, by any worker.
			e.log.LogAttrs(ctx, slog.LevelDebug, "shutdown: reclaimed messages left pending", slog.Int("count", len(batch)-i))
			return false
		}
	}
	return true
}

// reclaimBounded is one reclaim pass that claims no more entries than the
// worker has free message slots, plus one, again and again until the pass
// has gone around the PEL. A plain Reclaim claims every idle entry at once:
// bench/memory shows a worker with 8 slots taking all 10,000 entries of a
// dead consumer, holding them in memory and keeping them from every other
// worker while it works through them. Here what this worker cannot start
// stays idle in the PEL for whichever worker has room. The one entry beyond
// the free slots keeps the backstop moving while new messages fill every
// slot: it waits for a slot held (and heartbeated) like a reclaimed batch,
// and the pass goes on once it is dispatched. A call that returns fewer
// entries than asked without finishing the pass reached the source's bound
// of calls: the next tick goes on.
func (e *Engine) reclaimBounded(ctx, runCtx context.Context, msgs *sync.WaitGroup, br boundedReclaimer, fails *int) {
	for ctx.Err() == nil {
		n := e.freeSlots()
		want := n + 1
		batch, deleted, done, err := br.ReclaimUpTo(ctx, e.o.minPendingIdle, want)
		for _, id := range deleted {
			e.missingPayload(ctx, id)
		}
		short := len(batch) < want
		i := 0
		for ; i < len(batch) && n > 0; i++ {
			n--
			e.dispatch(ctx, runCtx, msgs, batch[i])
		}
		for ; n > 0; n-- {
			<-e.msgSlots
		}
		if !e.dispatchWaiting(ctx, runCtx, msgs, batch[i:]) {
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				*fails++
				e.log.LogAttrs(ctx, slog.LevelError, "reclaim failed; retrying", slog.Int("failures", *fails), slog.Any("error", err))
			}
			return
		}
		*fails = 0
		if done || short {
			return
		}
	}
}

// missingPayload handles a PEL reference whose stream entry is gone: data
// loss, counted and logged, never a fabricated payload or DLQ entry
// (events.md "Guarantees summary"). Redis already cleared the reference.
func (e *Engine) missingPayload(ctx context.Context, id string) {
	e.m.missingPayload.Inc()
	e.log.LogAttrs(ctx, slog.LevelError, "pending entry has no payload; it was deleted or trimmed while unacknowledged",
		slog.String(telemetry.MessageID, id))
	e.retain(ctx, id, nil)
}

// heartbeatLoop keeps the PEL idle time of in-flight messages low so other
// consumers' XAUTOCLAIM does not take live work.
func (e *Engine) heartbeatLoop(ctx context.Context) {
	hb, ok := e.c.Source.(Heartbeater)
	if !ok {
		return
	}
	every(ctx, e.o.heartbeat, func() {
		ids := e.heldIDs()
		if len(ids) == 0 {
			return
		}
		if err := hb.Heartbeat(ctx, ids...); err != nil && ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "heartbeat failed; other workers may reclaim running messages",
				slog.Int("messages", len(ids)), slog.Any("error", err))
		}
	})
}

// sweepLoop has a Sweeper runner remove leftovers now and every sweep
// interval: a container whose removal failed while its runtime was down
// would otherwise run on past its timeout.
func (e *Engine) sweepLoop(ctx context.Context) {
	sw, ok := e.c.Runner.(Sweeper)
	if !ok {
		return
	}
	sweep := func() {
		if err := sw.Sweep(ctx); err != nil && ctx.Err() == nil {
			e.log.LogAttrs(ctx, slog.LevelWarn, "sweeping leftovers failed", slog.Any("error", err))
		}
	}
	sweep()
	every(ctx, e.o.sweepInterval, sweep)
}

// every calls fn every d until ctx is done; the owner of each background
// loop (reclaim, heartbeat, pending, stats, sweep) waits for it in Run.
func every(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// retryDelay is a jittered exponential backoff for infrastructure errors:
// 100ms doubling to 5s.
func retryDelay(fails int) time.Duration {
	d := 100 * time.Millisecond << min(fails-1, 6)
	d = min(d, 5*time.Second)
	return d/2 + rand.N(d/2+1)
}
