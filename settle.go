package relay

import (
	"context"
	"log/slog"

	"github.com/relaydev/relay/invocation"
)

// verdict is what the stages of one delivery found, for settle.
type verdict struct {
	// outcomes has one entry per invocation driven and recorded, the
	// malformed pseudo-invocation included.
	outcomes []Outcome
	// last, when hasLast, is the attempt after which nothing ran, not
	// recorded yet: settle records it.
	last    attempt
	hasLast bool
	// needsAllRules is set for an external event that was matched: its
	// acknowledgement also needs every app's rules to be known.
	needsAllRules bool
	// hasState is set when the message may have invocation state, to be
	// retained once it is acknowledged.
	hasState bool
	// pending keeps the message pending for a reason outside its
	// invocations (matching failed, the occurrence's app is unavailable,
	// ...).
	pending *pendingReason
}

// pendingReason says why a message stays pending, as its log line.
type pendingReason struct {
	level slog.Level
	msg   string
	err   error
	attrs []slog.Attr
	// app names the app the reason concerns, "" for none: it is counted
	// as a hold of that app (holds.go).
	app string
}

// Reasons to leave a message pending that are not errors.
var (
	pendingUnfinished = &pendingReason{level: slog.LevelDebug, msg: "message left pending"}
	pendingIncomplete = &pendingReason{level: slog.LevelDebug, msg: "event left pending while apps have rules that could not be read"}
)

// decide is the one place that says whether a message is acknowledged
// (docs/delivery.md#from-entry-to-acknowledgement): only when nothing kept
// it pending, every invocation's outcome is terminal, and, for a matched
// event, every app's rules are known. A last attempt that succeeded counts
// as terminal: settle acknowledges only once its success is recorded. It
// returns nil to acknowledge, else why not.
func decide(v *verdict, g *generation) *pendingReason {
	if v.pending != nil {
		return v.pending
	}
	if v.hasLast && v.last.next != finish && !v.last.o.Kind.Terminal() {
		return pendingUnfinished
	}
	for _, o := range v.outcomes {
		if !o.Kind.Terminal() {
			return pendingUnfinished
		}
	}
	if v.needsAllRules && len(g.incomplete) > 0 {
		// An app whose rules are unknown might match the event, or declare
		// a handler it left unfinished.
		p := *pendingIncomplete
		p.attrs = []slog.Attr{slog.Any("apps", g.incomplete)}
		return &p
	}
	return nil
}

// settle is the last stage: it records the last attempt, acknowledges the
// message when decide says so, and reports whether it did. The success of
// the last attempt of a message to acknowledge is recorded with the
// acknowledgement and the retention in one step when the Engine has a
// Settler (Settler.FinishSettle).
func (e *Engine) settle(ctx context.Context, d *delivery, v *verdict) bool {
	if v.hasLast && (v.last.next != finish || e.c.Settler == nil) {
		v.outcomes = append(v.outcomes, e.report(ctx, d, e.record(ctx, d, &v.last)))
		v.hasLast = false
	}
	p := decide(v, d.gen)
	if p != nil || (!v.hasLast && v.hasState) {
		// Settled alone or not at all: the rest of the read's batch need
		// not wait for it (readsettle.go).
		d.leaveSettles()
	}
	if v.hasLast {
		o := e.finishLast(ctx, d, &v.last, p == nil)
		e.report(ctx, d, o)
		if o.Kind != Succeeded {
			p = pendingUnfinished
		} else if p == nil {
			e.held.set(d.msg.ID, heldBy{})
			e.obs.message(ctx, d, msgEvent{kind: msgAcked})
			return true
		}
	}
	if p != nil {
		e.held.set(d.msg.ID, holdsOf(v, p, d.gen))
		e.obs.message(ctx, d, msgEvent{kind: msgLeftPending, pending: p})
		return false
	}
	if err := e.ack(ctx, d, v.hasState); err != nil {
		e.obs.message(ctx, d, msgEvent{kind: msgAckFailed, err: err})
		return false
	}
	e.held.set(d.msg.ID, heldBy{})
	e.obs.message(ctx, d, msgEvent{kind: msgAcked})
	return true
}

// finishLast records the success of a message's last attempt a: with the
// message's acknowledgement and retention (Settler.FinishSettle) when ack
// is set, else alone.
func (e *Engine) finishLast(ctx context.Context, d *delivery, a *attempt, ack bool) Outcome {
	l := a.lease
	if ack {
		return e.finishWith(ctx, d, a, func(octx context.Context) error { return e.finishSettle(octx, d, l) })
	}
	return e.finishWith(ctx, d, a, func(octx context.Context) error { return e.c.State.Finish(octx, l) })
}

// ack acknowledges d's message and, when it may have state, switches that
// state to terminal retention (docs/delivery.md#invocation-state): through
// Components.Settler in one step when set, else XACK then Retain. A failed
// retention only leaks the hash, so it does not fail the ack.
func (e *Engine) ack(ctx context.Context, d *delivery, hasState bool) error {
	var retainErr error
	var err error
	if hasState && e.c.Settler != nil {
		err = e.persist(ctx, func(octx context.Context) (ackErr error) {
			ackErr, retainErr = e.c.Settler.Settle(octx, d.key, e.cfg.Retention)
			return ackErr
		})
		if err == nil && retainErr != nil {
			retainErr = e.retain(ctx, d.key)
		}
	} else {
		err = e.persist(ctx, func(octx context.Context) error {
			if hasState {
				return e.c.Source.Ack(octx, d.msg.ID)
			}
			return e.sourceAck(octx, d)
		})
		if err == nil && hasState {
			retainErr = e.retain(ctx, d.key)
		}
	}
	if err != nil {
		return err
	}
	if retainErr != nil {
		e.obs.message(ctx, d, msgEvent{kind: msgRetainFailed, err: retainErr})
	}
	return nil
}

// retain switches key's state to retention.
func (e *Engine) retain(ctx context.Context, key invocation.Key) error {
	return e.persist(ctx, func(octx context.Context) error { return e.c.State.Retain(octx, key, e.cfg.Retention) })
}
