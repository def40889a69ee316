package relay_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
)

func TestScheduleOccurrenceRunsItsHandlerWithTheOccurrencePayload(t *testing.T) {
	// An event rule that matches the occurrence envelope: occurrences
	// bypass pattern matching, so it must not run.
	h := newHarness(t, map[string]string{"billing": apptest.NightlyApp + `events:
  - {handler: jobs.spy, pattern: {source: [{exists: true}]}}
`})
	h.handle("billing/jobs.nightly", nil)
	h.handle("billing/jobs.spy", nil)
	h.start("c1")
	id := h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
	// The outcome is reported right after the acknowledgement its
	// settlement made: wait for both.
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool {
		return h.calls.Count("billing/jobs.nightly") == 1 && h.settled() && h.counter("relay_invocations_total") == 1
	})

	req := h.calls.Get("billing/jobs.nightly")[0]
	var in map[string]any
	if err := json.Unmarshal(req.Event, &in); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"source": "relay.schedule", "schedule": "nightly", "scheduled_at": "2026-01-15T02:00:00Z"}
	if len(in) != len(want) || in["source"] != want["source"] || in["schedule"] != want["schedule"] || in["scheduled_at"] != want["scheduled_at"] {
		t.Errorf("handler stdin = %s, want %v", req.Event, want)
	}
	if req.MessageID != id || req.Timeout != 5*time.Second {
		t.Errorf("request = %+v", req)
	}
	// Occurrences are not events: no event counter moves.
	for _, name := range []string{"relay_events_received_total", "relay_events_matched_total", "relay_events_unmatched_total", "relay_events_malformed_total"} {
		if v := h.counter(name); v != 0 {
			t.Errorf("%s = %v, want 0", name, v)
		}
	}
	if v := h.counter("relay_invocations_total"); v != 1 {
		t.Errorf("relay_invocations_total = %v, want 1", v)
	}
	if h.ttl(id) <= 0 {
		t.Errorf("state of the acked occurrence is not retained")
	}
	if n := h.calls.Count("billing/jobs.spy"); n != 0 {
		t.Errorf("an event rule matching the envelope ran %d times for an occurrence", n)
	}
}

func TestScheduleOccurrenceFollowsItsPinAfterATemplateChange(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": apptest.NightlyApp})
	fail := true
	h.handle("billing/jobs.nightly", func(context.Context, runtime.Request) error {
		if fail {
			return &runtime.ExitError{Code: 1}
		}
		return nil
	})
	h.handle("billing/jobs.renamed", nil)
	stop := h.start("c1", backoff(300*time.Millisecond))
	id := h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
	testutil.WaitFor(t, 5*time.Second, "first attempt", func() bool { return h.calls.Count("billing/jobs.nightly") == 1 })
	stop()

	// The template now names another handler, a longer timeout and no
	// retries; the pinned occurrence keeps the first delivery's.
	h.apps = apptest.Load(t, map[string]string{"billing": strings.NewReplacer("jobs.nightly", "jobs.renamed", "timeout: 5s", "timeout: 9s", "retries: 1", "retries: 0").Replace(apptest.NightlyApp)})
	fail = false
	h.reg = prometheus.NewRegistry()
	h.start("c1")
	testutil.WaitFor(t, 10*time.Second, "ack", h.settled)
	if n := h.calls.Count("billing/jobs.renamed"); n != 0 {
		t.Errorf("the new handler ran %d times", n)
	}
	runs := h.calls.Get("billing/jobs.nightly")
	if len(runs) != 2 || runs[1].Attempt != 2 || runs[1].Timeout != 5*time.Second {
		t.Errorf("runs of the pinned handler = %+v, want attempts 1 and 2 with the pinned 5s timeout", runs)
	}
	if got := h.hash(id)["__schedule"]; !strings.Contains(got, `"handler":"jobs.nightly"`) {
		t.Errorf("__schedule = %q", got)
	}
	if len(h.dlqEntries()) != 0 {
		t.Errorf("DLQ entries: %+v", h.dlqEntries())
	}
}

