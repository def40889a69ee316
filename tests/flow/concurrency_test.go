package flow_test

import (
	"math/rand/v2"
	"testing"
	"time"
)

const shopTemplate = `
image: unused
concurrency: 8
events:
  - handler: probe.run
    pattern: {kind: [charge]}
    timeout: 10s
    concurrency: 2
    concurrency_key: customer
`

// A rule's concurrency per key holds across worker processes: with
// concurrency: 2 and concurrency_key: customer, three workers never run
// more than two invocations of one customer at once, while the other
// customers' run beside them; every event runs exactly once and nothing
// is left pending, dead-lettered or holding a slot
// (docs/flow-control.md#concurrency).
func TestConcurrencyPerKey(t *testing.T) {
	t.Parallel()
	tm := baseTimings()
	tm.ProbeKey = "customer"
	c := newCluster(t, map[string]string{"shop": shopTemplate}, tm)
	c.startWorkers("w1", "w2", "w3")

	// A hot customer with many events and four with a few; handlers take
	// 200-500ms.
	events := map[string]int{"hot": 20, "c1": 6, "c2": 6, "c3": 6, "c4": 6}
	var order []string
	for cust, n := range events {
		for range n {
			order = append(order, cust)
		}
	}
	rand.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	ids := map[string]string{} // message id → customer
	var last string
	for i, cust := range order {
		last = c.publish(map[string]any{"kind": "charge", "customer": cust, "n": i, "sleep_ms": 200 + rand.IntN(301)})
		ids[last] = cust
	}
	c.waitSettled(last, 2*time.Minute)

	const field = "shop/" + probeHandler
	rs := c.runs("shop")
	perID := byID(rs)
	for id, cust := range ids {
		if n := len(perID[id]); n != 1 {
			t.Errorf("event %s of %s ran %d times, want once", id, cust, n)
		}
		if v := c.state(id, field); v != "ok" {
			t.Errorf("event %s of %s: state %q, want ok", id, cust, v)
		}
	}
	if len(rs) != len(ids) {
		t.Errorf("%d runs of %d events", len(rs), len(ids))
	}
	c.wantNoDLQ()
	perCustomer := map[string]int{}
	for cust := range events {
		p := peak(t, c.rc, c.stream, "shop", cust, false)
		perCustomer[cust] = p
		if p > 2 || p < 1 {
			t.Errorf("customer %s: %d runs at once at most, want at most 2 (and at least 1)", cust, p)
		}
		var of []run
		for _, r := range rs {
			if r.key == cust {
				of = append(of, r)
			}
		}
		if n := maxOverlap(of, c.endOrDeath); n > 2 {
			t.Errorf("customer %s: %d runs overlap by their start and end times, want at most 2", cust, n)
		}
		if n := c.slotsHeld(field, cust); n != 0 {
			t.Errorf("customer %s: %d slots held after the drain, want 0", cust, n)
		}
	}
	// The hot customer has work enough to use both its slots, and the
	// others are not held up behind it.
	hot := peak(t, c.rc, c.stream, "shop", "hot", false)
	if hot != 2 {
		t.Errorf("the hot customer ran %d at once at most, want 2: its bound was never reached", hot)
	}
	all := peak(t, c.rc, c.stream, "shop", "", true)
	if all <= 2 {
		t.Errorf("%d runs at once at most across customers, want more than 2: other customers wait behind one", all)
	}
	workers := map[int]int{}
	for _, r := range rs {
		workers[r.pid]++
	}
	if len(workers) < 2 {
		t.Errorf("runs by worker pid %v: want the runs spread over the workers", workers)
	}
	span := time.Duration(rs[len(rs)-1].start-rs[0].start) * time.Microsecond
	t.Logf("%d events: most runs at once per customer %v, across customers %d; runs by worker pid %v; %v from first to last start",
		len(ids), perCustomer, all, workers, span.Round(time.Millisecond))
}
