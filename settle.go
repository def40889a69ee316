package relay

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/relaydev/relay/invocation"
)

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
	// A Gone invocation found the message out of the PEL: there is nothing
	// to acknowledge, and its other transitions would be inert.
	pendingGone = &pendingReason{level: slog.LevelDebug, msg: "message no longer pending in the consumer group; nothing to acknowledge"}
)

// decide is the one place that says whether a message is acknowledged
// (docs/delivery.md#from-entry-to-acknowledgement): only when nothing kept
// it pending, every invocation's outcome is terminal once its step's
// transition is written, and, for a matched event, every app's rules are
// known. It returns nil to acknowledge, else why not. The settlement that
// acknowledges carries the transitions decide counted on, and applies all
// of them or nothing.
func decide(v verdict, g *generation) *pendingReason {
	if v.pending != nil {
		return v.pending
	}
	for _, s := range v.steps {
		if s.o.Kind == Gone {
			return pendingGone
		}
	}
	for _, s := range v.steps {
		if !s.o.Kind.Terminal() {
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

// settled is what a delivery did with its message: acknowledged it, or
// left it pending with its next step due at next on this worker's clock
// (zero when unknown: the reclaim brings it back), its invocations in
// waits waiting for their rules' limits.
type settled struct {
	acked bool
	next  time.Time
	waits []waitOf
}

// settle is the last stage: it writes, in one Settlement, every
// transition the earlier stages left unwritten and, when decide says so,
// the message's acknowledgement; it reports every outcome not reported
// yet, and returns what became of the message.
func (p *pipeline) settle(ctx context.Context, d *delivery, v verdict) settled {
	why := decide(v, d.gen)
	s := invocation.Settlement{Key: d.key, Ack: why == nil, Stateless: why == nil && !v.hasState, Retention: p.cfg.Retention}
	var written []int // the steps whose transitions s carries
	for i, st := range v.steps {
		if st.t != nil {
			s.Transitions = append(s.Transitions, *st.t)
			written = append(written, i)
		}
	}
	acked, ackFailed := false, error(nil)
	if s.Ack || len(s.Transitions) > 0 {
		res, err := p.write(ctx, d, s)
		switch {
		case err == nil:
			acked = s.Ack
			for k, i := range written {
				v.steps[i] = applied(v.steps[i], res[k])
			}
		case s.Ack && len(written) == 0 && errors.Is(err, invocation.ErrTerminal):
			// Acknowledged already, by another delivery: nothing to do.
			acked = true
		case s.Ack && len(written) == 0:
			ackFailed = err
		default:
			for _, i := range written {
				v.steps[i] = unwritten(v.steps[i], err)
			}
			why = pendingUnfinished
		}
	}
	for _, st := range v.steps {
		if !st.reported {
			p.obs.invocation(ctx, d, st.o)
		}
	}
	switch {
	case acked:
		p.held.set(d.msg.ID, heldBy{})
		p.obs.message(ctx, d, msgEvent{kind: msgAcked})
		return settled{acked: true}
	case ackFailed != nil:
		p.obs.message(ctx, d, msgEvent{kind: msgAckFailed, err: ackFailed})
		return settled{}
	}
	p.held.set(d.msg.ID, holdsOf(v, why, d.gen))
	p.obs.message(ctx, d, msgEvent{kind: msgLeftPending, pending: why})
	next := p.dueAt(v, why)
	if next.IsZero() {
		return settled{}
	}
	return settled{next: next, waits: waitsOf(v)}
}

// dueAt is when the next step of a message left pending for why is due,
// on this worker's clock: the earliest retry due time or lease end of its
// unfinished invocations, when every one of them has one and nothing else
// holds the message; zero otherwise, for the reclaim to bring it back.
func (p *pipeline) dueAt(v verdict, why *pendingReason) time.Time {
	if why != pendingUnfinished {
		return time.Time{}
	}
	var next time.Time
	for _, s := range v.steps {
		switch o := s.o; {
		case o.Kind.Terminal():
		case (o.Kind == Retrying || o.Kind == NotDue || o.Kind == Leased || o.Kind == Throttled || o.Kind == Debounced) && !o.Next.IsZero():
			if next.IsZero() || o.Next.Before(next) {
				next = o.Next
			}
		default:
			return time.Time{}
		}
	}
	if next.IsZero() {
		return next
	}
	return next.Add(-time.Duration(p.skew.Load()))
}

// settleStep writes the transition of s alone, before another handler of
// its message runs, and returns s as written (or its write failure).
func (p *pipeline) settleStep(ctx context.Context, d *delivery, s step) step {
	res, err := p.write(ctx, d, invocation.Settlement{Key: d.key, Transitions: []invocation.Transition{*s.t}, Retention: p.cfg.Retention})
	if err != nil {
		s = unwritten(s, err)
	} else {
		s = applied(s, res[0])
	}
	p.obs.invocation(ctx, d, s.o)
	return step{o: s.o, reported: true}
}

// giveBack gives attempt l back uncharged, at once. When that fails for
// another reason than a contract error, l is given back later, once the
// store answers (voids.go), rather than left to expire into a charged
// attempt; the error then says so.
func (p *pipeline) giveBack(ctx context.Context, d *delivery, l invocation.Lease, g invocation.Gate) error {
	_, err := p.write(ctx, d, invocation.Settlement{Key: d.key, Transitions: []invocation.Transition{{Kind: invocation.Release, Lease: l, Gate: g}}, Retention: p.cfg.Retention})
	if err != nil && !errors.Is(err, invocation.ErrStale) && !errors.Is(err, invocation.ErrTerminal) && p.voids.add(l) {
		err = errors.Join(err, errGivenBackLater)
	}
	return err
}

// errGivenBackLater says that a claim whose release failed is given back
// once the store answers (voids.go).
var errGivenBackLater = errors.New("the attempt is given back once the store answers")

// write applies s in a batch with the settlements of other deliveries
// (batch.go), retrying a failed call within the write timeout (persist),
// or, when s records a success, for as long as persistSuccess allows. It
// returns what each transition wrote.
func (p *pipeline) write(ctx context.Context, d *delivery, s invocation.Settlement) ([]invocation.TransitionResult, error) {
	var res []invocation.TransitionResult
	op := func(octx context.Context) (err error) {
		res, err = p.settles.do(octx, s)
		return err
	}
	for _, t := range s.Transitions {
		if t.Kind == invocation.Finish && d.abandonCtx.Err() == nil {
			return res, p.persistSuccess(ctx, d.abandonCtx, t.Lease, op)
		}
	}
	// A success whose handler returned after the shutdown timeout
	// abandoned it is written within the write timeout, as any other:
	// unwritten, its lease would expire into a charged attempt and the
	// handler run again.
	return res, p.persist(ctx, op)
}

// applied is s once its transition was written, with what it wrote.
func applied(s step, r invocation.TransitionResult) step {
	switch s.t.Kind {
	case invocation.Retry:
		s.o.Next = r.Next
	case invocation.Exhaust, invocation.DeadLetter:
		s.o.DLQID = r.DLQID
		if r.DLQID == "" {
			// Written before, by this attempt's earlier try or another
			// delivery.
			s.o.Kind = Done
		}
	}
	s.t = nil
	return s
}

// unwritten is s when writing its transition failed with err.
func unwritten(s step, err error) step {
	if s.t.Kind == invocation.Release {
		// Not the handler's fault and nothing to lose: the outcome stands;
		// the lease is given back later, or expires.
		s.o.WriteErr = &WriteError{Op: OpRelease, Err: err}
	} else {
		s.o.failed(transitionOps[s.t.Kind], err)
	}
	s.t = nil
	return s
}

// transitionOps are the Op of each transition's write.
var transitionOps = [...]Op{invocation.Finish: OpFinish, invocation.Retry: OpRetry, invocation.Exhaust: OpExhaust,
	invocation.DeadLetter: OpDLQ, invocation.Release: OpRelease}