// TestScheduleOccurrenceWithASubMillisecondTimeout: the pin keeps a
// timeout in whole milliseconds, rounded up, so a schedule's timeout under
// 1ms (valid: > 0) runs with 1ms instead of a pin of 0, which every
// delivery found malformed and left the occurrence pending for good.
func TestScheduleOccurrenceWithASubMillisecondTimeout(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": strings.Replace(apptest.NightlyApp, "timeout: 5s", "timeout: 500us", 1)})
	h.handle("billing/jobs.nightly", nil)
	h.start("c1")
	h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
	testutil.WaitFor(t, 5*time.Second, "ack", func() bool { return h.calls.Count("billing/jobs.nightly") == 1 && h.settled() })
	if got := h.calls.Get("billing/jobs.nightly")[0].Timeout; got != time.Millisecond {
		t.Errorf("timeout %s, want the 500µs rounded up to 1ms", got)
	}
}

func TestObsoleteScheduleOccurrenceIsAckedWithoutDLQ(t *testing.T) {
	for name, templates := range map[string]map[string]string{
		"schedule removed": {"billing": strings.Replace(apptest.NightlyApp, "name: nightly", "name: weekly", 1)},
		"app removed":      {"other": apptest.NightlyApp},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, templates)
			h.handle("billing/jobs.nightly", nil)
			h.handle("other/jobs.nightly", nil)
			h.start("c1")
			h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
			testutil.WaitFor(t, 5*time.Second, "ack", h.settled)
			if n := h.calls.Count("billing/jobs.nightly") + h.calls.Count("other/jobs.nightly"); n != 0 {
				t.Errorf("%d handler runs", n)
			}
			if es := h.dlqEntries(); len(es) != 0 {
				t.Errorf("DLQ entries: %+v", es)
			}
		})
	}
}

// TestObsoleteOccurrenceOfARemovedAppIsRetained: an occurrence whose first
// attempt failed, redelivered after its app was removed, is acknowledged
// as obsolete, and its state switched to retention like every other
// acknowledged message's (docs/delivery.md#invocation-state), not leaked
// without a TTL.
func TestObsoleteOccurrenceOfARemovedAppIsRetained(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": apptest.NightlyApp})
	h.handle("billing/jobs.nightly", func(context.Context, runtime.Request) error { return &runtime.ExitError{Code: 1} })
	stop := h.start("c1", backoff(time.Hour))
	id := h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
	testutil.WaitFor(t, 5*time.Second, "the first attempt", func() bool { return h.calls.Count("billing/jobs.nightly") == 1 })
	stop()
	if ttl := h.ttl(id); ttl >= 0 {
		t.Fatalf("state TTL while pending = %v, want none", ttl)
	}

	h.apps = apptest.Load(t, map[string]string{"other": usersApp})
	h.reg = prometheus.NewRegistry()
	h.start("c1")
	testutil.WaitFor(t, 10*time.Second, "the occurrence acknowledged", h.settled)
	if ttl := h.ttl(id); ttl <= 0 {
		t.Errorf("state TTL after the ack = %v, want the retention TTL: %v", ttl, h.hash(id))
	}
	if es := h.dlqEntries(); len(es) != 0 {
		t.Errorf("DLQ entries: %+v, want none for an obsolete occurrence", es)
	}
}

