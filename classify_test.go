package relay_test

import (
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
)

// TestOversizedEvent: an event larger than MaxEventBytes gets one DLQ entry
// (app and handler "-", a reason naming both sizes, a short summary in
// place of the payload) and an acknowledgement, without being decoded or
// run; the next event runs. The original stays in the stream.
func TestOversizedEvent(t *testing.T) {
	h := newHarness(t, map[string]string{"users": usersApp})
	h.handle("users/events.created", nil)
	h.start("c1", maxEventBytes(1024))
	big := `{"event_name":"INSERT","pad":"` + strings.Repeat("x", 5000) + `"}`
	bigID := h.publish("event", big)
	next := h.publish("event", `{"event_name":"INSERT","table_name":"users"}`)
	testutil.WaitFor(t, 10*time.Second, "both settled", h.settled)
	runs := h.calls.Get("users/events.created")
	if len(runs) != 1 || runs[0].MessageID != next {
		t.Fatalf("runs = %+v; want only the small event %s", runs, next)
	}
	es := h.dlqEntries()
	if len(es) != 1 {
		t.Fatalf("DLQ entries = %+v, want 1", es)
	}
	e := es[0]
	if e.OriginalID != bigID || e.App != "-" || e.Handler != "-" || e.HandlerAttempts != 0 {
		t.Errorf("entry = %+v; want the big event's, app and handler -", e)
	}
	if !strings.Contains(e.Reason, "5032 bytes") || !strings.Contains(e.Reason, "1024") {
		t.Errorf("reason %q does not name both sizes", e.Reason)
	}
	if len(e.Event) > 600 || !strings.Contains(e.Event, "oversized event") || !strings.Contains(e.Event, `{"event_name":"INSERT"`) {
		t.Errorf("entry event %q: want a short summary starting with the event's first bytes", e.Event)
	}
	if got := h.counter("relay_events_oversized_total"); got != 1 {
		t.Errorf("relay_events_oversized_total = %v, want 1", got)
	}
	if got := h.counter("relay_events_malformed_total"); got != 0 {
		t.Errorf("relay_events_malformed_total = %v; an oversized event is counted apart", got)
	}
	rs, err := h.rc.Do(t.Context(), h.rc.B().Xrange().Key(h.stream).Start(bigID).End(bigID).Build()).AsXRange()
	if err != nil || len(rs) != 1 || rs[0].FieldValues["event"] != big {
		t.Errorf("the original entry is not in the stream any more: %v", err)
	}
	if strings.Contains(h.logs.String(), strings.Repeat("x", 300)) {
		t.Error("the payload was written to the log")
	}
}

// TestOversizedEventsKeepMemoryFlat: a stream of 50 MB events passes
// through a worker without its heap growing with their number: each is
// read, dead-lettered with a summary and dropped.
func TestOversizedEventsKeepMemoryFlat(t *testing.T) {
	if testing.Short() {
		t.Skip("publishes 300 MB")
	}
	h := newHarness(t, map[string]string{"users": usersApp})
	// Writing a 50 MB DLQ entry on a loaded machine can outlast the fast
	// reclaim idle, and a reclaim would count the event twice.
	h.start("c1", maxEventBytes(1<<20), minPendingIdle(time.Minute))
	big := `{"event_name":"INSERT","pad":"` + strings.Repeat("x", 50<<20) + `"}`
	var peaks []uint64
	for i := range 6 {
		id := h.publish("event", big)
		testutil.WaitFor(t, 60*time.Second, "the event settled", h.settled)
		// Free Redis's copy; the worker's is what this test watches.
		if err := h.rc.Do(t.Context(), h.rc.B().Xdel().Key(h.stream).Id(id).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		peaks = append(peaks, ms.HeapInuse)
		t.Logf("after event %d: heap in use %d MB", i+1, ms.HeapInuse>>20)
	}
	if got := h.counter("relay_events_oversized_total"); got != 6 {
		t.Fatalf("relay_events_oversized_total = %v, want 6", got)
	}
	// The test holds one copy of the event itself; the worker may keep a
	// grown read buffer. What must not happen is growth per event.
	if grew := int64(peaks[5]) - int64(peaks[1]); grew > 60<<20 {
		t.Errorf("heap grew %d MB from event 2 to event 6: %v", grew>>20, peaks)
	}
}
