package relay

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/invocation"
)

// gateOf is the part of limits the state store enforces across workers
// for event (docs/flow-control.md): the rule's cluster concurrency, its
// rate and its debounce, each with the event's limit key. A rule without
// them has the zero Gate, and its claims cost nothing more.
func gateOf(l app.Limits, event []byte) invocation.Gate {
	var g invocation.Gate
	if l.Concurrency > 0 && l.Scope == app.ScopeCluster {
		g.Slots, g.SlotKey = l.Concurrency, app.KeyOf(event, l.ConcurrencyKey)
	}
	if !l.Rate.IsZero() {
		g.Interval, g.Burst, g.RateKey = l.Rate.Interval(), max(l.RateBurst, 1), app.KeyOf(event, l.RateKey)
	}
	if l.Debounce.Period > 0 {
		g.Period, g.DebounceKey = l.Debounce.Period, app.KeyOf(event, l.Debounce.Key)
	}
	return g
}

// Waiting counts the invocations of one rule that this Engine keeps
// waiting for a flow-control limit (docs/flow-control.md#waiting): their
// messages stay pending, owned by this worker, and are delivered again at
// the time the limit gave.
type Waiting struct {
	App, Handler string
	// Limit is what they wait for: "concurrency" (the rule's slots across
	// workers are all held), "rate" or "debounce".
	Limit string
	// Count is how many invocations wait; Oldest is the time of the oldest
	// one's event (from its stream entry id).
	Count  int
	Oldest time.Time
}

// waitOf is one invocation of a kept message that waits for a limit.
type waitOf struct {
	app, handler, limit string
}

// waitsOf lists the invocations of v that wait for a limit.
func waitsOf(v verdict) []waitOf {
	var out []waitOf
	for _, s := range v.steps {
		switch s.o.Kind {
		case Throttled:
			out = append(out, waitOf{s.o.App, s.o.Handler, s.o.Reason})
		case Debounced:
			out = append(out, waitOf{s.o.App, s.o.Handler, "debounce"})
		}
	}
	return out
}

// pacer spreads the redeliveries of the invocations this worker keeps
// waiting for one limit group (a rule and a limit key) in a queue, so a
// backlog does not claim all at once each time the limit might allow
// one: each waiter is due a step after the one before it, a rate's
// interval for a rate, the throttle poll over the slots for concurrency.
// A group's queue restarts from the store's answer once its last waiter
// is due. A rate waiter that comes for its turn and finds the rate's next
// start a little later (the starts before it drifted: a rate counts from
// when each start happened) tries again at that time, keeping its place,
// rather than losing the turn to the back of the queue. Safe for
// concurrent use.
type pacer struct {
	poll time.Duration

	mu   sync.Mutex
	last map[string]time.Time
	// turns are the times the rate waiters of this worker were given, by
	// message and invocation field.
	turns map[string]time.Time
}

func newPacer(poll time.Duration) *pacer {
	return &pacer{poll: poll, last: map[string]time.Time{}, turns: map[string]time.Time{}}
}

// maxPacerGroups bounds the groups (and turns) a pacer remembers before
// it forgets those whose time is over.
const maxPacerGroups = 4096

// next is when the invocation of c of message id, throttled by cl, should
// be claimed again, on the store's clock, whose now is now: no earlier
// than the store said, nor than a step after the group's previous waiter;
// for concurrency no later than a poll from now plus its place in the
// queue either, since a slot may free before the lease the store named
// ends.
func (pc *pacer) next(c call, id string, cl invocation.Claim, now time.Time) time.Time {
	var group string
	var step time.Duration
	earliest := cl.NextAttemptAt
	rate := cl.Limit == invocation.LimitRate
	if rate {
		group, step = c.field+"\x00r\x00"+c.gate.RateKey, c.gate.Interval
	} else {
		group, step = c.field+"\x00c\x00"+c.gate.SlotKey, pc.poll/time.Duration(max(c.gate.Slots, 1))
		if poll := now.Add(pc.poll); poll.Before(earliest) {
			earliest = poll
		}
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	turn := id + "\x00" + c.field
	if t, ok := pc.turns[turn]; rate && ok && !t.After(now) && earliest.Sub(now) < step {
		// Its turn, which the drift of the starts before it pushed a
		// little later.
		pc.turns[turn] = earliest
		return earliest
	}
	at := earliest
	if last, ok := pc.last[group]; ok && last.After(now) {
		at = maxTime(at, last.Add(step))
	}
	if len(pc.last) >= maxPacerGroups {
		forget(pc.last, now)
	}
	pc.last[group] = at
	if rate {
		if len(pc.turns) >= maxPacerGroups {
			forget(pc.turns, now.Add(-time.Minute))
		}
		pc.turns[turn] = at
	}
	return at
}

// started forgets the turn of the invocation of c of message id: it
// passed its limits, or no longer waits.
func (pc *pacer) started(c call, id string) {
	if c.gate.Interval == 0 {
		return
	}
	pc.mu.Lock()
	delete(pc.turns, id+"\x00"+c.field)
	pc.mu.Unlock()
}

// forget deletes the entries of m whose time is not after t.
func forget(m map[string]time.Time, t time.Time) {
	for k, v := range m {
		if !v.After(t) {
			delete(m, k)
		}
	}
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// Waiting lists, by rule and limit, the invocations this Engine keeps
// waiting for their rules' flow-control limits while Run runs
// (docs/flow-control.md#waiting): throttled by the rule's concurrency
// across workers or its rate, or in their debounce period. Sorted by app,
// handler and limit; empty before Run and once it returned. Messages
// beyond Config.MaxWaiting are not kept, so not counted: they wait for a
// reclaim.
func (e *Engine) Waiting() []Waiting {
	if l := e.kept.Load(); l != nil && e.running.Load() {
		return l.waiting()
	}
	return nil
}

// waitingCollector exports Engine.Waiting (docs/observability.md#metrics):
// relay_waiting_invocations and relay_waiting_oldest_age_seconds, by rule
// and limit.
type waitingCollector struct{ e *Engine }

var (
	waitingDesc = prometheus.NewDesc("relay_waiting_invocations",
		"Invocations this worker keeps waiting for their rule's flow control, by limit (concurrency, rate, debounce).",
		[]string{"app", "handler", "limit"}, nil)
	waitingAgeDesc = prometheus.NewDesc("relay_waiting_oldest_age_seconds",
		"Age of the event of the oldest invocation waiting for its rule's flow control, from its stream id.",
		[]string{"app", "handler", "limit"}, nil)
)

func (c waitingCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- waitingDesc
	ch <- waitingAgeDesc
}

func (c waitingCollector) Collect(ch chan<- prometheus.Metric) {
	for _, w := range c.e.Waiting() {
		ch <- prometheus.MustNewConstMetric(waitingDesc, prometheus.GaugeValue, float64(w.Count), w.App, w.Handler, w.Limit)
		if !w.Oldest.IsZero() {
			ch <- prometheus.MustNewConstMetric(waitingAgeDesc, prometheus.GaugeValue, time.Since(w.Oldest).Seconds(), w.App, w.Handler, w.Limit)
		}
	}
}
