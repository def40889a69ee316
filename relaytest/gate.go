package relaytest

import (
	"time"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// gates holds the cross-worker flow control state of a StateStore, as
// claim.lua keeps it in Redis (invocation.Gate, docs/flow-control.md): the
// slots held per slot group, the GCRA's theoretical arrival time per rate
// group and the latest event per debounce group. Every group is one rule's
// (stream, consumer group and invocation field) with one limit key.
type gates struct {
	slots    map[gateGroup]map[string]int64 // message id -> lease deadline, Unix ms
	tat      map[gateGroup]int64
	debounce map[gateGroup]debounced
}

type gateGroup struct {
	stream, group, field, key string
}

// debounced is the latest event of a debounce group: its message id and
// when its debounce period ends, Unix ms; the record lapses
// invocation.DebounceKeep after that.
type debounced struct {
	id  string
	due int64
}

func newGates() gates {
	return gates{slots: map[gateGroup]map[string]int64{}, tat: map[gateGroup]int64{}, debounce: map[gateGroup]debounced{}}
}

func groupOf(k invocation.Key, field, key string) gateGroup {
	return gateGroup{stream: k.Stream, group: k.Group, field: field, key: key}
}

// pass decides the gate of a claim of attempt (the attempts used + 1) of
// field of key's message at now, as claim.lua's gate does: superseded by a
// newer event of its debounce group, in its debounce period, or throttled
// by its slots or its rate (ok false, with the claim to return, nothing
// charged); or let through, its slot taken until deadline and its rate's
// turn used (ok true).
func (g *gates) pass(k invocation.Key, field string, gate invocation.Gate, attempt int, now, deadline int64) (invocation.Claim, bool) {
	if gate.Period > 0 {
		dg := groupOf(k, field, gate.DebounceKey)
		d, had := g.debounce[dg]
		if had && now > d.due+invocation.DebounceKeep.Milliseconds() {
			had = false // lapsed, as its Redis key expires
		}
		switch {
		case had && newerID(d.id, k.MessageID):
			return invocation.Claim{Status: invocation.Superseded, SupersededBy: d.id}, false
		case had && d.id == k.MessageID:
			if now < d.due {
				return invocation.Claim{Status: invocation.Debounced, NextAttemptAt: time.UnixMilli(d.due)}, false
			}
		case attempt > 1:
			// It waited its period before its first attempt; a lapsed
			// record does not make a retry wait again.
			g.debounce[dg] = debounced{id: k.MessageID, due: now}
		default:
			due := now + gate.Period.Milliseconds()
			g.debounce[dg] = debounced{id: k.MessageID, due: due}
			return invocation.Claim{Status: invocation.Debounced, NextAttemptAt: time.UnixMilli(due)}, false
		}
	}
	sg := groupOf(k, field, gate.SlotKey)
	if gate.Slots > 0 {
		held := g.slots[sg]
		var earliest int64
		for id, until := range held {
			if until <= now {
				delete(held, id) // its lease ended: the worker died mid-run
				continue
			}
			if earliest == 0 || until < earliest {
				earliest = until
			}
		}
		if len(held) >= gate.Slots {
			return invocation.Claim{Status: invocation.Throttled, Limit: invocation.LimitConcurrency, NextAttemptAt: time.UnixMilli(earliest)}, false
		}
	}
	rg := groupOf(k, field, gate.RateKey)
	if gate.Interval > 0 {
		// In microseconds, as claim.lua counts a rate.
		interval, nowUS := gate.Interval.Microseconds(), now*1000
		tat := g.tat[rg]
		if tat+interval/10 < nowUS {
			tat = nowUS // more than a tenth of an interval late: the schedule restarts
		}
		if allowed := tat - int64(gate.Burst-1)*interval; nowUS < allowed {
			return invocation.Claim{Status: invocation.Throttled, Limit: invocation.LimitRate, NextAttemptAt: time.UnixMicro(allowed)}, false
		}
		g.tat[rg] = tat + interval
	}
	if gate.Slots > 0 {
		if g.slots[sg] == nil {
			g.slots[sg] = map[string]int64{}
		}
		g.slots[sg][k.MessageID] = deadline
	}
	return invocation.Claim{}, true
}

// release gives back the slot t's attempt holds, if its gate has slots.
func (g *gates) release(k invocation.Key, t invocation.Transition) {
	if t.Gate.Slots == 0 || t.Kind == invocation.DeadLetter {
		return
	}
	sg := groupOf(k, t.Lease.Field, t.Gate.SlotKey)
	delete(g.slots[sg], k.MessageID)
	if len(g.slots[sg]) == 0 {
		delete(g.slots, sg)
	}
}

// Slots returns how many slots of gate's slot group of field are held now,
// by attempts whose lease has not ended, in stream and group. For tests
// that check what a crash leaves.
func (s *StateStore) Slots(stream, group, field, slotKey string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	n := 0
	for _, until := range s.gates.slots[gateGroup{stream: stream, group: group, field: field, key: slotKey}] {
		if until > now {
			n++
		}
	}
	return n
}

// newerID reports whether stream entry id a is newer than b; an id that
// does not parse is never newer.
func newerID(a, b string) bool {
	ams, aseq, err := stream.ParseID(a)
	if err != nil {
		return false
	}
	bms, bseq, err := stream.ParseID(b)
	if err != nil {
		return true
	}
	return ams > bms || ams == bms && aseq > bseq
}
