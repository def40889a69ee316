package redisschedule

import (
	"context"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/schedule"
)

// uniqueNightly is nightly with an app name of this test's own: dedup keys
// depend on app, schedule and instant only, not on the stream, so tests on
// the shared server must not share them.
func uniqueNightly(t *testing.T) schedule.Spec {
	s := nightly(t)
	s.App = redistest.Name(t, "app")
	return s
}

func newPublisher(t *testing.T, c rueidis.Client, stream string, opts ...Option) *Publisher {
	t.Helper()
	p, err := NewPublisher(c, stream, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// Three publishers on their own connections publish the same occurrences
// at the same moment: each occurrence is one stream entry, reported as
// published by exactly one of them, and its dedup key lives 7 days.
func TestPublishRace(t *testing.T) {
	stream := redistest.Name(t, "stream")
	pubs := []*Publisher{
		newPublisher(t, redistest.Client(t), stream),
		newPublisher(t, redistest.Client(t), stream),
		newPublisher(t, redistest.Client(t), stream),
	}
	s := uniqueNightly(t)
	at, err := s.Next(mustTime(t, "2026-03-01T00:00:00Z"))
	if err != nil {
		t.Fatal(err)
	}
	const rounds = 20
	var want []string
	for range rounds {
		start := make(chan struct{})
		var wg sync.WaitGroup
		results := make([]bool, len(pubs))
		errs := make([]error, len(pubs))
		for i, p := range pubs {
			wg.Go(func() {
				<-start
				results[i], errs[i] = p.Publish(t.Context(), s, at)
			})
		}
		close(start)
		wg.Wait()
		winners := 0
		for i := range pubs {
			if errs[i] != nil {
				t.Fatalf("publisher %d: %v", i, errs[i])
			}
			if results[i] {
				winners++
			}
		}
		if winners != 1 {
			t.Fatalf("occurrence %s: %d publishers report published, want exactly 1", at.Format(time.RFC3339), winners)
		}
		want = append(want, schedule.FormatAt(at))
		if at, err = s.Next(at); err != nil {
			t.Fatal(err)
		}
	}
	c := redistest.Client(t)
	es := entries(t, c, stream)
	if got := scheduledAts(t, es); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("stream holds %v, want one entry per occurrence %v", got, want)
	}
	// The dedup key records the entry it guards.
	first := mustTime(t, want[0])
	key := keys.ScheduleOccurrence(stream, s.App, s.Name, first)
	if got, err := c.Do(t.Context(), c.B().Get().Key(key).Build()).ToString(); err != nil || got != es[0].ID {
		t.Errorf("GET %s = %q, %v; want entry id %s", key, got, err, es[0].ID)
	}
	checkDedupTTL(t, c, key)
	// The entry is exactly the envelope; without tracing, no trace fields.
	if diff := len(es[0].Fields); diff != 1 {
		t.Errorf("entry fields = %v, want only event", es[0].Fields)
	}
	if got, want := es[0].Fields["event"], string(schedule.NewEnvelope(s, first).Marshal()); got != want {
		t.Errorf("event = %s, want %s", got, want)
	}
}

// XADD runs before SET: when XADD fails, no dedup key claims an occurrence
// that is not in the stream, so a later publish can still write it.
func TestPublishFailedXADDLeavesNoDedupKey(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	if err := c.Do(t.Context(), c.B().Set().Key(stream).Value("not a stream").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	p := newPublisher(t, c, stream)
	s := uniqueNightly(t)
	at := mustTime(t, "2026-03-09T06:30:00Z")
	published, err := p.Publish(t.Context(), s, at)
	if err == nil || published {
		t.Fatalf("Publish onto a string key = %v, %v; want an error", published, err)
	}
	if !strings.Contains(err.Error(), "WRONGTYPE") || !strings.Contains(err.Error(), schedule.OccurrenceID(s.App, s.Name, at)) {
		t.Errorf("error %q should carry the Redis error and the occurrence id", err)
	}
	key := keys.ScheduleOccurrence(stream, s.App, s.Name, at)
	if n, err := c.Do(t.Context(), c.B().Exists().Key(key).Build()).AsInt64(); err != nil || n != 0 {
		t.Fatalf("EXISTS %s = %d, %v; want 0", key, n, err)
	}
	// Once the stream is usable, the occurrence publishes.
	if err := c.Do(t.Context(), c.B().Del().Key(stream).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if published, err := p.Publish(t.Context(), s, at); err != nil || !published {
		t.Fatalf("Publish after the fix = %v, %v; want published", published, err)
	}
}

// A stream with a Cluster hash tag gets a dedup key with the same tag, so
// the script's two keys share a slot.
func TestPublishHashTag(t *testing.T) {
	c := redistest.Client(t)
	stream := "{" + redistest.Name(t, "tag") + "}.events"
	p := newPublisher(t, c, stream)
	s := uniqueNightly(t)
	at := mustTime(t, "2026-03-09T06:30:00Z")
	if published, err := p.Publish(t.Context(), s, at); err != nil || !published {
		t.Fatalf("Publish = %v, %v", published, err)
	}
	key := keys.ScheduleOccurrence(stream, s.App, s.Name, at)
	tag, _ := keys.HashTag(stream)
	if !strings.Contains(key, "{"+tag+"}") {
		t.Fatalf("dedup key %q lacks the stream's hash tag", key)
	}
	checkDedupTTL(t, c, key)
	if n := len(entries(t, c, stream)); n != 1 {
		t.Fatalf("XLEN = %d, want 1", n)
	}
}

// Each publish is a schedule.publish span, and the entry carries that
// span's context as traceparent (and the inherited tracestate), so the
// consumer's spans join the same trace.
func TestPublishTrace(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	p := newPublisher(t, c, stream, WithTracerProvider(tp))

	// A caller span whose trace state the publish span inherits.
	state, err := trace.ParseTraceState("vendor=abc")
	if err != nil {
		t.Fatal(err)
	}
	parent := trace.NewSpanContext(trace.SpanContextConfig{
		TraceID:    trace.TraceID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16},
		SpanID:     trace.SpanID{1, 2, 3, 4, 5, 6, 7, 8},
		TraceFlags: trace.FlagsSampled,
		TraceState: state,
		Remote:     true,
	})
	ctx := trace.ContextWithRemoteSpanContext(t.Context(), parent)
	s := uniqueNightly(t)
	at := mustTime(t, "2026-03-09T06:30:00Z")
	for _, want := range []bool{true, false} { // a publish, then its duplicate
		if published, err := p.Publish(ctx, s, at); err != nil || published != want {
			t.Fatalf("Publish = %v, %v; want %v", published, err, want)
		}
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2", len(spans))
	}
	for i, sp := range spans {
		if sp.Name() != SpanPublish || sp.SpanKind() != trace.SpanKindProducer {
			t.Errorf("span %d: %s (%v), want %s (producer)", i, sp.Name(), sp.SpanKind(), SpanPublish)
		}
		if sp.Parent().SpanID() != parent.SpanID() {
			t.Errorf("span %d: parent %s, want %s", i, sp.Parent().SpanID(), parent.SpanID())
		}
		attrs := map[attribute.Key]attribute.Value{}
		for _, kv := range sp.Attributes() {
			attrs[kv.Key] = kv.Value
		}
		for k, want := range map[attribute.Key]string{"app": s.App, "schedule": "nightly", "scheduled_at": "2026-03-09T06:30:00Z"} {
			if got := attrs[k].AsString(); got != want {
				t.Errorf("span %d: %s = %q, want %q", i, k, got, want)
			}
		}
		if got, ok := attrs["published"]; !ok || got.AsBool() != (i == 0) {
			t.Errorf("span %d: published = %v (set %v), want %v", i, got.AsBool(), ok, i == 0)
		}
	}
	es := entries(t, c, stream)
	if len(es) != 1 {
		t.Fatalf("XLEN = %d, want 1", len(es))
	}
	sc := spans[0].SpanContext()
	if got, want := es[0].Fields["traceparent"], "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01"; got != want {
		t.Errorf("traceparent = %q, want %q (the publishing span)", got, want)
	}
	if got := es[0].Fields["tracestate"]; got != "vendor=abc" {
		t.Errorf("tracestate = %q, want vendor=abc", got)
	}
}

func TestPublishRejectsBadInput(t *testing.T) {
	p := newPublisher(t, redistest.Client(t), redistest.Name(t, "stream"))
	s := uniqueNightly(t)
	at := mustTime(t, "2026-03-09T06:30:00Z")
	for name, c := range map[string]struct {
		s  schedule.Spec
		at time.Time
	}{
		"empty handler":      {schedule.Spec{App: s.App, Name: s.Name}, at},
		"empty app":          {schedule.Spec{Name: s.Name, Handler: s.Handler}, at},
		"fractional instant": {s, at.Add(time.Millisecond)},
	} {
		if _, err := p.Publish(t.Context(), c.s, c.at); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}

func TestNewPublisherRejects(t *testing.T) {
	c := redistest.Client(t)
	if _, err := NewPublisher(nil, "s"); err == nil {
		t.Error("nil client: no error")
	}
	if _, err := NewPublisher(c, ""); err == nil {
		t.Error("empty stream: no error")
	}
	_, err := NewPublisher(c, "s", WithStateDir(t.TempDir()))
	if err == nil || !strings.Contains(err.Error(), "WithStateDir configures a Scheduler: pass it to New") {
		t.Errorf("scheduler option to NewPublisher = %v", err)
	}
	if _, err := NewPublisher(c, "s", WithTracerProvider(nil)); err == nil {
		t.Error("nil tracer provider: no error")
	}
}

// Every embedded script loads on the real server, and every one is used.
func TestScriptsLoad(t *testing.T) {
	c := redistest.Client(t)
	used := map[string]bool{"publish.lua": true}
	err := fs.WalkDir(scriptFS, "scripts", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		name := strings.TrimPrefix(path, "scripts/")
		if !used[name] {
			t.Errorf("%s is embedded but no Go code runs it", path)
		}
		src, err := scriptFS.ReadFile(path)
		if err != nil {
			return err
		}
		if err := c.Do(t.Context(), c.B().ScriptLoad().Script(string(src)).Build()).Error(); err != nil {
			t.Errorf("SCRIPT LOAD %s: %v", path, err)
		}
		delete(used, name)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range used {
		t.Errorf("%s is run but not embedded", name)
	}
}

func TestServerTime(t *testing.T) {
	p := newPublisher(t, redistest.Client(t), "s")
	got, err := p.ServerTime(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	// Same host: the server's clock is the local one.
	if d := time.Since(got); d < -5*time.Second || d > 5*time.Second {
		t.Errorf("ServerTime = %v, local now %v", got, time.Now())
	}
	if got.Location() != time.UTC {
		t.Errorf("ServerTime location = %v, want UTC", got.Location())
	}
}
