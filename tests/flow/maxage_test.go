package flow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// The ageing app's rule gives up on events older than 30s; the waiting
// app's on events older than 2s, which its rate of 2/s makes some of a
// burst become before their turn.
const (
	ageingTemplate = `
image: unused
concurrency: 8
events:
  - handler: probe.run
    pattern: {kind: [aged]}
    timeout: 5s
    max_age: 30s
`
	waitingTemplate = `
image: unused
concurrency: 8
events:
  - handler: probe.run
    pattern: {kind: [waits]}
    timeout: 5s
    rate: 2/s
    max_age: 2s
`
)

// max_age dead-letters, without running them, the events older than it
// when their invocation would start, measured from the time in their
// stream id (docs/flow-control.md#maximum-event-age): events published
// with ids ten minutes old are dead-lettered with the reason "older than
// max_age 30s" and no attempt counted, fresh ones beside them run; and
// waiting counts: of a burst under rate: 2/s and max_age: 2s, the events
// whose turn comes too late are dead-lettered instead of starting, and
// every one either ran young enough or was dead-lettered, never both.
func TestMaxAge(t *testing.T) {
	t.Parallel()
	c := newCluster(t, map[string]string{"ageing": ageingTemplate, "waiting": waitingTemplate}, baseTimings())
	c.startWorkers("w1", "w2", "w3")
	ctx := context.Background()

	// Old events, with ids of ten minutes ago (the group starts at 0, so
	// they are delivered), then fresh ones.
	old, fresh := map[string]bool{}, map[string]bool{}
	oldMS := c.now().Add(-10 * time.Minute).UnixMilli()
	for i := range 10 {
		ev, _ := json.Marshal(map[string]any{"kind": "aged", "n": i})
		id := fmt.Sprintf("%d-%d", oldMS, i+1)
		if err := c.rc.Do(ctx, c.rc.B().Xadd().Key(c.stream).Id(id).FieldValue().FieldValue("event", string(ev)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		old[id] = true
	}
	for i := range 10 {
		fresh[c.publish(map[string]any{"kind": "aged", "n": 100 + i})] = true
	}
	// A burst that the rate spreads over 6s, past its max_age.
	waits := map[string]bool{}
	var last string
	for i := range 12 {
		last = c.publish(map[string]any{"kind": "waits", "n": i})
		waits[last] = true
	}
	c.waitSettled(last, 2*time.Minute)

	dlqByID := map[string]dlqEntry{}
	for _, e := range c.dlq() {
		if _, dup := dlqByID[e.fields["original_id"]]; dup {
			t.Errorf("two dead-letter entries of %s", e.fields["original_id"])
		}
		dlqByID[e.fields["original_id"]] = e
	}
	aged := byID(c.runs("ageing"))
	for id := range old {
		if n := len(aged[id]); n != 0 {
			t.Errorf("old event %s ran %d times, want never", id, n)
		}
		e, ok := dlqByID[id]
		switch {
		case !ok:
			t.Errorf("old event %s has no dead-letter entry (state %q)", id, c.state(id, "ageing/"+probeHandler))
		case e.fields["reason"] != "older than max_age 30s" || e.fields["app"] != "ageing" || e.fields["handler"] != probeHandler || e.fields["handler_attempts"] != "0":
			t.Errorf("old event %s: dead-letter entry %v, want ageing/%s, reason \"older than max_age 30s\", 0 handler attempts", id, e.fields, probeHandler)
		}
	}
	for id := range fresh {
		if n := len(aged[id]); n != 1 {
			t.Errorf("fresh event %s ran %d times, want once", id, n)
		}
		if _, ok := dlqByID[id]; ok {
			t.Errorf("fresh event %s was dead-lettered", id)
		}
		if v := c.state(id, "ageing/"+probeHandler); v != "ok" {
			t.Errorf("fresh event %s: state %q, want ok", id, v)
		}
	}

	waited := byID(c.runs("waiting"))
	ran, tooOld := 0, 0
	var oldestRun, youngestDLQ time.Duration
	for id := range waits {
		published := time.UnixMilli(entryMS(t, id))
		rs, e := waited[id], dlqByID[id]
		switch {
		case len(rs) == 1 && e.id == "":
			ran++
			// The age is checked before the claim, which the run follows.
			age := rs[0].startTime().Sub(published)
			oldestRun = max(oldestRun, age)
			if age > 3*time.Second {
				t.Errorf("event %s started %v after it was published, with max_age 2s", id, age.Round(time.Millisecond))
			}
		case len(rs) == 0 && e.id != "":
			tooOld++
			age := time.UnixMilli(entryMS(t, e.id)).Sub(published)
			if youngestDLQ == 0 || age < youngestDLQ {
				youngestDLQ = age
			}
			// Dead-lettered once past max_age, give or take the
			// worker's estimate of the Redis clock.
			if age < 2*time.Second-100*time.Millisecond {
				t.Errorf("event %s dead-lettered %v after it was published, before its max_age of 2s", id, age.Round(time.Millisecond))
			}
			if e.fields["reason"] != "older than max_age 2s" || e.fields["handler_attempts"] != "0" {
				t.Errorf("event %s: dead-letter entry %v, want reason \"older than max_age 2s\", 0 handler attempts", id, e.fields)
			}
		default:
			t.Errorf("event %s: %d runs and dead-letter entry %q: want either one run or one entry", id, len(rs), e.id)
		}
	}
	// At 2/s a 2s max_age leaves room for about four of the twelve.
	if ran < 1 || tooOld < 1 {
		t.Errorf("of %d events under rate 2/s and max_age 2s, %d ran and %d were dead-lettered: want some of each", len(waits), ran, tooOld)
	}
	if len(dlqByID) != len(old)+tooOld {
		t.Errorf("%d dead-letter entries, want %d", len(dlqByID), len(old)+tooOld)
	}
	t.Logf("%d old events dead-lettered, %d fresh ones ran; under rate 2/s and max_age 2s %d of %d ran (the oldest %v after its publish) and %d were dead-lettered (the youngest %v after)",
		len(old), len(fresh), ran, len(waits), oldestRun.Round(time.Millisecond), tooOld, youngestDLQ.Round(time.Millisecond))
}
