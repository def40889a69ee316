package relay

import (
	"context"
	"log/slog"

	"github.com/relaydev/relay/invocation"
)

// verdict is what the stages of one delivery found, for settle.
type verdict struct {
	// outcomes has one entry per invocation driven, the malformed
	// pseudo-invocation included.
	outcomes []Outcome
	// classified is set for an external event that was classified: its
	// acknowledgement also needs every app's rules to be known.
	classified bool
	// hasState is set when the message may have invocation state, to be
	// retained once it is acknowledged.
	hasState bool
	// held keeps the message pending for a reason outside its invocations
	// (matching failed, the occurrence's app is unavailable, ...).
	held *hold
}

// hold says why a message stays pending, as its log line.
type hold struct {
	level slog.Level
	msg   string
	err   error
	attrs []slog.Attr
}

// Reasons to leave a message pending that are not errors.
var (
	holdUnfinished = &hold{level: slog.LevelDebug, msg: "message left pending"}
	holdIncomplete = &hold{level: slog.LevelDebug, msg: "event left pending while apps have rules that could not be read"}
)

// allTerminal reports whether every outcome is terminal.
func allTerminal(outcomes []Outcome) bool {
	for _, o := range outcomes {
		if !o.Kind.Terminal() {
			return false
		}
	}
	return true
}

// settled reports whether an outcome's transition already acknowledged the
// message (Settler.FinishSettle).
func settled(outcomes []Outcome) bool {
	for _, o := range outcomes {
		if o.Settled {
			return true
		}
	}
	return false
}

// decide is the one place that says whether a message is acknowledged
// (docs/delivery.md#from-entry-to-acknowledgement): only when nothing held
// it, every invocation's outcome is terminal, and, for a classified event,
// every app's rules are known. It returns nil to acknowledge, else why not.
func decide(v verdict, g *generation) *hold {
	if v.held != nil {
		return v.held
	}
	if !allTerminal(v.outcomes) {
		return holdUnfinished
	}
	if v.classified && len(g.incomplete) > 0 {
		// An app whose rules are unknown might match the event, or declare
		// a handler it left unfinished.
		h := *holdIncomplete
		h.attrs = []slog.Attr{slog.Any("apps", g.incomplete)}
		return &h
	}
	return nil
}

// settle is the last stage: it acknowledges the message when decide says
// so, and reports whether it did.
func (e *Engine) settle(ctx context.Context, d *delivery, v verdict) bool {
	if h := decide(v, d.gen); h != nil {
		e.obs.message(ctx, d, msgEvent{kind: msgHeld, hold: h})
		return false
	}
	if settled(v.outcomes) {
		e.obs.message(ctx, d, msgEvent{kind: msgAcked})
		return true
	}
	if err := e.ack(ctx, d, v.hasState); err != nil {
		e.obs.message(ctx, d, msgEvent{kind: msgAckFailed, err: err})
		return false
	}
	e.obs.message(ctx, d, msgEvent{kind: msgAcked})
	return true
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
		err = e.persist(ctx, func(octx context.Context) error { return e.c.Source.Ack(octx, d.msg.ID) })
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
