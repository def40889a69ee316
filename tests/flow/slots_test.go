package flow_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
)

const soloTemplate = `
image: unused
concurrency: 4
events:
  - handler: probe.run
    pattern: {kind: [solo]}
    timeout: 3s
    retries: 2
    concurrency: 1
    concurrency_scope: cluster
`

// A slot across workers is given back when its lease ends, even when its
// worker was killed mid-run with SIGKILL and never settled: with
// concurrency: 1 and concurrency_scope: cluster, the next event, consumed
// by another worker, starts once the killed run's lease is over (not
// before, the slot holding until then, and not much later, the waiter
// polling every ThrottlePoll), the killed invocation is retried, its
// expired lease counted as a failed attempt, and after the drain no slot
// is held (docs/flow-control.md#concurrency).
func TestClusterSlotAfterSIGKILL(t *testing.T) {
	t.Parallel()
	tm := baseTimings()
	tm.LeaseGrace = time.Second // the lease is the rule's 3s timeout + 1s
	const field = "solo/" + probeHandler
	c := newCluster(t, map[string]string{"solo": soloTemplate}, tm)
	c.startWorkers("w1", "w2", "w3")

	// The first attempt of the first event runs until it is killed,
	// holding the only slot.
	first := c.publish(map[string]any{"kind": "solo", "block": 1})
	var held run
	testutil.WaitFor(t, time.Minute, "the first event's run to start", func() bool {
		rs := c.runs("solo")
		if len(rs) == 0 {
			return false
		}
		held = rs[0]
		return true
	})
	victim := c.nameOf(held.pid)
	if victim == "" || held.id != first || held.deadline == 0 {
		t.Fatalf("first run %+v: want %s's attempt 1 in a live worker, with its lease's end", held, first)
	}
	deathAt := c.kill(victim)
	if n := c.slotsHeld(field, ""); n != 1 {
		t.Errorf("%d slots held after the kill, want 1, the killed run's", n)
	}
	leaseEnd := time.UnixMilli(held.deadline)
	t.Logf("%s killed %v after its run started; the run's lease ends %v after its start",
		victim, deathAt.Sub(held.startTime()).Round(time.Millisecond), leaseEnd.Sub(held.startTime()).Round(time.Millisecond))

	// The dead worker reads nothing more: these go to the others.
	second := c.publish(map[string]any{"kind": "solo", "sleep_ms": 100})
	third := c.publish(map[string]any{"kind": "solo", "sleep_ms": 100})
	c.waitSettled(third, time.Minute)

	rs := c.runs("solo")
	perID := byID(rs)
	if len(perID[second]) != 1 || len(perID[third]) != 1 {
		t.Fatalf("runs %+v: want one of each later event", rs)
	}
	// The first event's retry, whose claim charged the expired lease.
	if f := perID[first]; len(f) != 2 || f[1].attempt != 2 || f[1].pid == held.pid {
		t.Fatalf("runs of the first event %+v: want the killed attempt 1 and an attempt 2 in another worker", f)
	}
	// The slot came back at the lease's end: the first run after the
	// kill, whichever event's, started then, on the store's clock, within
	// a few polls.
	after := rs[1]
	late := after.startTime().Sub(leaseEnd)
	slack := 4*tm.ThrottlePoll + time.Second
	if late < 0 || late > slack {
		t.Errorf("the first run after the kill (%s attempt %d) started %v after the killed run's lease ended, want within [0, %v]",
			after.id, after.attempt, late.Round(time.Millisecond), slack)
	}
	if r := perID[second][0]; r.pid == held.pid || r.startTime().Before(leaseEnd) {
		t.Errorf("second event's run %+v: want it in a live worker, not before the killed run's lease ended", r)
	}
	// One at a time throughout, the killed run lasting until its worker died.
	if n := maxOverlap(rs, c.endOrDeath); n != 1 {
		t.Errorf("%d runs overlapped, want 1 at a time", n)
	}
	for _, id := range []string{first, second, third} {
		if v := c.state(id, field); v != "ok" {
			t.Errorf("event %s: state %q, want ok", id, v)
		}
	}
	c.wantNoDLQ()
	if n := c.slotsHeld(field, ""); n != 0 {
		t.Errorf("%d slots held after the drain, want 0", n)
	}
	for i, r := range rs {
		t.Logf("run %d: %s attempt %d pid %d, started %v after the killed run's lease ended", i, r.id, r.attempt, r.pid,
			r.startTime().Sub(leaseEnd).Round(time.Millisecond))
	}
}
