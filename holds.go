package relay

import (
	"slices"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/stats"
)

// holdKey is one reason messages are held pending: an app and a
// stats.Reason*, or for stats.ReasonError the pending reason's message.
type holdKey struct {
	app, reason, msg string
}

// heldSet tracks which messages each hold keeps pending, bounded by
// stats.MaxHeldTracked ids per hold (docs/delivery.md#held-messages). A
// message leaves every set when a delivery of it finds it held by other
// reasons, or acknowledges it. Safe for concurrent use.
type heldSet struct {
	// tracked counts the ids in every set: while it is 0, acknowledging a
	// message takes no lock.
	tracked atomic.Int64
	mu      sync.Mutex
	ids     map[holdKey]map[string]struct{}
	// full marks the holds that had more messages than their set keeps.
	full map[holdKey]bool
	// errs keeps the error text of each stats.ReasonError hold.
	errs map[holdKey]string
	// seq counts the sets that held a message; setAt is the seq of each
	// held message's latest, so forget leaves alone a message held again
	// since the ids it was given were read (all).
	seq   uint64
	setAt map[string]uint64
}

func newHeldSet() *heldSet {
	return &heldSet{ids: map[holdKey]map[string]struct{}{}, full: map[holdKey]bool{}, errs: map[holdKey]string{}, setAt: map[string]uint64{}}
}

// heldBy is what holdsOf found holds a message: the holds, and the error
// of each stats.ReasonError one.
type heldBy struct {
	keys    []holdKey
	errText map[holdKey]string
}

