package relay

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// One delivery of one message, top to bottom (docs/architecture.md):
//
//	decode   match.go    what the entry is: an external event, a schedule
//	                     occurrence, or malformed
//	match    match.go    the invocations the event has, in dispatch order:
//	                     the rules it matches plus those earlier deliveries
//	                     left unfinished (occurrence.go resolves an
//	                     occurrence to its schedule's handler instead)
//	claim    attempt.go  for each invocation in turn: a concurrency slot
//	run                  and a claim of its next attempt, then the handler;
//	                     the attempt ends in an outcome and the transition
//	                     that records it
//	decide   settle.go   from the outcomes alone: acknowledge, or leave the
//	                     message pending
//	settle   settle.go   one Settlement: the transitions not yet written,
//	                     the dead-letter entries, and the acknowledgement
//
// Each stage takes the previous one's value and returns the next; none
// reaches back. An attempt after which another handler of the message
// runs is settled before that one starts, so that a crash never loses a
// success; the last one goes with the acknowledgement. Claims and
// settlements of concurrent deliveries are gathered into one call each
// (batch.go). Every outcome is reported once to the observers
// (observe.go); the stages log nothing themselves.

// pipeline takes messages from read to settlement. It is built from
// explicit parts and reads nothing of the Engine that made it. Safe for
// concurrent use.
type pipeline struct {
	id      identity
	state   StateStore
	runner  Runner
	limiter *Limiter
	cfg     Config
	tracer  trace.Tracer
	obs     observers
	m       *metrics
	log     *slog.Logger

	// claims and settles gather the calls of concurrent deliveries, and
	// act says what the deliveries do (batch.go).
	claims  *batcher[invocation.ClaimRequest, invocation.Claim]
	settles *batcher[invocation.Settlement, []invocation.TransitionResult]
	act     *activity
	// voids gives back claims whose outcome was not learnt (voids.go).
	voids *voider
	held  *heldSet
	runs  *runningSet
	// pacer spaces the next tries of throttled invocations (flow.go).
	pacer *pacer
	// claimFails counts the claims that failed in a row (a store error,
	// not a claim refused): while it is not 0 the read loop paces its
	// reads.
	claimFails atomic.Int32
	// writeEnds and successEnds share the deadlines of the writes that
	// record what deliveries did (persist.go).
	writeEnds, successEnds sharedDeadlines
	// skew is how far the store's clock is ahead of this worker's, in
	// nanoseconds, as the latest claim showed it (dueAt).
	skew atomic.Int64
}

// identity names the stream, consumer group and consumer an Engine runs
// as; it keys invocation state and fills dead-letter entries.
type identity struct{ stream, group, consumer string }

// key is the invocation-state key of message id.
func (id identity) key(msgID string) invocation.Key {
	return invocation.Key{Stream: id.stream, Group: id.group, MessageID: msgID}
}

// delivery is one message being handled by this worker: what the stages
// share about it.
type delivery struct {
	msg stream.Message
	key invocation.Key
	// event is the raw "event" field, as delivered (an oversized event's
	// summary instead).
	event string
	// gen is the app generation the delivery runs with, from start to end.
	gen *generation
	// span is the delivery's stream.message span.
	span trace.Span
	// handlerCtx is what handlers run under: it outlives the Engine's stop
	// by the shutdown timeout, and ends early when the message is found no
	// longer pending (Engine heartbeat). abandonCtx is the Engine's: it
	// ends only when running work is abandoned, and bounds the retries of
	// a success's record, shared by every delivery (persistSuccess).
	handlerCtx, abandonCtx context.Context
	// record lists a first delivery's other invocations until a claim
	// recorded them (invocation.Record); complete says they are all the
	// message has.
	record   []string
	complete bool
}

