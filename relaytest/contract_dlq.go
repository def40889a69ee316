package relaytest

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/stream"
)

// DLQWriter appends entries to the dead-letter queue of one source
// stream outside any delivery, as redisdlq.Writer and DLQ do. The Engine's
// entries are written by the StateStore's Settle instead, with their
// invocations' markers (TestStateStore covers those).
type DLQWriter interface {
	// Write validates e and appends it, returning the new entry id; see
	// redisdlq.Writer.Write.
	Write(ctx context.Context, e dlq.Entry) (string, error)
}

// DLQReader is the reading side of a dead-letter queue, as redisdlq.Store and
// DLQ have it: relay dlq ls, inspect and rm.
type DLQReader interface {
	List(ctx context.Context, f dlq.Filter) ([]dlq.Entry, error)
	Get(ctx context.Context, id string) (dlq.Entry, error)
	Delete(ctx context.Context, id string) error
	Len(ctx context.Context) (int64, error)
}

// DLQWriterHarness is one dead-letter queue under test, for TestDLQWriter.
// Every harness must have a queue of its own (a source stream named with
// UniqueName).
type DLQWriterHarness struct {
	// Writer is the implementation under test.
	Writer DLQWriter
	// Reader reads the same queue back: redisdlq.Store, or the DLQ itself.
	Reader DLQReader
	// Stream is the source stream whose dead letters Writer writes.
	Stream string
	// Now returns the current time on the clock Write fills a zero
	// Timestamp from.
	Now func(t *testing.T) time.Time
}

