//go:build relaytest_port
package relaytest

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/stream"
)

// DLQWriterHarness is one dead-letter queue under test, for TestDLQWriter.
// Every harness must have a queue of its own (a source stream named with
// UniqueName).
type DLQWriterHarness struct {
	// Writer is the implementation under test.
	Writer relay.DLQWriter
	// Stream is the source stream whose dead letters Writer writes.
	Stream string
	// List reads back every entry of the queue, oldest first, as
	// dlq.Store.List with an empty filter does.
	List func(t *testing.T) []dlq.Entry
	// Now returns the current time on the clock Write fills a zero
	// Timestamp from.
	Now func(t *testing.T) time.Time
}

// TestDLQWriter runs the contract of relay.DLQWriter
// (docs/delivery.md#dead-letter-queue) against the harnesses newHarness
// returns, one per parallel sub-test.
//
// It covers: an entry reading back field for field under the id Write
// returned (Timestamp in UTC, millisecond precision; trace optional); an
// empty OriginalStream and a zero Timestamp filled in; malformed-message
// entries (app and handler "-", handler_attempts 0); invalid entries
// refused with a *dlq.FieldError naming the wire field, writing nothing;
// writes idempotent per invocation (original id, app, handler: a second
// write returns the first id and appends nothing, even after the entry was
// deleted) while other invocations of the same message get their own
// entries; and concurrent writes all kept, with distinct, increasing ids.
func TestDLQWriter(t *testing.T, newHarness func(t *testing.T) DLQWriterHarness) {
	for _, c := range dlqWriterCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Writer == nil || h.Stream == "" || h.List == nil || h.Now == nil {
				t.Fatal("relaytest: DLQWriterHarness needs Writer, Stream, List and Now")
			}
			c.run(t, h)
		})
	}
}

// dlqWriterCases are the cases of TestDLQWriter, in the order they run. Each
// is a function below named dlqWriter<case>; a failure names the calling test
// and the case, such as TestWriterContract/EntryReadsBack.
var dlqWriterCases = []struct {
	name string
	run  func(t *testing.T, h DLQWriterHarness)
}{
	{"EntryReadsBack", dlqWriterEntryReadsBack},
	{"DefaultsFilled", dlqWriterDefaultsFilled},
	{"MalformedMessageEntry", dlqWriterMalformedMessageEntry},
	{"InvalidEntriesRefused", dlqWriterInvalidEntriesRefused},
	{"IdempotentPerInvocation", dlqWriterIdempotentPerInvocation},
	{"ConcurrentWrites", dlqWriterConcurrentWrites},
}

func dlqWriterEntryReadsBack(t *testing.T, h DLQWriterHarness) {
	e := dlqEntry(h.Stream)
	e.Event = `{"name":"Ada Lovelace","note":"line 1\nline 2 ü"}`
	e.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	e.Timestamp = time.Date(2026, 9, 12, 10, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	id := write(t, h, e)
	got := h.List(t)
	want := e
	want.ID = id
	want.Timestamp = e.Timestamp.UTC().Truncate(time.Millisecond)
	if diff := cmp.Diff([]dlq.Entry{want}, got); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
	}
	if len(got) == 1 && got[0].Timestamp.Location() != time.UTC {
		t.Errorf("Timestamp in %v, want UTC", got[0].Timestamp.Location())
	}
}

func dlqWriterDefaultsFilled(t *testing.T, h DLQWriterHarness) {
	e := dlqEntry(h.Stream)
	e.OriginalStream, e.Timestamp, e.Trace = "", time.Time{}, ""
	e.ID = "1-1" // ignored
	before := h.Now(t)
	id := write(t, h, e)
	after := h.Now(t)
	got := h.List(t)
	if len(got) != 1 {
		t.Fatalf("%d entries, want 1", len(got))
	}
	if got[0].ID != id || got[0].OriginalStream != h.Stream || got[0].Trace != "" {
		t.Errorf("entry = %+v, want id %s and original stream %s, no trace", got[0], id, h.Stream)
	}
	checkBetween(t, "timestamp", got[0].Timestamp, before, after)
}

func dlqWriterMalformedMessageEntry(t *testing.T, h DLQWriterHarness) {
	e := dlqEntry(h.Stream)
	e.App, e.Handler, e.HandlerAttempts = dlq.MalformedName, dlq.MalformedName, 0
	e.Event, e.Reason = "{not json", "malformed event: not valid JSON"
	write(t, h, e)
	got := h.List(t)
	if len(got) != 1 || got[0].App != dlq.MalformedName || got[0].Handler != dlq.MalformedName ||
		got[0].HandlerAttempts != 0 || got[0].Event != e.Event {
		t.Errorf("entries = %+v, want the malformed-message entry", got)
	}
}

