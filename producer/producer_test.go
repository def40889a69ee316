package producer_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/producer"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// entries returns every entry of stream as XRANGE reports it.
func entries(t *testing.T, c rueidis.Client, stream string) []rueidis.XRangeEntry {
	t.Helper()
	es, err := c.Do(context.Background(), c.B().Xrange().Key(stream).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	return es
}

func newProducer(t *testing.T) (*producer.Producer, rueidis.Client, string) {
	t.Helper()
	c := redistest.Client(t)
	s := redistest.Name(t, "events")
	p, err := producer.New(producer.Redis(c, s))
	if err != nil {
		t.Fatal(err)
	}
	return p, c, s
}

func TestPublishWritesTheEventField(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := context.Background()
	type order struct {
		Type   string `json:"type"`
		Amount int    `json:"amount"`
	}
	id1, err := p.Publish(ctx, order{Type: "orders.placed", Amount: 42})
	if err != nil {
		t.Fatal(err)
	}
	id2, err := p.PublishJSON(ctx, []byte(`{"type":"orders.charge","amount":1200}`))
	if err != nil {
		t.Fatal(err)
	}
	es := entries(t, c, s)
	if len(es) != 2 || es[0].ID != id1 || es[1].ID != id2 {
		t.Fatalf("entries %v, want ids %s %s", es, id1, id2)
	}
	if got := es[0].FieldValues; len(got) != 1 || got["event"] != `{"type":"orders.placed","amount":42}` {
		t.Errorf("first entry fields %v", got)
	}
	if got := es[1].FieldValues["event"]; got != `{"type":"orders.charge","amount":1200}` {
		t.Errorf("second entry event %q", got)
	}
}

func TestInvalidEventsWriteNothing(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := context.Background()
	for _, tc := range []struct{ event, want string }{
		{``, "empty input"},
		{`{"a":`, "not valid JSON"},
		{`[1,2]`, "want a JSON object, got an array"},
		{`"text"`, "want a JSON object, got a string"},
		{`{"a":1} {"b":2}`, "data after the JSON object"},
		{"{\"a\":\"\xff\"}", "not valid UTF-8"},
		{strings.Repeat("[", 600) + strings.Repeat("]", 600), "nested deeper"},
	} {
		_, err := p.PublishJSON(ctx, []byte(tc.event))
		if !errors.Is(err, producer.ErrInvalidEvent) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PublishJSON(%.20q) = %v, want ErrInvalidEvent saying %q", tc.event, err, tc.want)
		}
	}
	big := []byte(`{"pad":"` + strings.Repeat("x", producer.DefaultMaxEventBytes) + `"}`)
	if _, err := p.PublishJSON(ctx, big); !errors.Is(err, producer.ErrInvalidEvent) || !strings.Contains(err.Error(), "MAX_EVENT_BYTES") {
		t.Errorf("PublishJSON of %d bytes = %v, want ErrInvalidEvent naming MAX_EVENT_BYTES", len(big), err)
	}
	if _, err := p.Publish(ctx, []int{1}); !errors.Is(err, producer.ErrInvalidEvent) {
		t.Errorf("Publish([]int) = %v, want ErrInvalidEvent", err)
	}
	if _, err := p.Publish(ctx, func() {}); !errors.Is(err, producer.ErrInvalidEvent) {
		t.Errorf("Publish(func) = %v, want ErrInvalidEvent", err)
	}
	// One bad event in a batch writes none of it, and says which.
	_, err := p.PublishBatch(ctx, [][]byte{[]byte(`{"a":1}`), []byte(`nope`), []byte(`{"c":3}`)})
	if !errors.Is(err, producer.ErrInvalidEvent) || !strings.HasPrefix(err.Error(), "event 1: ") {
		t.Errorf("PublishBatch with a bad second event = %v, want ErrInvalidEvent naming event 1", err)
	}
	if es := entries(t, c, s); len(es) != 0 {
		t.Errorf("%d entries written for invalid events, want none", len(es))
	}
}