// set records that message id is held by exactly the holds of by (none:
// it was acknowledged, or is no longer held).
func (h *heldSet) set(id string, by heldBy) {
	ks := by.keys
	if len(ks) == 0 && h.tracked.Load() == 0 {
		return
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.setLocked(id, by)
}

// setLocked is set with h.mu held.
func (h *heldSet) setLocked(id string, by heldBy) {
	ks := by.keys
	defer func() {
		// Only ids some hold keeps have a seq: the set stays bounded.
		if len(ks) > 0 && h.holdsLocked(id) {
			h.seq++
			h.setAt[id] = h.seq
		} else {
			delete(h.setAt, id)
		}
	}()
	for k, m := range h.ids {
		if _, ok := m[id]; ok && !slices.Contains(ks, k) {
			delete(m, id)
			h.tracked.Add(-1)
		}
		if len(m) == 0 && k.reason == stats.ReasonError {
			delete(h.ids, k)
			delete(h.errs, k)
			delete(h.full, k)
		}
	}
	for _, k := range ks {
		m := h.ids[k]
		if m == nil {
			m = map[string]struct{}{}
			h.ids[k] = m
		}
		if t, ok := by.errText[k]; ok {
			h.errs[k] = t
		}
		if _, ok := m[id]; ok {
			continue
		}
		if len(m) >= stats.MaxHeldTracked {
			h.full[k] = true
			continue
		}
		m[id] = struct{}{}
		h.tracked.Add(1)
	}
}

// prune forgets the holds of apps that keep is false for: an app fixed
// since releases its messages at their next delivery, whichever worker
// makes it.
func (h *heldSet) prune(keep func(holdKey) bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	pruned := false
	for k, m := range h.ids {
		if !keep(k) {
			h.tracked.Add(-int64(len(m)))
			delete(h.ids, k)
			delete(h.full, k)
			delete(h.errs, k)
			pruned = true
		}
	}
	if pruned {
		for id := range h.setAt {
			if !h.holdsLocked(id) {
				delete(h.setAt, id)
			}
		}
	}
}

// holdsLocked reports whether some hold keeps id; h.mu is held.
func (h *heldSet) holdsLocked(id string) bool {
	for _, m := range h.ids {
		if _, ok := m[id]; ok {
			return true
		}
	}
	return false
}

// all returns the id of every message some hold keeps, each once, and
// the point they were read at, for forget.
func (h *heldSet) all() (ids []string, asOf uint64) {
	if h.tracked.Load() == 0 {
		return nil, 0
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	seen := map[string]struct{}{}
	for _, m := range h.ids {
		for id := range m {
			if _, ok := seen[id]; !ok {
				seen[id] = struct{}{}
				ids = append(ids, id)
			}
		}
	}
	return ids, h.seq
}

// forget stops holding each of ids that no delivery held again after asOf
// (all).
func (h *heldSet) forget(ids []string, asOf uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, id := range ids {
		if h.setAt[id] <= asOf {
			h.setLocked(id, heldBy{})
		}
	}
}

// count is how many messages k holds, and whether that is a lower bound.
func (h *heldSet) count(k holdKey) (int, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.ids[k]), h.full[k]
}

// errorHolds are the stats.ReasonError holds that hold messages now.
func (h *heldSet) errorHolds() []stats.Hold {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []stats.Hold
	for k, m := range h.ids {
		if k.reason == stats.ReasonError && len(m) > 0 {
			out = append(out, stats.Hold{App: k.app, Reason: k.reason, Error: h.errs[k], Held: len(m), AtLeast: h.full[k]})
		}
	}
	return out
}

// holdsOf are the holds that keep d's message pending after the stages
// found v and decide said p (non-nil): the unavailable apps whose
// invocations could not start, every app whose rules are unreadable when
// the message is an event, and the error that kept it pending.
func holdsOf(v verdict, p *pendingReason, g *generation) heldBy {
	var ks []holdKey
	var errText map[holdKey]string
	add := func(k holdKey) {
		if !slices.Contains(ks, k) {
			ks = append(ks, k)
		}
	}
	for _, st := range v.steps {
		if o := st.o; o.Kind == Unavailable && !o.Orphan {
			add(holdKey{app: o.App, reason: stats.ReasonAppUnavailable})
		}
	}
	if v.needsAllRules {
		for _, name := range g.incomplete {
			add(holdKey{app: name, reason: stats.ReasonRulesUnreadable})
		}
	}
	switch {
	case p == nil || p == pendingUnfinished || p.msg == pendingIncomplete.msg:
	case p.app != "" && g.apps.Get(p.app) != nil && !g.apps.Get(p.app).Available():
		add(holdKey{app: p.app, reason: stats.ReasonAppUnavailable})
	case p.err != nil:
		k := holdKey{app: p.app, reason: stats.ReasonError, msg: p.msg}
		add(k)
		errText = map[holdKey]string{k: p.msg + ": " + p.err.Error()}
	}
	return heldBy{ks, errText}
}

// Holds returns why this Engine holds messages pending now
// (docs/delivery.md#held-messages): one stats.Hold per app that is
// unavailable or whose rules are unreadable, whether or not it holds any
// message yet, with the messages it saw held, then the errors that hold
// messages. The worker publishes them (stats.WriteStatus); relay health
// and the console read them. Safe for concurrent use.
func (e *Engine) Holds() []stats.Hold {
	var out []stats.Hold
	for _, a := range e.gen.Load().apps.List() {
		if a.Available() {
			continue
		}
		k := holdKey{app: a.Name, reason: stats.ReasonAppUnavailable}
		if a.Incomplete {
			k.reason = stats.ReasonRulesUnreadable
		}
		n, atLeast := e.p.held.count(k)
		out = append(out, stats.Hold{App: a.Name, Reason: k.reason, Error: a.Errors.Error(), Held: n, AtLeast: atLeast})
	}
	return append(out, e.p.held.errorHolds()...)
}

// pruneFor forgets the holds of apps that are available in g: their
// messages are released at their next delivery.
func (h *heldSet) pruneFor(g *generation) {
	h.prune(func(k holdKey) bool {
		if k.reason == stats.ReasonError {
			return true
		}
		a := g.apps.Get(k.app)
		if a == nil || a.Available() {
			return false
		}
		return a.Incomplete == (k.reason == stats.ReasonRulesUnreadable)
	})
}

// holdsCollector exports Engine.Holds (docs/observability.md#metrics):
// relay_apps_unavailable, 1 per unavailable app and reason, and
// relay_held_messages, the messages held by reason.
type holdsCollector struct{ e *Engine }

var (
	appsUnavailableDesc = prometheus.NewDesc("relay_apps_unavailable",
		"Apps that hold messages pending, by reason (rules_unreadable: every message of the stream is held; app_unavailable).",
		[]string{"app", "reason"}, nil)
	heldMessagesDesc = prometheus.NewDesc("relay_held_messages",
		"Messages this worker saw held pending, by reason (rules_unreadable, app_unavailable, error); a message held by two apps counts for each.",
		[]string{"reason"}, nil)
)

func (c holdsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- appsUnavailableDesc
	ch <- heldMessagesDesc
}

func (c holdsCollector) Collect(ch chan<- prometheus.Metric) {
	held := map[string]int{stats.ReasonRulesUnreadable: 0, stats.ReasonAppUnavailable: 0, stats.ReasonError: 0}
	for _, h := range c.e.Holds() {
		if h.App != "" && h.Reason != stats.ReasonError {
			ch <- prometheus.MustNewConstMetric(appsUnavailableDesc, prometheus.GaugeValue, 1, h.App, h.Reason)
		}
		held[h.Reason] += h.Held
	}
	for reason, n := range held {
		ch <- prometheus.MustNewConstMetric(heldMessagesDesc, prometheus.GaugeValue, float64(n), reason)
	}
}
