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

// TestHeldSetForgetSparesMessagesHeldAgain: forget drops the ids it is
// given unless a delivery held one of them again after they were read;
// only held ids keep a sequence number.
func TestHeldSetForgetSparesMessagesHeldAgain(t *testing.T) {
	h := newHeldSet()
	orders := holdKey{app: "orders", reason: stats.ReasonAppUnavailable}
	by := heldBy{keys: []holdKey{orders}}
	h.set("1-1", by)
	h.set("1-2", by)
	ids, asOf := h.all()
	if len(ids) != 2 {
		t.Fatalf("all = %v, want both", ids)
	}
	h.set("1-2", by) // delivered and held again meanwhile
	h.forget(ids, asOf)
	if n, _ := h.count(orders); n != 1 {
		t.Errorf("count after forget = %d, want 1: 1-2 was held again", n)
	}
	if ids, _ := h.all(); len(ids) != 1 || ids[0] != "1-2" {
		t.Errorf("held after forget = %v, want [1-2]", ids)
	}
	h.set("1-2", heldBy{})
	if len(h.setAt) != 0 {
		t.Errorf("sequence numbers of messages no longer held: %v", h.setAt)
	}
}
