package relay

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// One delivery of one message, top to bottom
// (docs/delivery.md#from-entry-to-acknowledgement):
//
//	classify  classify.go    what the entry is: an external event, a schedule
//	                         occurrence, or malformed
//	match     match.go       which invocations the event has: the rules it
//	                         matches plus those earlier deliveries left
//	                         unfinished (occurrence.go resolves an occurrence
//	                         to its schedule's handler instead)
//	invoke    invoke.go      each invocation in dispatch order: claim, run;
//	                         returns an attempt and the transition that
//	                         records it
//	record    record.go      writes an attempt's transition: ok, the next
//	                         attempt's due time, exhaustion and its
//	                         dead-letter entry (deadletter.go), or the attempt
//	                         given back; returns an Outcome
//	settle    settle.go      from the outcomes alone: acknowledge (and retain
//	                         the state) or leave the message pending
//
// Each attempt is recorded before the next runs, so that a crash never
// loses a success; the last one, after which nothing runs, is recorded by
// settle, which fuses its success with the acknowledgement
// (Settler.FinishSettle). Each stage returns what happened; deliver reports
// every outcome once to the observers (observe.go). Nothing but settle
// decides whether a message is acknowledged.

// delivery is one message being handled by this worker.
type delivery struct {
	msg stream.Message
	key invocation.Key
	// event is the raw "event" field, as delivered.
	event string
	// gen is the app generation the delivery runs with, from start to end.
	gen *generation
	// span is the delivery's stream.message span.
	span trace.Span
	// handlerCtx is what handlers run under: it outlives the Engine's stop by
	// the shutdown timeout, so running handlers can finish.
	handlerCtx context.Context
	// invocations lists a first delivery's invocations until a claim
	// recorded them (invocation.Record); invocationsComplete says they are
	// all the message has.
	invocations         []string
	invocationsComplete bool
	// settles is the settle group of the read the message came in, nil for
	// none; settleDone is set once the delivery joined or left it
	// (readsettle.go).
	settles    *readSettles
	settleDone bool
}

// deliver handles one delivery of msg; ctx ends when the Engine stops,
// handlerCtx when it abandons running handlers.
func (e *Engine) deliver(ctx, handlerCtx context.Context, j job) {
	msg := j.msg
	d := &delivery{msg: msg, key: e.key(msg.ID), event: msg.Fields["event"], gen: e.gen.Load(), handlerCtx: handlerCtx, settles: j.settles}
	defer d.leaveSettles()
	ctx = e.startMessage(ctx, d)
	var v verdict
	switch c := classify(msg, e.cfg.MaxEventBytes); c.kind {
	case classOccurrence:
		v = e.occurrence(ctx, d)
	case classMalformed:
		e.obs.message(ctx, d, msgEvent{kind: msgReceived})
		v = e.malformed(ctx, d, c.reason)
	case classOversized:
		// The payload goes nowhere: not into the DLQ entry, a log line or
		// a span.
		d.event = c.summary
		e.obs.message(ctx, d, msgEvent{kind: msgReceived})
		e.obs.message(ctx, d, msgEvent{kind: msgOversized, reason: c.reason})
		v = verdict{outcomes: []Outcome{e.report(ctx, d, e.deadLetterMessage(ctx, d, c.reason))}, hasState: true}
	default:
		e.obs.message(ctx, d, msgEvent{kind: msgReceived})
		v = e.event(ctx, d)
	}
	acked := e.settle(ctx, d, &v)
	e.endMessage(d, acked)
}

// event runs the match and invoke stages of an external event, and
// records every attempt but the last.
func (e *Engine) event(ctx context.Context, d *delivery) verdict {
	plan, p := e.match(ctx, d)
	switch {
	case p != nil:
		return verdict{pending: p}
	case plan.malformed != "":
		return e.malformed(ctx, d, plan.malformed)
	case plan.unmatched():
		e.obs.message(ctx, d, msgEvent{kind: msgUnmatched})
		return verdict{needsAllRules: true}
	}
	e.obs.message(ctx, d, msgEvent{kind: msgMatched})
	if d.msg.Deliveries < 2 {
		// The first claim records every invocation, so a redelivery runs
		// exactly these.
		d.invocations, d.invocationsComplete = plan.fields(), len(d.gen.incomplete) == 0 && len(plan.unknown) == 0
	}
	v := verdict{needsAllRules: true, hasState: true,
		outcomes: make([]Outcome, 0, len(plan.calls)+len(plan.orphans)+len(plan.unknown))}
	for _, t := range plan.unknown {
		v.outcomes = append(v.outcomes, e.report(ctx, d, unknownTarget(t)))
	}
	for i, c := range plan.calls {
		a := e.invoke(ctx, d, c)
		if i == len(plan.calls)-1 {
			v.last, v.hasLast = a, true // nothing runs after it: settle records it
			continue
		}
		v.outcomes = append(v.outcomes, e.report(ctx, d, e.record(ctx, d, &a)))
	}
	for _, f := range plan.orphans {
		v.outcomes = append(v.outcomes, e.report(ctx, d, e.orphan(ctx, d, f)))
	}
	return v
}

// malformed dead-letters an external event that can never succeed
// (docs/delivery.md#from-entry-to-acknowledgement), once; its message is
// then acknowledged.
func (e *Engine) malformed(ctx context.Context, d *delivery, reason string) verdict {
	e.obs.message(ctx, d, msgEvent{kind: msgMalformed, reason: reason})
	return verdict{outcomes: []Outcome{e.report(ctx, d, e.deadLetterMessage(ctx, d, reason))}, hasState: true}
}

// report hands o to every observer, once, and returns it.
func (e *Engine) report(ctx context.Context, d *delivery, o Outcome) Outcome {
	e.obs.invocation(ctx, d, o)
	return o
}

// key is the invocation-state key of message id.
func (e *Engine) key(id string) invocation.Key {
	return invocation.Key{Stream: e.c.Stream, Group: e.c.Group, MessageID: id}
}

// startMessage starts the stream.message span of d (docs/observability.md#traces).
// It continues the producer's trace when the entry carries a traceparent;
// otherwise the span is a new root, never a child of whatever span ctx
// holds (Run's context lives for the whole worker).
func (e *Engine) startMessage(ctx context.Context, d *delivery) context.Context {
	ctx, d.span = startMessageSpan(ctx, e.tracer, e.c.Stream, e.c.Group, e.c.Consumer, d.msg)
	return ctx
}

// endMessage ends d's span, recording whether the message was acknowledged.
func (e *Engine) endMessage(d *delivery, acked bool) {
	endMessageSpan(d.span, acked)
}

// call is one invocation a delivery drives: the handler to run, its limits
// and its stdin. Event rules and schedule occurrences both end up here.
type call struct {
	app     string
	handler string
	timeout time.Duration
	retries int
	input   []byte
	// invField is the invocation field when known ahead (generation.fields).
	invField string
}

// field is the invocation field of c: "app/handler".
func (c call) field() string {
	if c.invField != "" {
		return c.invField
	}
	return c.app + "/" + c.handler
}
