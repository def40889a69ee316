package relay

import (
	"fmt"
	"testing"

	"github.com/relaydev/relay/stats"
)

// TestHeldSetIsBounded: a hold remembers at most stats.MaxHeldTracked
// message ids and then says its count is a lower bound; a message leaves
// the holds it is no longer held by, and an error hold goes with its
// last message.
func TestHeldSetIsBounded(t *testing.T) {
	h := newHeldSet()
	orders := holdKey{app: "orders", reason: stats.ReasonRulesUnreadable}
	for i := range stats.MaxHeldTracked + 5 {
		h.set(fmt.Sprint(i), heldBy{keys: []holdKey{orders}})
	}
	if n, atLeast := h.count(orders); n != stats.MaxHeldTracked || !atLeast {
		t.Errorf("count = %d, at least %v; want %d, true", n, atLeast, stats.MaxHeldTracked)
	}
	pin := holdKey{app: "jobs", reason: stats.ReasonError, msg: "pinning failed"}
	h.set("0", heldBy{keys: []holdKey{pin}, errText: map[holdKey]string{pin: "pinning failed: timeout"}})
	if n, _ := h.count(orders); n != stats.MaxHeldTracked-1 {
		t.Errorf("orders count = %d after message 0 is held by another reason only, want %d", n, stats.MaxHeldTracked-1)
	}
	if got := h.errorHolds(); len(got) != 1 || got[0].Error != "pinning failed: timeout" || got[0].Held != 1 || got[0].App != "jobs" {
		t.Errorf("errorHolds = %+v", got)
	}
	h.set("0", heldBy{})
	if got := h.errorHolds(); len(got) != 0 {
		t.Errorf("errorHolds after the message was acknowledged = %+v, want none", got)
	}
	h.prune(func(k holdKey) bool { return k != orders })
	if n, atLeast := h.count(orders); n != 0 || atLeast {
		t.Errorf("count after prune = %d, %v; want 0, false", n, atLeast)
	}
}