func TestPublishCarriesTheTraceContext(t *testing.T) {
	p, c, s := newProducer(t)
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	ts, _ := trace.ParseTraceState("vendor=abc")
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, TraceState: ts})
	ctx := trace.ContextWithSpanContext(context.Background(), sc)
	if _, err := p.PublishJSON(ctx, []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.PublishJSON(context.Background(), []byte(`{"a":2}`)); err != nil {
		t.Fatal(err)
	}
	es := entries(t, c, s)
	if len(es) != 2 {
		t.Fatalf("%d entries, want 2", len(es))
	}
	want := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if got := es[0].FieldValues["traceparent"]; got != want {
		t.Errorf("traceparent %q, want %q", got, want)
	}
	if got := es[0].FieldValues["tracestate"]; got != "vendor=abc" {
		t.Errorf("tracestate %q, want vendor=abc", got)
	}
	if _, ok := es[1].FieldValues["traceparent"]; ok {
		t.Errorf("an event published without a span carries a traceparent: %v", es[1].FieldValues)
	}
}

func TestPublishBatchKeepsOrder(t *testing.T) {
	p, c, s := newProducer(t)
	var evs [][]byte
	for i := range 50 {
		evs = append(evs, []byte(`{"n":`+string(rune('0'+i%10))+`}`))
	}
	ids, err := p.PublishBatch(context.Background(), evs)
	if err != nil {
		t.Fatal(err)
	}
	es := entries(t, c, s)
	if len(ids) != 50 || len(es) != 50 {
		t.Fatalf("%d ids, %d entries, want 50 each", len(ids), len(es))
	}
	for i, e := range es {
		if e.ID != ids[i] || e.FieldValues["event"] != string(evs[i]) {
			t.Fatalf("entry %d = %s %v, want %s %s", i, e.ID, e.FieldValues, ids[i], evs[i])
		}
	}
}

func TestPublishNeverTrims(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := context.Background()
	for range 3 {
		if _, err := p.PublishJSON(ctx, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	// A stream whose producer trimmed has a max-deleted-entry-id or fewer
	// entries than were added; neither may happen here.
	info, err := c.Do(ctx, c.B().XinfoStream().Key(s).Build()).AsMap()
	if err != nil {
		t.Fatal(err)
	}
	length, entriesAdded := info["length"], info["entries-added"]
	n, _ := length.AsInt64()
	added, _ := entriesAdded.AsInt64()
	if n != 3 || added != 3 {
		t.Errorf("length %d, entries-added %d, want 3 and 3", n, added)
	}
}

func TestMaxEventBytes(t *testing.T) {
	_, c, s := newProducer(t)
	ctx := context.Background()
	small, err := producer.New(producer.Redis(c, s), producer.WithMaxEventBytes(16))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.PublishJSON(ctx, []byte(`{"a":"0123456789abcdef"}`)); !errors.Is(err, producer.ErrInvalidEvent) {
		t.Errorf("a 24-byte event under a 16-byte limit: %v", err)
	}
	unlimited, _ := producer.New(producer.Redis(c, s), producer.WithMaxEventBytes(0))
	big := []byte(`{"pad":"` + strings.Repeat("x", producer.DefaultMaxEventBytes) + `"}`)
	if _, err := unlimited.PublishJSON(ctx, big); err != nil {
		t.Errorf("no limit: %v", err)
	}
	if es := entries(t, c, s); len(es) != 1 {
		t.Errorf("%d entries, want only the unlimited producer's", len(es))
	}
}

func TestNewRefusesEmptyArguments(t *testing.T) {
	if _, err := producer.New(producer.Redis(nil, "s")); err == nil {
		t.Error("New(Redis(nil client)) succeeded")
	}
	if _, err := producer.New(producer.Redis(redistest.Client(t), "")); err == nil {
		t.Error("New(Redis(empty stream)) succeeded")
	}
	if _, err := producer.New(nil); err == nil {
		t.Error("New(nil) succeeded")
	}
}

// traceCtx returns a context whose remote span is traceparent tp.
func traceCtx(t *testing.T, tp string) context.Context {
	t.Helper()
	parts := strings.Split(tp, "-")
	tid, err1 := trace.TraceIDFromHex(parts[1])
	sid, err2 := trace.SpanIDFromHex(parts[2])
	if err1 != nil || err2 != nil {
		t.Fatalf("bad traceparent %s", tp)
	}
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: trace.FlagsSampled, Remote: true})
	return trace.ContextWithSpanContext(context.Background(), sc)
}

// onlyEntry returns the single entry of stream.
func onlyEntry(t *testing.T, ctx context.Context, c rueidis.Client, stream string) rueidis.XRangeEntry {
	t.Helper()
	es := entries(t, c, stream)
	if len(es) != 1 {
		t.Fatalf("stream %s holds %d entries, want 1", stream, len(es))
	}
	return es[0]
}

func keys(m map[string]string) []string { return slices.Sorted(maps.Keys(m)) }