func dlqWriterInvalidEntriesRefused(t *testing.T, h DLQWriterHarness) {
	for _, c := range []struct {
		field string
		edit  func(e *dlq.Entry)
	}{
		{"original_stream", func(e *dlq.Entry) { e.OriginalStream = h.Stream + ".other" }},
		{"original_id", func(e *dlq.Entry) { e.OriginalID = "" }},
		{"original_id", func(e *dlq.Entry) { e.OriginalID = "not-an-id" }},
		{"group", func(e *dlq.Entry) { e.Group = "" }},
		{"consumer", func(e *dlq.Entry) { e.Consumer = "" }},
		{"reason", func(e *dlq.Entry) { e.Reason = "" }},
		{"app", func(e *dlq.Entry) { e.App = "" }},
		{"handler", func(e *dlq.Entry) { e.Handler = "" }},
		{"deliveries", func(e *dlq.Entry) { e.Deliveries = -1 }},
		{"handler", func(e *dlq.Entry) { e.App = dlq.MalformedName }},
		{"handler_attempts", func(e *dlq.Entry) {
			e.App, e.Handler, e.HandlerAttempts = dlq.MalformedName, dlq.MalformedName, 1
		}},
		{"handler_attempts", func(e *dlq.Entry) { e.HandlerAttempts = 0 }},
	} {
		e := dlqEntry(h.Stream)
		c.edit(&e)
		id, err := h.Writer.Write(t.Context(), e)
		var fe *dlq.FieldError
		switch {
		case err == nil:
			t.Errorf("Write(%+v) = %s, want an error naming %s", e, id, c.field)
		case !errors.Is(err, dlq.ErrInvalidEntry) || !errors.As(err, &fe):
			t.Errorf("Write with a bad %s: %v, want a *dlq.FieldError (dlq.ErrInvalidEntry)", c.field, err)
		case fe.Field != c.field:
			t.Errorf("Write: %v names field %q, want %q", err, fe.Field, c.field)
		}
	}
	if got := h.List(t); len(got) != 0 {
		t.Errorf("refused writes left %d entries: %+v", len(got), got)
	}
}

func dlqWriterIdempotentPerInvocation(t *testing.T, h DLQWriterHarness) {
	e := dlqEntry(h.Stream)
	a := write(t, h, e)
	again := e
	again.Reason, again.HandlerAttempts = "a later delivery's reason", e.HandlerAttempts+1
	if b := write(t, h, again); b != a {
		t.Errorf("second write of one invocation = %s, want the first id %s", b, a)
	}
	other := e
	other.Handler = "invoices.refund"
	b := write(t, h, other)
	if stream.CompareID(a, b) >= 0 {
		t.Errorf("ids %s, %s: another invocation of the message wants its own, later entry", a, b)
	}
	// Each consumer group reading the stream runs, and exhausts, its own
	// invocations: the same invocation in another group is another entry.
	otherGroup := e
	otherGroup.Group = "analytics"
	c := write(t, h, otherGroup)
	if stream.CompareID(b, c) >= 0 {
		t.Errorf("ids %s, %s: the invocation in another consumer group wants its own, later entry", b, c)
	}
	if got := h.List(t); len(got) != 3 || got[0].ID != a || got[0].Reason != e.Reason || got[1].ID != b || got[2].ID != c || got[2].Group != "analytics" {
		t.Errorf("entries = %+v, want %s (the first write's), %s, then %s of group analytics", got, a, b, c)
	}
}

func dlqWriterConcurrentWrites(t *testing.T, h DLQWriterHarness) {
	const n = 20
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			e := dlqEntry(h.Stream)
			e.OriginalID = "1700000000000-" + strconv.Itoa(i)
			id, err := h.Writer.Write(context.WithoutCancel(t.Context()), e)
			if err != nil {
				t.Errorf("Write %d: %v", i, err)
			}
			ids[i] = id
		})
	}
	wg.Wait()
	got := h.List(t)
	if len(got) != n {
		t.Fatalf("%d entries, want %d", len(got), n)
	}
	byID := map[string]string{}
	for i, e := range got {
		if i > 0 && stream.CompareID(got[i-1].ID, e.ID) >= 0 {
			t.Errorf("List is not in id order: %s before %s", got[i-1].ID, e.ID)
		}
		byID[e.ID] = e.OriginalID
	}
	for i, id := range ids {
		if byID[id] != "1700000000000-"+strconv.Itoa(i) {
			t.Errorf("Write %d returned %s, which holds %q", i, id, byID[id])
		}
	}
}

// dlqEntry is a valid entry for an exhausted invocation.
func dlqEntry(sourceStream string) dlq.Entry {
	return dlq.Entry{
		OriginalStream: sourceStream, OriginalID: "1700000000000-0", Group: "workers", Consumer: "host-1",
		Event: `{"type":"signup"}`, Reason: "handler exited with code 3: payment provider unreachable",
		App: "billing", Handler: "invoices.charge", Deliveries: 4, HandlerAttempts: 3,
		Timestamp: time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC),
	}
}

func write(t *testing.T, h DLQWriterHarness, e dlq.Entry) string {
	t.Helper()
	id, err := h.Writer.Write(t.Context(), e)
	if err != nil {
		t.Fatalf("Write: %v", err)
	}
	if _, _, err := stream.ParseID(id); err != nil {
		t.Fatalf("Write returned %v", err)
	}
	return id
}
