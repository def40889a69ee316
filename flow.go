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
// is due. Safe for concurrent use.
type pacer struct {
	poll time.Duration

	mu   sync.Mutex
	last map[string]time.Time
}

func newPacer(poll time.Duration) *pacer {
	return &pacer{poll: poll, last: map[string]time.Time{}}
}

// maxPacerGroups bounds the groups a pacer remembers before it forgets
// those whose queue is over.
const maxPacerGroups = 4096

// next is when a waiter of c throttled by cl should be claimed again, on
// the store's clock, whose now is now: no earlier than the store said,
// nor than a step after the group's previous waiter; for concurrency no
// later than a poll from now plus its place in the queue either, since a
// slot may free before the lease the store named ends.
func (pc *pacer) next(c call, cl invocation.Claim, now time.Time) time.Time {
	var group string
	var step time.Duration
	earliest := cl.NextAttemptAt
	switch cl.Limit {
	case invocation.LimitRate:
		group, step = c.field+"\x00r\x00"+c.gate.RateKey, c.gate.Interval
	default:
		group, step = c.field+"\x00c\x00"+c.gate.SlotKey, pc.poll/time.Duration(max(c.gate.Slots, 1))
		if poll := now.Add(pc.poll); poll.Before(earliest) {
			earliest = poll
		}
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	at := earliest
	if last, ok := pc.last[group]; ok && last.After(now) {
		at = maxTime(at, last.Add(step))
	}
	if len(pc.last) >= maxPacerGroups {
		for g, t := range pc.last {
			if !t.After(now) {
				delete(pc.last, g)
			}
		}
	}
	pc.last[group] = at
	return at
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