// deliver handles one delivery of msg and reports whether it was
// acknowledged, and when not, the time its next step is due on this
// worker's clock (zero when unknown: the reclaim brings it back); ctx ends
// when the Engine stops, handlerCtx when it abandons running handlers or
// the message is gone, abandonCtx when it abandons running handlers.
func (p *pipeline) deliver(ctx, handlerCtx, abandonCtx context.Context, gen *generation, msg stream.Message) settled {
	d := &delivery{msg: msg, key: p.id.key(msg.ID), event: msg.Fields["event"], gen: gen, handlerCtx: handlerCtx, abandonCtx: abandonCtx}
	ctx, d.span = startMessageSpan(ctx, p.tracer, p.id, msg)
	pl := p.match(ctx, d, p.decode(ctx, d))
	v := verdict{plan: pl}
	if !pl.done() {
		v = p.invoke(ctx, d, pl)
	}
	r := p.settle(ctx, d, v)
	endMessageSpan(d.span, r.acked)
	return r
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

// newGeneration is the generation of apps, classified by m (nil: the
// apps' own matcher).
func newGeneration(apps *app.Set, m Matcher) *generation {
	g := &generation{apps: apps, matcher: m, incomplete: apps.Incomplete(), fields: map[string][]string{}}
	for _, a := range apps.List() {
		fs := make([]string, len(a.Rules))
		for i, r := range a.Rules {
			fs[i] = invocation.Field(a.Name, r.Handler)
		}
		g.fields[a.Name] = fs
	}
	if g.matcher == nil {
		g.matcher = apps.Matcher()
	}
	return g
}

// field is the invocation field of rule i of app name.
func (g *generation) field(name string, i int) string {
	if fs := g.fields[name]; i >= 0 && i < len(fs) {
		return fs[i]
	}
	return ""
}

// call is one invocation a delivery drives: the handler to run, its limits
// and its stdin. Event rules and schedule occurrences both end up here.
type call struct {
	app     string
	handler string
	timeout time.Duration
	retries int
	input   []byte
	// field is the invocation field, "app/handler".
	field string
	// limits is the rule's flow control (docs/flow-control.md); none for
	// a schedule occurrence. gate is the part of it the state store
	// enforces across workers, with the event's limit keys.
	limits app.Limits
	gate   invocation.Gate
}

// lease is how long an attempt of c may run before it counts as lost: its
// timeout plus the grace that covers the runtime's setup and teardown. A
// live attempt must never look expired to another delivery.
func (p *pipeline) lease(c call) time.Duration { return c.timeout + p.cfg.LeaseGrace }

// dispatcher runs deliveries, one goroutine each, while their messages
// hold a message slot: it tracks which messages this consumer works on,
// for the heartbeat, and ends the handlers of those found gone. Made by
// Engine.Run. Safe for concurrent use.
type dispatcher struct {
	p   *pipeline
	gen func() *generation
	// later keeps the messages left pending with a known next time
	// (later.go).
	later *later
	// handlerCtx is what handlers run under: it outlives Run's context by
	// the shutdown timeout, so running handlers can finish.
	handlerCtx context.Context
	// slots bounds the messages the Engine holds (reader.go).
	slots chan struct{}
	// handoff hands a message to an idle handleLoop; done is closed when
	// Run stops dispatching.
	handoff chan stream.Message
	done    chan struct{}
	// msgs counts the message goroutines, which Run waits for.
	msgs sync.WaitGroup

	mu sync.Mutex
	// inFlight holds the messages being delivered, with what ends their
	// handlers.
	inFlight map[string]context.CancelCauseFunc
	// waiting holds reclaimed messages this consumer now owns but has not
	// dispatched yet (no free message slot): they are heartbeated too, or
	// another worker would reclaim them while they wait.
	waiting map[string]struct{}
}

func newDispatcher(p *pipeline, gen func() *generation, handlerCtx context.Context, slots int, l *later) *dispatcher {
	return &dispatcher{p: p, gen: gen, later: l, handlerCtx: handlerCtx, slots: make(chan struct{}, slots),
		handoff: make(chan stream.Message), done: make(chan struct{}),
		inFlight: map[string]context.CancelCauseFunc{}, waiting: map[string]struct{}{}}
}

// dispatch starts the deliveries of msgs; the caller holds a slot for
// each. They count as running from now until they end (batch.go): all of
// them before the first starts, so that its claim waits for the others'.
func (ds *dispatcher) dispatch(ctx context.Context, msgs ...stream.Message) {
	ds.p.act.add(len(msgs), 0)
	for _, msg := range msgs {
		ds.start(ctx, msg)
	}
}

// start starts the delivery of msg, which counts as running.
func (ds *dispatcher) start(ctx context.Context, msg stream.Message) {
	if !ds.track(msg.ID) {
		<-ds.slots // a reclaim of our own slow message
		ds.p.act.add(-1, 0)
		return
	}
	ds.later.drop(msg.ID) // delivered now, whoever brought it
	select {
	case ds.handoff <- msg: // a handler goroutine was idle and took it
	default:
		ds.msgs.Go(func() { ds.handleLoop(ctx, msg) })
	}
}

// handleLoop handles msg and then every message handed to it while it is
// idle, until it has waited handlerIdle or Run has stopped dispatching. A
// goroutine per message spent 14-19% of a worker's CPU growing its stack
// (bench/pipeline profiles: claim, handler and acknowledgement go deep);
// one that handles message after message keeps the stack it grew. A new
// one starts only when none is idle, so there are about as many as
// messages were in flight in the last handlerIdle, which the message slots
// bound.
func (ds *dispatcher) handleLoop(ctx context.Context, msg stream.Message) {
	idle := time.NewTimer(handlerIdle)
	defer idle.Stop()
	for {
		ds.handle(ctx, msg)
		idle.Reset(handlerIdle)
		select {
		case msg = <-ds.handoff:
		case <-idle.C:
			return
		case <-ds.done:
			return
		}
	}
}

// handlerIdle is how long a message goroutine waits for another message
// before it exits.
const handlerIdle = time.Second

// handle delivers msg, then frees its message slot.
func (ds *dispatcher) handle(ctx context.Context, msg stream.Message) {
	defer func() { <-ds.slots }()
	hctx := ds.handlerContext(msg.ID)
	defer ds.untrack(msg.ID)
	defer ds.p.act.add(-1, 0)
	if r := ds.p.deliver(ctx, hctx, ds.handlerCtx, ds.gen(), msg); !r.next.IsZero() && ctx.Err() == nil {
		ds.later.add(msg, r.next, r.waits)
	}
}

// track marks id in flight; false means this worker is already on it (a
// reclaim of our own slow message).
func (ds *dispatcher) track(id string) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if _, busy := ds.inFlight[id]; busy {
		return false
	}
	ds.inFlight[id] = nil
	return true
}

