package relay

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/invocation"
)

// deadLetter writes the DLQ entry of exhausted invocation l, then records
// it written (docs/delivery.md#dead-letter-queue). The entry is persisted
// before the message can be acknowledged; a failed write leaves the message
// pending so a redelivery writes it again, and the marker keeps a
// redelivery from writing it twice.
func (e *Engine) deadLetter(ctx context.Context, d *delivery, l invocation.Lease, entry dlq.Entry, o *Outcome) {
	o.Reason = entry.Reason
	id, err := e.c.DLQ.Write(e.writeCtx(ctx), entry)
	if errors.Is(err, dlq.ErrNotPending) {
		// The message left the PEL after the invocation was found
		// exhausted: refused like any transition of a stale delivery.
		err = fmt.Errorf("%w: %w", invocation.ErrTerminal, err)
	}
	if err != nil {
		o.failed(OpDLQ, err)
		return
	}
	o.DLQID = id
	if err := e.persist(ctx, func(octx context.Context) error { return e.c.State.MarkDLQ(octx, l) }); err != nil {
		// The entry exists; a redelivery may write a duplicate.
		o.failed(OpMarkDLQ, err)
		return
	}
	o.Kind = DeadLettered
}

// entry builds a DLQ entry of d; trace is the traceparent of the span that
// dead-lettered it (dlqTrace), which relay dlq replay links to.
func (e *Engine) entry(d *delivery, app, handler string, attempts int, reason, trace string) dlq.Entry {
	return dlq.Entry{
		OriginalStream: e.c.Stream, OriginalID: d.msg.ID, Group: e.c.Group, Consumer: e.c.Consumer,
		Event: d.event, Reason: reason, App: app, Handler: handler,
		Deliveries: d.msg.Deliveries, HandlerAttempts: attempts, Timestamp: time.Now().UTC(),
		Trace: trace,
	}
}

// deadLetterMessage routes a message that can never succeed (a malformed
// event, an invalid schedule occurrence) to the DLQ without running a
// handler, through the malformed pseudo-invocation, so a redelivery writes
// its entry only once.
func (e *Engine) deadLetterMessage(ctx context.Context, d *delivery, reason string) Outcome {
	o := Outcome{App: dlq.MalformedName, Handler: dlq.MalformedName, MaxAttempts: 1}
	cl, err := e.claim(ctx, d, malformedField, time.Minute, 1, &o)
	if err != nil {
		return o
	}
	switch cl.Status {
	case invocation.Claimed:
		if err := e.persist(ctx, func(octx context.Context) error { return e.c.State.Exhaust(octx, cl.Lease) }); err != nil {
			o.failed(OpExhaust, err)
			return o
		}
		fallthrough
	case invocation.Exhausted:
		e.deadLetter(ctx, d, cl.Lease, e.entry(d, dlq.MalformedName, dlq.MalformedName, 0, reason, dlqTrace(d.span)), &o)
	case invocation.DeadLettered, invocation.Terminal:
		o.Kind = Done
	default:
		// Another delivery is on it right now.
		o.Kind, o.Next = Leased, cl.RunningUntil
	}
	return o
}

// orphan drives an unfinished invocation whose app or rule is no longer
// loaded. It cannot run again, and acknowledging its message without an
// entry would lose it, so it is dead-lettered once any retry is due or any
// lease expired (claiming it with one allowed attempt exhausts it); until
// then the message stays pending. One that never had an attempt charged is
// dropped with its rule, as if the event had arrived after the change.
func (e *Engine) orphan(ctx context.Context, d *delivery, field string) Outcome {
	name, handler, _ := strings.Cut(field, "/")
	o := Outcome{App: name, Handler: handler, Orphan: true}
	if inc := d.gen.incomplete; len(inc) > 0 {
		// Its rule may be in a template that cannot be read now.
		o.Kind, o.Err = Unavailable, fmt.Errorf("apps %v have rules that could not be read; the rule may be there", inc)
		return o
	}
	cl, err := e.claim(ctx, d, field, time.Minute, 1, &o)
	if err != nil {
		return o
	}
	o.Attempt = cl.Lease.Attempt
	switch cl.Status {
	case invocation.Exhausted:
		reason := fmt.Sprintf("app %q no longer declares handler %q (the invocation was unfinished after %s)", name, handler, plural.Of(cl.Lease.Attempt, "attempt"))
		e.deadLetter(ctx, d, cl.Lease, e.entry(d, name, handler, cl.Lease.Attempt, reason, e.prevTrace(cl, d)), &o)
	case invocation.Claimed:
		// With one attempt allowed, only an invocation that never ran is
		// claimed (given back uncharged, or its state went away).
		o.Kind = Dropped
		if err := e.release(ctx, cl.Lease); err != nil {
			o.WriteErr = &WriteError{Op: OpRelease, Err: err}
		}
	case invocation.Running:
		o.Kind, o.Next = Leased, cl.RunningUntil
	case invocation.NotDue:
		o.Kind, o.Next = NotDue, cl.NextAttemptAt
	default:
		o.Kind = Done
	}
	return o
}
