package flow_test

import (
	"cmp"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// rateWindow is how long TestRateBesideUnlimitedApp measures the rate:
// a minute, as the issue asks (make test), or RELAY_FLOW_RATE_DURATION.
func rateWindow() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("RELAY_FLOW_RATE_DURATION")); err == nil && d > 0 {
		return d
	}
	return time.Minute
}

// The limited app's rule starts 20 a second across all workers, one every
// 50ms (burst 1); the free app has no limit.
const (
	limitedTemplate = `
image: unused
concurrency: 8
events:
  - handler: probe.run
    pattern: {kind: [limited]}
    timeout: 10s
    rate: 20/s
`
	freeTemplate = `
image: unused
concurrency: 8
events:
  - handler: probe.run
    pattern: {kind: [free]}
    timeout: 10s
`
	ratePerSecond = 20
)

// A rate limit holds across worker processes and keeps up with itself: a
// backlog under rate: 20/s starts at 20 a second within 10% over a minute
// (counted from 5s after its first start, past the start-up), while an
// app without limits on the same stream, published behind that backlog
// before the workers start, runs at full speed beside it and is done long
// before it; every event runs exactly once (docs/flow-control.md#rate-limits).
//
// It fails as of this writing, at about 16/s: the engine's pacer (flow.go,
// pacer.next) queues a rule's rate waiters one interval apart on a grid
// fixed when they were queued, while the GCRA (prelude.lua gate_pass) with
// rate_burst 1 moves its next turn to one interval after the start that
// actually happened; a claim that arrives any earlier than the previous
// start's lag is refused, and the pacer then puts the waiter at the back
// of its queue (max(earliest, last+step)) rather than at the turn the
// store named, less than an interval away, so the turn goes unused. One
// worker alone reaches about 11/s; rate_burst 2, whose tolerance absorbs
// the lag, about 18.5/s.
func TestRateBesideUnlimitedApp(t *testing.T) {
	t.Parallel()
	window := rateWindow()
	const settle = 5 * time.Second // from the first start to the window
	tm := baseTimings()
	// Nothing is killed: a grace as in production keeps a claim slowed by
	// the loaded machine from being given back, which would waste its turn.
	tm.LeaseGrace = 10 * time.Second
	c := newCluster(t, map[string]string{"limited": limitedTemplate, "free": freeTemplate}, tm)

	// Enough for the rate to be busy until past the window's end.
	limitedN := int((settle+window).Seconds()*ratePerSecond) + 4*ratePerSecond
	const freeN = 400
	limited := map[string]bool{}
	for i := range limitedN {
		limited[c.publish(map[string]any{"kind": "limited", "n": i})] = true
	}
	free := map[string]bool{}
	var last string
	for i := range freeN {
		last = c.publish(map[string]any{"kind": "free", "n": i, "sleep_ms": 5})
		free[last] = true
	}
	// Everything is in the stream before the workers start: they must
	// read through the whole limited backlog to reach the free app's.
	started := c.now()
	c.startWorkers("w1", "w2", "w3")
	c.waitSettled(last, window+settle+3*time.Minute)

	lr, fr := c.runs("limited"), c.runs("free")
	for name, want := range map[string]map[string]bool{"limited": limited, "free": free} {
		rs := lr
		if name == "free" {
			rs = fr
		}
		perID := byID(rs)
		for id := range want {
			if n := len(perID[id]); n != 1 {
				t.Errorf("%s event %s ran %d times, want once", name, id, n)
			}
			if v := c.state(id, name+"/"+probeHandler); v != "ok" {
				t.Errorf("%s event %s: state %q, want ok", name, id, v)
			}
		}
		if len(rs) != len(want) {
			t.Errorf("%s: %d runs of %d events", name, len(rs), len(want))
		}
	}
	c.wantNoDLQ()
	if len(lr) == 0 || len(fr) == 0 {
		t.FailNow()
	}

	// The rate, over the window.
	first := lr[0].startTime()
	from, to := first.Add(settle), first.Add(settle+window)
	n := 0
	for _, r := range lr {
		if s := r.startTime(); !s.Before(from) && s.Before(to) {
			n++
		}
	}
	if lastStart := lr[len(lr)-1].startTime(); lastStart.Before(to) {
		t.Errorf("the limited backlog ran out %v into the window of %v: the measure needs more events", lastStart.Sub(from), window)
	}
	rate := float64(n) / window.Seconds()
	if rate < ratePerSecond*0.9 || rate > ratePerSecond*1.1 {
		t.Errorf("%d starts in %v: %.2f/s, want %d/s within 10%%", n, window, rate, ratePerSecond)
	}
	// Gaps between successive starts: the GCRA spaces the claims 50ms
	// apart; the starts follow them with the claims' latency.
	var gaps []time.Duration
	for i := 1; i < len(lr); i++ {
		gaps = append(gaps, time.Duration(lr[i].start-lr[i-1].start)*time.Microsecond)
	}
	// A turn no claim took: the next start came more than one and a half
	// intervals after the one before.
	missed := 0
	for _, g := range gaps {
		if g > 75*time.Millisecond {
			missed++
		}
	}
	slices.Sort(gaps)
	pct := func(p float64) time.Duration { return gaps[int(p*float64(len(gaps)-1))].Round(100 * time.Microsecond) }

	// The free app was published behind the whole backlog, and yet is
	// done long before it: in a small part of the time the limited app
	// needs, counted from when the workers were started (their start-up
	// included).
	limitedSpan := time.Duration(lr[len(lr)-1].start-lr[0].start) * time.Microsecond
	freeDone := time.UnixMicro(slices.MaxFunc(fr, func(a, b run) int { return cmp.Compare(a.end, b.end) }).end)
	freeSpan := freeDone.Sub(started)
	if freeSpan > limitedSpan/4 {
		t.Errorf("the free app's %d events were done %v after the workers were started, want well under the %v the limited app took (a quarter of it)",
			freeN, freeSpan.Round(time.Millisecond), limitedSpan.Round(time.Millisecond))
	}
	limitedByThen := 0
	for _, r := range lr {
		if !r.startTime().After(freeDone) {
			limitedByThen++
		}
	}
	workers := map[int]int{}
	for _, r := range lr {
		workers[r.pid]++
	}
	t.Logf("limited: %d starts in the %v window from %v after the first: %.2f/s (want %d/s ±10%%); %d events over %v; gaps between starts p1 %v, p50 %v, p99 %v, max %v; %d turns missed (gaps over 75ms); starts by worker pid %v",
		n, window, settle, rate, ratePerSecond, len(lr), limitedSpan.Round(time.Millisecond), pct(0.01), pct(0.5), pct(0.99), gaps[len(gaps)-1], missed, workers)
	t.Logf("free: %d events done %v after the workers were started (%s), while the limited app had started %d of its %d",
		freeN, freeSpan.Round(time.Millisecond), fmt.Sprintf("%.0f/s", float64(freeN)/freeSpan.Seconds()), limitedByThen, len(lr))
}