// handlerContext is the context the handlers of message id run under: the
// dispatcher's, ended early when the message is gone (gone).
func (ds *dispatcher) handlerContext(id string) context.Context {
	ctx, cancel := context.WithCancelCause(ds.handlerCtx)
	ds.mu.Lock()
	ds.inFlight[id] = cancel
	ds.mu.Unlock()
	return ctx
}

func (ds *dispatcher) untrack(id string) {
	ds.mu.Lock()
	cancel := ds.inFlight[id]
	delete(ds.inFlight, id)
	ds.mu.Unlock()
	if cancel != nil {
		cancel(nil)
	}
}

// gone ends the handlers of the messages of ids that are in flight here:
// the heartbeat found them no longer pending, so their outcomes cannot be
// recorded and their slots are better given to live work. It returns how
// many it ended.
func (ds *dispatcher) gone(ids []string) int {
	ds.mu.Lock()
	var cancels []context.CancelCauseFunc
	for _, id := range ids {
		if c := ds.inFlight[id]; c != nil {
			cancels = append(cancels, c)
		}
		delete(ds.waiting, id)
	}
	ds.mu.Unlock()
	ds.later.drop(ids...)
	for _, c := range cancels {
		c(errMessageGone)
	}
	return len(cancels)
}

// inFlightCount is how many messages are being delivered.
func (ds *dispatcher) inFlightCount() int {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return len(ds.inFlight)
}

// owned lists the messages this consumer owns: in flight, waiting for a
// slot, or kept for their next step's time (later).
func (ds *dispatcher) owned() []string {
	kept := ds.later.ids()
	ds.mu.Lock()
	defer ds.mu.Unlock()
	ids := make([]string, 0, len(ds.inFlight)+len(ds.waiting)+len(kept))
	for id := range ds.inFlight {
		ids = append(ids, id)
	}
	for id := range ds.waiting {
		if _, dup := ds.inFlight[id]; !dup {
			ids = append(ids, id)
		}
	}
	for _, id := range kept {
		_, busy := ds.inFlight[id]
		if _, waits := ds.waiting[id]; !busy && !waits {
			ids = append(ids, id)
		}
	}
	return ids
}

// setWaiting marks msgs waiting for a slot, or no longer.
func (ds *dispatcher) setWaiting(msgs []stream.Message, waiting bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for _, m := range msgs {
		if waiting {
			ds.waiting[m.ID] = struct{}{}
		} else {
			delete(ds.waiting, m.ID)
		}
	}
}
