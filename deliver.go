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
//	invoke    invoke.go      each invocation in dispatch order: claim, run,
//	                         record; returns an Outcome
//	settle    settle.go      from the outcomes alone: acknowledge (and retain
//	                         the state) or leave the message pending
//
// Each stage returns what happened; deliver reports every outcome once to
// the observers (observe.go) and hands them to settle. Nothing else decides
// whether a message is acknowledged.

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
	// record lists a first delivery's invocations until a claim recorded
	// them (invocation.Record); recordComplete says they are all the
	// message has.
	record         []string
	recordComplete bool
}

// deliver handles one delivery of msg.
func (e *Engine) deliver(ctx, runCtx context.Context, msg stream.Message) {
	d := &delivery{msg: msg, key: e.key(msg.ID), event: msg.Fields["event"], gen: e.gen.Load()}
	ctx = e.startMessage(ctx, d)
	var v verdict
	switch c := classify(msg, e.cfg.MaxEventBytes); c.kind {
	case classOccurrence:
		v = e.occurrence(ctx, runCtx, d, c)
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
		v = e.event(ctx, runCtx, d)
	}
	acked := e.settle(ctx, d, v)
	e.endMessage(d, acked)
}

// event runs the match and invoke stages of an external event.
func (e *Engine) event(ctx, runCtx context.Context, d *delivery) verdict {
	plan, h := e.match(ctx, d)
	switch {
	case h != nil:
		return verdict{held: h}
	case plan.malformed != "":
		return e.malformed(ctx, d, plan.malformed)
	case plan.unmatched():
		e.obs.message(ctx, d, msgEvent{kind: msgUnmatched})
		return verdict{classified: true}
	}
	e.obs.message(ctx, d, msgEvent{kind: msgMatched})
	if d.msg.Deliveries < 2 {
		// The first claim records every invocation, so a redelivery runs
		// exactly these.
		d.record, d.recordComplete = plan.fields(), len(d.gen.incomplete) == 0 && len(plan.unknown) == 0
	}
	outcomes := make([]Outcome, 0, len(plan.calls)+len(plan.orphans)+len(plan.unknown))
	for _, t := range plan.unknown {
		outcomes = append(outcomes, e.report(ctx, d, unknownTarget(t)))
	}
	for i, c := range plan.calls {
		// The last invocation, after terminal ones, settles the message
		// with its own transition when it succeeds.
		last := i == len(plan.calls)-1 && len(plan.orphans) == 0 && len(d.gen.incomplete) == 0 && allTerminal(outcomes)
		outcomes = append(outcomes, e.report(ctx, d, e.invoke(ctx, runCtx, d, c, last)))
	}
	for _, f := range plan.orphans {
		outcomes = append(outcomes, e.report(ctx, d, e.orphan(ctx, d, f)))
	}
	return verdict{outcomes: outcomes, classified: true, hasState: true}
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