func TestForgedScheduleOccurrenceIsDeadLettered(t *testing.T) {
	valid := schedule.NewEnvelope(apptest.NightlySpec(), apptest.NightlyAt)
	wrongID := valid
	wrongID.OccurrenceID = "schedule:billing:nightly:2026-01-16T02:00:00Z"
	notFiring := schedule.NewEnvelope(apptest.NightlySpec(), apptest.NightlyAt.Add(time.Hour)) // 04:00 Berlin
	for name, c := range map[string]struct {
		event, reason string
	}{
		"wrong occurrence_id": {string(wrongID.Marshal()), "occurrence_id"},
		"not a firing":        {string(notFiring.Marshal()), "not a firing"},
		"missing field":       {`{"source":"relay.schedule","app":"billing","schedule":"nightly"}`, "handler"},
		"in the future":       {string(schedule.NewEnvelope(apptest.NightlySpec(), time.Date(2031, 1, 1, 2, 0, 0, 0, time.UTC)).Marshal()), "in the future"},
	} {
		t.Run(name, func(t *testing.T) {
			h := newHarness(t, map[string]string{"billing": apptest.NightlyApp})
			h.handle("billing/jobs.nightly", nil)
			h.start("c1")
			id := h.publish("event", c.event)
			testutil.WaitFor(t, 5*time.Second, "ack", h.settled)
			if n := h.calls.Count("billing/jobs.nightly"); n != 0 {
				t.Errorf("handler ran %d times", n)
			}
			es := h.dlqEntries()
			if len(es) != 1 || es[0].OriginalID != id || !strings.Contains(es[0].Reason, c.reason) || es[0].Event != c.event {
				t.Fatalf("DLQ = %+v, want one entry for %s naming %q", es, id, c.reason)
			}
			if r := es[0].Reason; !strings.HasPrefix(r, "invalid schedule occurrence: ") || strings.Contains(r, "invalid occurrence envelope") {
				t.Errorf("reason %q: want it to say invalid schedule occurrence once", r)
			}
			if v := h.counter("relay_events_malformed_total"); v != 0 {
				t.Errorf("relay_events_malformed_total = %v, want 0 (not an event)", v)
			}
		})
	}
}

func TestScheduleOccurrenceOfUnavailableAppStaysPending(t *testing.T) {
	broken := apptest.NightlyApp + "concurrency: lots\n"
	h := newHarness(t, map[string]string{"billing": broken})
	if a := h.apps.Get("billing"); a == nil || a.Available() {
		t.Fatal("the broken template loaded as available")
	}
	h.handle("billing/jobs.nightly", nil)
	stop := h.start("c1")
	h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
	testutil.WaitFor(t, 5*time.Second, "delivery", func() bool { return strings.Contains(h.logs.String(), "schedule occurrence left pending") })
	stop()
	if n := h.pending(); n != 1 {
		t.Errorf("pending = %d, want 1", n)
	}

	h.apps = apptest.Load(t, map[string]string{"billing": apptest.NightlyApp})
	h.reg = prometheus.NewRegistry()
	h.start("c1")
	testutil.WaitFor(t, 5*time.Second, "ack after the fix", func() bool { return h.calls.Count("billing/jobs.nightly") == 1 && h.settled() })
}

func TestExhaustedScheduleOccurrenceIsDeadLetteredOnce(t *testing.T) {
	h := newHarness(t, map[string]string{"billing": apptest.NightlyApp})
	h.handle("billing/jobs.nightly", func(context.Context, runtime.Request) error { return &runtime.ExitError{Code: 3} })
	h.start("c1", backoff(50*time.Millisecond))
	id := h.publishOccurrence(apptest.NightlySpec(), apptest.NightlyAt)
	testutil.WaitFor(t, 10*time.Second, "ack", h.settled)
	if n := h.calls.Count("billing/jobs.nightly"); n != 2 {
		t.Errorf("%d attempts, want 2 (retries: 1)", n)
	}
	es := h.dlqEntries()
	if len(es) != 1 || es[0].OriginalID != id || es[0].App != "billing" || es[0].Handler != "jobs.nightly" || es[0].HandlerAttempts != 2 {
		t.Fatalf("DLQ = %+v", es)
	}
	var env schedule.Envelope
	if err := json.Unmarshal([]byte(es[0].Event), &env); err != nil || env.Schedule != "nightly" {
		t.Errorf("DLQ event %q is not the envelope: %v", es[0].Event, err)
	}
}

func TestScheduleSpecs(t *testing.T) {
	apps := apptest.Load(t, map[string]string{"billing": apptest.NightlyApp, "users": usersApp})
	specs := apps.ScheduleSpecs()
	if len(specs) != 1 || specs[0].App != "billing" || specs[0].Name != "nightly" || specs[0].Cron.Location().String() != "Europe/Berlin" {
		t.Fatalf("specs = %+v", specs)
	}
	if ok, err := specs[0].Fires(apptest.NightlyAt); err != nil || !ok {
		t.Errorf("Fires(%s) = %v %v", apptest.NightlyAt, ok, err)
	}
}
