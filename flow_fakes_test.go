package relay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
)

// The tests in this file run flow control (docs/flow-control.md) on
// relaytest's fakes in a synctest bubble, three Engines of one consumer
// group sharing one stream and one state store, as three workers share
// Redis: the limits that hold across workers are the store's. The same
// limits run against a real redis-server in tests/flow.

// publishEvent appends an order event with fields (merged into
// {"kind":"order"}) and returns its id.
func (f *onFakes) publishEvent(fields map[string]any) string {
	f.t.Helper()
	ev := map[string]any{"kind": "order"}
	for k, v := range fields {
		ev[k] = v
	}
	b, err := json.Marshal(ev)
	if err != nil {
		f.t.Fatal(err)
	}
	id, err := f.src.Publish(context.Background(), map[string]string{"event": string(b)})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// concurrencyProbe is a handler that records, per key field of the event,
// how many of its runs overlap at most, and the runs' start times.
type concurrencyProbe struct {
	key  string
	took time.Duration

	mu      sync.Mutex
	running map[string]int
	peak    map[string]int
	total   int
	maxAll  int
	starts  []time.Time
	ids     []string
}

func newConcurrencyProbe(key string, took time.Duration) *concurrencyProbe {
	return &concurrencyProbe{key: key, took: took, running: map[string]int{}, peak: map[string]int{}}
}

func (c *concurrencyProbe) run(_ context.Context, req runtime.Request) error {
	var ev map[string]any
	if err := json.Unmarshal(req.Event, &ev); err != nil {
		return err
	}
	k := fmt.Sprint(ev[c.key])
	c.mu.Lock()
	c.running[k]++
	c.peak[k] = max(c.peak[k], c.running[k])
	c.total++
	c.maxAll = max(c.maxAll, c.total)
	c.starts = append(c.starts, time.Now())
	c.ids = append(c.ids, req.MessageID)
	c.mu.Unlock()
	time.Sleep(c.took)
	c.mu.Lock()
	c.running[k]--
	c.total--
	c.mu.Unlock()
	return nil
}

// handle makes every run of the shop handler run h.
func (f *onFakes) handle(n int, h func(context.Context, runtime.Request) error) {
	for range n {
		f.runner.Script(fakeField, h)
	}
}

// A rule's concurrency per key holds across workers: with concurrency 2
// per customer, three workers never run more than two of one customer's
// invocations at once, while other customers' run beside them; every
// event runs once, and the waiting ones are visible in Engine.Waiting
// meanwhile (docs/flow-control.md#concurrency).
func TestFakesClusterConcurrencyPerKey(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Limits: app.Limits{Concurrency: 2, ConcurrencyKey: "customer", Scope: app.ScopeCluster}})
		f.apps.Get("shop").Concurrency = 8
		probe := newConcurrencyProbe("customer", 2*time.Second)
		const perCustomer = 6
		f.handle(3*perCustomer, probe.run)
		var engines []*relay.Engine
		regs := map[*relay.Engine]*prometheus.Registry{}
		for _, c := range []string{"c1", "c2", "c3"} {
			reg := prometheus.NewRegistry()
			e, _ := f.engine(c, relay.Config{Metrics: reg})
			engines = append(engines, e)
			regs[e] = reg
		}
		for i := range perCustomer {
			for _, cust := range []string{"a", "b", "c"} {
				f.publishEvent(map[string]any{"customer": cust, "n": i})
			}
		}
		time.Sleep(time.Second)
		synctest.Wait()
		waiting := 0
		for _, e := range engines {
			for _, w := range e.Waiting() {
				if w.App != "shop" || w.Handler != "orders.charge" || w.Limit != "concurrency" || w.Oldest.IsZero() {
					t.Errorf("Waiting %+v; want shop/orders.charge waiting for concurrency, with its oldest event's time", w)
				}
				waiting += w.Count
				gauge := shopMetric(t, regs[e], "relay_waiting_invocations", map[string]string{"limit": "concurrency"})
				if int(gauge) != w.Count {
					t.Errorf("relay_waiting_invocations = %v, Engine.Waiting counts %d", gauge, w.Count)
				}
				if shopMetric(t, regs[e], "relay_waiting_oldest_age_seconds", map[string]string{"limit": "concurrency"}) < 1 {
					t.Error("relay_waiting_oldest_age_seconds under the second the events have waited")
				}
			}
		}
		deferrals := 0.0
		for _, reg := range regs {
			deferrals += shopMetric(t, reg, "relay_flow_deferrals_total", map[string]string{"limit": "concurrency"})
		}
		if deferrals < float64(waiting) {
			t.Errorf("relay_flow_deferrals_total = %v in all, want at least one per waiting invocation (%d)", deferrals, waiting)
		}
		if want := 3*perCustomer - 3*2; waiting != want {
			t.Errorf("%d invocations waiting for a slot after the first runs started, want %d", waiting, want)
		}
		f.settle(time.Hour)
		if n := len(f.runner.Requests(fakeField)); n != 3*perCustomer {
			t.Fatalf("%d runs, want %d (each event once)", n, 3*perCustomer)
		}
		for cust, p := range probe.peak {
			if p > 2 {
				t.Errorf("customer %s: %d runs at once, want at most 2", cust, p)
			}
		}
		if probe.maxAll < 4 {
			t.Errorf("at most %d runs at once in all; other customers should run beside a busy one (want 6)", probe.maxAll)
		}
		for _, e := range engines {
			if w := e.Waiting(); len(w) != 0 {
				t.Errorf("still waiting after the drain: %+v", w)
			}
		}
	})
}