// TestDLQWriter runs the contract of a dead-letter queue's writing and
// reading sides (docs/delivery.md#dead-letter-queue): DLQWriter and
// DLQReader, which redisdlq.Writer and redisdlq.Store, and DLQ, implement, against
// the harnesses newHarness returns, one per parallel sub-test.
//
// It covers: an entry reading back field for field under the id Write
// returned (Timestamp in UTC, millisecond precision; trace optional); an
// empty OriginalStream and a zero Timestamp filled in; malformed-message
// entries (app and handler "-", handler_attempts 0); invalid entries
// refused with a *dlq.FieldError naming the wire field, writing nothing;
// every write appending, those of one invocation included, in order, with
// increasing ids; concurrent writes all kept, with distinct, increasing
// ids; and the reading side: List filtered by app, handler, the time of
// the id and a limit, Get by id, Delete, Len, dlq.ErrNotFound for an
// unknown or ill-formed id.
func TestDLQWriter(t *testing.T, newHarness func(t *testing.T) DLQWriterHarness) {
	for _, c := range dlqWriterCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Writer == nil || h.Reader == nil || h.Stream == "" || h.Now == nil {
				t.Fatal("relaytest: DLQWriterHarness needs Writer, Reader, Stream and Now")
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
	{"EveryWriteAppends", dlqWriterEveryWriteAppends},
	{"ConcurrentWrites", dlqWriterConcurrentWrites},
	{"ReadingSide", dlqWriterReadingSide},
}

func dlqWriterEntryReadsBack(t *testing.T, h DLQWriterHarness) {
	e := dlqEntry(h.Stream)
	e.Event = `{"name":"Ada Lovelace","note":"line 1\nline 2 ü"}`
	e.Trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	e.Timestamp = time.Date(2026, 9, 12, 10, 0, 0, 123456789, time.FixedZone("CEST", 2*3600))
	id := write(t, h, e)
	got := list(t, h, dlq.Filter{})
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
	got := list(t, h, dlq.Filter{})
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
	got := list(t, h, dlq.Filter{})
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
		{"handler_attempts", func(e *dlq.Entry) { e.HandlerAttempts = -1 }},
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
	if got := list(t, h, dlq.Filter{}); len(got) != 0 {
		t.Errorf("refused writes left %d entries: %+v", len(got), got)
	}
}

// dlqWriterEveryWriteAppends: Write only appends (a retry after a lost
// reply may append twice; the Engine's entries are written once by
// Settle): a second write of one invocation is a second, later entry, as
// are other invocations of the message and the same invocation in another
// consumer group.
func dlqWriterEveryWriteAppends(t *testing.T, h DLQWriterHarness) {
	e := dlqEntry(h.Stream)
	again := e
	again.Reason, again.HandlerAttempts = "a later delivery's reason", e.HandlerAttempts+1
	other := e
	other.Handler = "invoices.refund"
	otherGroup := e
	otherGroup.Group = "analytics"
	want := []dlq.Entry{e, again, other, otherGroup}
	var ids []string
	for i := range want {
		ids = append(ids, write(t, h, want[i]))
		want[i].ID = ids[i]
	}
	for i := 1; i < len(ids); i++ {
		if stream.CompareID(ids[i-1], ids[i]) >= 0 {
			t.Errorf("ids %v are not strictly increasing", ids)
		}
	}
	if diff := cmp.Diff(want, list(t, h, dlq.Filter{})); diff != "" {
		t.Errorf("entries (-want +got):\n%s", diff)
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
	got := list(t, h, dlq.Filter{})
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

// dlqWriterReadingSide: List filters by app, handler (MalformedName
// selects malformed-message entries), the time of the entry id (Since) and
// a limit, oldest first; Get finds an entry by id; Delete removes it; Len
// counts; an unknown or ill-formed id wraps dlq.ErrNotFound.
func dlqWriterReadingSide(t *testing.T, h DLQWriterHarness) {
	ctx := t.Context()
	var written []dlq.Entry
	for i, ah := range [][2]string{{"billing", "charge"}, {"users", "welcome"}, {"billing", "refund"}, {dlq.MalformedName, dlq.MalformedName}, {"billing", "charge"}} {
		e := dlqEntry(h.Stream)
		e.OriginalID = "1700000000000-" + strconv.Itoa(i)
		e.App, e.Handler = ah[0], ah[1]
		if e.App == dlq.MalformedName {
			e.HandlerAttempts = 0
		}
		e.ID = write(t, h, e)
		written = append(written, e)
	}
	pick := func(is ...int) []string {
		var ids []string
		for _, i := range is {
			ids = append(ids, written[i].ID)
		}
		return ids
	}
	// Since keeps the entries whose id's time is at or after it: those
	// from the third on, and any earlier one written in the same
	// millisecond.
	since, _, _ := stream.ParseID(written[2].ID)
	var fromSince []string
	for _, e := range written {
		if ms, _, _ := stream.ParseID(e.ID); ms >= since {
			fromSince = append(fromSince, e.ID)
		}
	}
	for _, c := range []struct {
		name string
		f    dlq.Filter
		want []string
	}{
		{"all", dlq.Filter{}, pick(0, 1, 2, 3, 4)},
		{"app", dlq.Filter{App: "billing"}, pick(0, 2, 4)},
		{"app and handler", dlq.Filter{App: "billing", Handler: "charge"}, pick(0, 4)},
		{"handler", dlq.Filter{Handler: "welcome"}, pick(1)},
		{"malformed", dlq.Filter{App: dlq.MalformedName}, pick(3)},
		{"limit", dlq.Filter{App: "billing", Limit: 2}, pick(0, 2)},
		{"since", dlq.Filter{Since: time.UnixMilli(int64(since))}, fromSince},
		{"no match", dlq.Filter{App: "nobody"}, nil},
	} {
		if got := entryIDs(list(t, h, c.f)); !slices.Equal(got, c.want) {
			t.Errorf("List(%s) = %v, want %v", c.name, got, c.want)
		}
	}
	if _, err := h.Reader.List(ctx, dlq.Filter{Limit: -1}); err == nil {
		t.Error("List with a negative Limit succeeded, want an error")
	}
	got, err := h.Reader.Get(ctx, written[1].ID)
	if err != nil {
		t.Fatalf("Get(%s): %v", written[1].ID, err)
	}
	if diff := cmp.Diff(written[1], got); diff != "" {
		t.Errorf("Get(%s) (-want +got):\n%s", written[1].ID, diff)
	}
	if err := h.Reader.Delete(ctx, written[1].ID); err != nil {
		t.Fatalf("Delete(%s): %v", written[1].ID, err)
	}
	for _, id := range []string{written[1].ID, "1-1", "nope"} {
		if _, err := h.Reader.Get(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Get(%q): %v, want dlq.ErrNotFound", id, err)
		}
		if err := h.Reader.Delete(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Delete(%q): %v, want dlq.ErrNotFound", id, err)
		}
	}
	if n, err := h.Reader.Len(ctx); err != nil || n != 4 {
		t.Errorf("Len = %d, %v; want 4", n, err)
	}
	if got := entryIDs(list(t, h, dlq.Filter{})); !slices.Equal(got, pick(0, 2, 3, 4)) {
		t.Errorf("List after the delete = %v, want %v", got, pick(0, 2, 3, 4))
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

// list reads the queue's entries that pass f, oldest first.
func list(t *testing.T, h DLQWriterHarness, f dlq.Filter) []dlq.Entry {
	t.Helper()
	entries, err := h.Reader.List(t.Context(), f)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	return entries
}

func entryIDs(entries []dlq.Entry) []string {
	var ids []string
	for _, e := range entries {
		ids = append(ids, e.ID)
	}
	return ids
}