// A rate limit holds across workers: 10/s with no burst starts one run
// every 100ms, never two closer than 90ms (the slack a late start keeps its
// turn with), from three workers together, and keeps up with the rate
// rather than falling behind it
// (docs/flow-control.md#rate-limits).
func TestFakesRateLimitAcrossWorkers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Limits: app.Limits{Rate: app.Rate{Count: 10, Per: time.Second}, RateBurst: 1}})
		f.apps.Get("shop").Concurrency = 16
		probe := newConcurrencyProbe("kind", 10*time.Millisecond)
		const events = 40
		f.handle(events, probe.run)
		for _, c := range []string{"c1", "c2", "c3"} {
			f.run(c, relay.Config{})
		}
		for i := range events {
			f.publishEvent(map[string]any{"n": i})
		}
		f.settle(time.Hour)
		starts := slices.SortedFunc(slices.Values(probe.starts), time.Time.Compare)
		if len(starts) != events {
			t.Fatalf("%d runs, want %d", len(starts), events)
		}
		for i := 1; i < len(starts); i++ {
			// The store counts in microseconds; the fake's clock has
			// milliseconds.
			if gap := starts[i].Sub(starts[i-1]); gap < 89*time.Millisecond {
				t.Errorf("runs %d and %d started %v apart, want at least 90ms", i-1, i, gap)
			}
		}
		// 40 starts at 10/s take 3.9s; each waiter's next try is paced to
		// its turn, so a turn is seldom missed.
		if span := starts[len(starts)-1].Sub(starts[0]); span > 5*time.Second {
			t.Errorf("40 starts took %v of virtual time, want about 3.9s: the workers fall behind the rate", span)
		}
	})
}

// Debounce runs only the last of the events with one key within the
// period: the others are acknowledged as superseded, their state final
// and retained, counted by OnOutcome; an event of another key runs too
// (docs/flow-control.md#debounce).
func TestFakesDebounceRunsTheLast(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Limits: app.Limits{Debounce: app.Debounce{Key: "product", Period: 10 * time.Second}}})
		var mu sync.Mutex
		kinds := map[relay.OutcomeKind]int{}
		cfg := relay.Config{OnOutcome: func(_ context.Context, _ string, o relay.Outcome) {
			mu.Lock()
			kinds[o.Kind]++
			mu.Unlock()
		}}
		f.run("c1", cfg)
		f.run("c2", cfg)
		var seven []string
		for i := range 5 {
			seven = append(seven, f.publishEvent(map[string]any{"product": 7, "n": i}))
			time.Sleep(time.Second)
		}
		eight := f.publishEvent(map[string]any{"product": 8})
		f.settle(time.Hour)
		var ran []string
		for _, r := range f.runner.Requests(fakeField) {
			ran = append(ran, r.MessageID)
		}
		slices.Sort(ran)
		want := []string{seven[4], eight}
		slices.Sort(want)
		if !slices.Equal(ran, want) {
			t.Fatalf("ran %v, want the last of product 7 and product 8's: %v", ran, want)
		}
		for _, id := range seven[:4] {
			f.wantRetained(id, "superseded:")
			if v := f.value(id); v != "superseded:"+seven[4] {
				t.Errorf("state of %s = %q, want superseded by %s", id, v, seven[4])
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if kinds[relay.Superseded] != 4 || kinds[relay.Succeeded] != 2 {
			t.Errorf("outcomes %v, want 4 superseded and 2 succeeded", kinds)
		}
	})
}

// A rule's concurrency across workers gives a killed worker's slots back
// when their leases end: an attempt that held a slot and never settled
// (its worker died) stops holding it once its lease is over.
func TestFakesClusterSlotsOfADeadWorkerComeBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := newOnFakes(t, app.Rule{Timeout: time.Minute, Limits: app.Limits{Concurrency: 1, Scope: app.ScopeCluster}})
		gate := invocation.Gate{Slots: 1}
		// The dead worker's claim: an attempt running, holding the slot.
		dead := f.publish()
		if _, err := f.src.Consumer("dead").Read(t.Context(), 1); err != nil {
			t.Fatal(err)
		}
		res := f.state.Claim(t.Context(), []invocation.ClaimRequest{{
			Key: invocation.Key{Stream: fakeStream, Group: fakeGroup, MessageID: dead}, Field: fakeField,
			Lease: time.Minute + relay.DefaultLeaseGrace, MaxAttempts: 5, Gate: gate,
		}})
		if res[0].Err != nil || res[0].Status != invocation.Claimed {
			t.Fatalf("dead worker's claim: %+v", res[0])
		}
		started := time.Now()
		f.run("c1", relay.Config{})
		live := f.publish()
		f.settle(time.Hour)
		var ran []string
		for _, r := range f.runner.Requests(fakeField) {
			ran = append(ran, r.MessageID)
		}
		if !slices.Contains(ran, live) || !slices.Contains(ran, dead) {
			t.Fatalf("ran %v, want both %s (the live one) and %s (the dead worker's, retried)", ran, live, dead)
		}
		lease := time.Minute + relay.DefaultLeaseGrace
		if first := f.runner.starts()[0]; first.Sub(started) < lease {
			t.Errorf("a run started %v after the dead worker's claim, before its lease (%v) gave the slot back", first.Sub(started), lease)
		}
		if n := f.state.Slots(fakeStream, fakeGroup, fakeField, ""); n > 1 {
			t.Errorf("%d slots held, want at most 1", n)
		}
	})
}
