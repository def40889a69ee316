package redisdlq_test

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/internal/dlqfixture"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// newStore returns a Store on a fresh source stream name of the shared
// server, and the client.
func newStore(t *testing.T) (*redisdlq.Store, rueidis.Client, string) {
	t.Helper()
	c := redistest.Client(t)
	src := redistest.Name(t, "events")
	return redisdlq.NewStore(c, src), c, src
}

// entrySeq makes each entryFor a different message.
var entrySeq atomic.Int64

// entryFor returns fullEntry moved to stream src, for a message of its own.
func entryFor(src string, mutate ...func(*dlq.Entry)) dlq.Entry {
	e := dlqfixture.Full()
	e.OriginalStream = src
	e.OriginalID = fmt.Sprintf("1700000000000-%d", entrySeq.Add(1))
	for _, m := range mutate {
		m(&e)
	}
	return e
}

func write(t *testing.T, w *redisdlq.Store, e dlq.Entry) dlq.Entry {
	t.Helper()
	id, err := w.Write(t.Context(), e)
	if err != nil {
		t.Fatal(err)
	}
	e.ID = id
	return e
}

func TestWriteRoundTrip(t *testing.T) {
	t.Parallel()
	s, c, src := newStore(t)
	ctx := t.Context()
	if s.Key() != keys.DLQ(src) {
		t.Fatalf("Key = %q, want %q", s.Key(), keys.DLQ(src))
	}

	full := write(t, s, entryFor(src))
	malformed := write(t, s, entryFor(src, func(e *dlq.Entry) { *e = dlqfixture.Malformed(); e.OriginalStream = src }))

	for _, want := range []dlq.Entry{full, malformed} {
		got, err := s.Get(ctx, want.ID)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Get %s (-want +got):\n%s", want.ID, diff)
		}
	}
	got, err := s.List(ctx, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]dlq.Entry{full, malformed}, got); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}

	// On the wire: the documented field order, trace only when set.
	raw, err := c.Do(ctx, c.B().Xrange().Key(keys.DLQ(src)).Start("-").End("+").Build()).AsXRangeSlices()
	if err != nil {
		t.Fatal(err)
	}
	order := func(i int) string {
		var names []string
		for _, fv := range raw[i].FieldValues {
			names = append(names, fv.Field)
		}
		return strings.Join(names, " ")
	}
	const base = "original_stream original_id group consumer event reason app handler deliveries handler_attempts timestamp"
	if got := order(0); got != base+" trace" {
		t.Errorf("fields of a traced entry: %s", got)
	}
	if got := order(1); got != base {
		t.Errorf("fields of an untraced entry: %s", got)
	}
	if n, err := s.Len(ctx); err != nil || n != 2 {
		t.Errorf("Len = %d, %v; want 2", n, err)
	}
}

func TestWriteDefaults(t *testing.T) {
	t.Parallel()
	s, _, src := newStore(t)
	ctx := t.Context()
	before := time.Now().Truncate(time.Millisecond)
	e := entryFor(src, func(e *dlq.Entry) {
		e.OriginalStream = ""
		e.Timestamp = time.Time{}
		e.ID = "ignored"
	})
	id, err := s.Write(ctx, e)
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if got.OriginalStream != src {
		t.Errorf("OriginalStream = %q, want %q", got.OriginalStream, src)
	}
	if got.Timestamp.Before(before) || got.Timestamp.After(time.Now()) || got.Timestamp.Location() != time.UTC {
		t.Errorf("Timestamp = %v, want now in UTC", got.Timestamp)
	}
}

func TestWriteValidation(t *testing.T) {
	t.Parallel()
	s, _, src := newStore(t)
	for _, tc := range []struct {
		name  string
		edit  func(*dlq.Entry)
		field string
	}{
		{"other stream", func(e *dlq.Entry) { e.OriginalStream = "elsewhere" }, "original_stream"},
		{"no original id", func(e *dlq.Entry) { e.OriginalID = "" }, "original_id"},
		{"bad original id", func(e *dlq.Entry) { e.OriginalID = "12" }, "original_id"},
		{"no group", func(e *dlq.Entry) { e.Group = "" }, "group"},
		{"no consumer", func(e *dlq.Entry) { e.Consumer = "" }, "consumer"},
		{"no reason", func(e *dlq.Entry) { e.Reason = "" }, "reason"},
		{"no app", func(e *dlq.Entry) { e.App = "" }, "app"},
		{"no handler", func(e *dlq.Entry) { e.Handler = "" }, "handler"},
		{"negative deliveries", func(e *dlq.Entry) { e.Deliveries = -1 }, "deliveries"},
		{"negative attempts", func(e *dlq.Entry) { e.HandlerAttempts = -1 }, "handler_attempts"},
		{"half malformed", func(e *dlq.Entry) { e.App = dlq.MalformedName }, "handler"},
		{"malformed with attempts", func(e *dlq.Entry) { e.App, e.Handler = dlq.MalformedName, dlq.MalformedName }, "handler_attempts"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.Write(t.Context(), entryFor(src, tc.edit))
			var fe *dlq.FieldError
			if !errors.As(err, &fe) || fe.Field != tc.field || !errors.Is(err, dlq.ErrInvalidEntry) {
				t.Fatalf("Write = %v; want a FieldError for %q", err, tc.field)
			}
		})
	}
	if n, err := s.Len(t.Context()); err != nil || n != 0 {
		t.Errorf("Len after rejected writes = %d, %v; want 0", n, err)
	}
}

func TestListFilters(t *testing.T) {
	t.Parallel()
	s, _, src := newStore(t)
	ctx := t.Context()
	var all []dlq.Entry
	for i, target := range []string{"a/h1", "a/h2", "b/h1", "-/-", "a/h1", "b/h2"} {
		app, handler, _ := strings.Cut(target, "/")
		all = append(all, write(t, s, entryFor(src, func(e *dlq.Entry) {
			e.App, e.Handler = app, handler
			e.OriginalID = fmt.Sprintf("1-%d", i)
			if app == dlq.MalformedName {
				e.HandlerAttempts = 0
			}
		})))
	}
	pick := func(idx ...int) []dlq.Entry {
		var out []dlq.Entry
		for _, i := range idx {
			out = append(out, all[i])
		}
		return out
	}
	sinceIdx := 3
	ms, _, _ := strings.Cut(all[sinceIdx].ID, "-")
	msv, _ := strconv.ParseInt(ms, 10, 64)
	since := time.UnixMilli(msv)
	var fromSince []int
	for i, e := range all {
		m, _, _ := strings.Cut(e.ID, "-")
		if mv, _ := strconv.ParseInt(m, 10, 64); mv >= msv {
			fromSince = append(fromSince, i)
		}
	}

	for _, tc := range []struct {
		name string
		f    dlq.Filter
		want []dlq.Entry
	}{
		{"all", dlq.Filter{}, all},
		{"app", dlq.Filter{App: "a"}, pick(0, 1, 4)},
		{"handler", dlq.Filter{Handler: "h1"}, pick(0, 2, 4)},
		{"app and handler", dlq.Filter{App: "b", Handler: "h2"}, pick(5)},
		{"malformed", dlq.Filter{App: dlq.MalformedName}, pick(3)},
		{"limit", dlq.Filter{Limit: 2}, pick(0, 1)},
		{"app with limit", dlq.Filter{App: "a", Limit: 2}, pick(0, 1)},
		{"since", dlq.Filter{Since: since}, pick(fromSince...)},
		{"since in the future", dlq.Filter{Since: time.Now().Add(time.Hour)}, nil},
		{"no match", dlq.Filter{App: "zzz"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.List(ctx, tc.f)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("List(%+v) (-want +got):\n%s", tc.f, diff)
			}
		})
	}
	if _, err := s.List(ctx, dlq.Filter{Limit: -1}); err == nil {
		t.Error("List with a negative limit did not fail")
	}
}

func TestListPages(t *testing.T) {
	t.Parallel()
	s, _, src := newStore(t)
	ctx := t.Context()
	var want []string
	for i := range 250 {
		e := write(t, s, entryFor(src, func(e *dlq.Entry) {
			if i%2 == 1 {
				e.App = "odd"
			}
		}))
		if i%2 == 1 {
			want = append(want, e.ID)
		}
	}
	got, err := s.List(ctx, dlq.Filter{App: "odd"})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range got {
		ids = append(ids, e.ID)
	}
	if !slices.Equal(ids, want) {
		t.Fatalf("listed %d entries, want the %d odd ones in order", len(ids), len(want))
	}
	if got, err := s.List(ctx, dlq.Filter{Limit: 120}); err != nil || len(got) != 120 {
		t.Fatalf("List with limit 120 = %d entries, %v", len(got), err)
	}
}

func TestDeleteAndNotFound(t *testing.T) {
	t.Parallel()
	s, _, src := newStore(t)
	ctx := t.Context()
	keep := write(t, s, entryFor(src))
	gone := write(t, s, entryFor(src))

	if err := s.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, gone.ID); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Get deleted = %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, gone.ID); !errors.Is(err, dlq.ErrNotFound) {
		t.Errorf("Delete twice = %v, want ErrNotFound", err)
	}
	for _, id := range []string{"1-1", "bogus", "", keep.ID + "x"} {
		if _, err := s.Get(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Get(%q) = %v, want ErrNotFound", id, err)
		}
		if err := s.Delete(ctx, id); !errors.Is(err, dlq.ErrNotFound) {
			t.Errorf("Delete(%q) = %v, want ErrNotFound", id, err)
		}
	}
	got, err := s.List(ctx, dlq.Filter{})
	if err != nil || len(got) != 1 || got[0].ID != keep.ID {
		t.Errorf("List after delete = %v, %v; want only %s", got, err, keep.ID)
	}
}

func TestListRejectsBadStoredEntry(t *testing.T) {
	t.Parallel()
	s, c, src := newStore(t)
	ctx := t.Context()
	write(t, s, entryFor(src))
	bad, err := c.Do(ctx, c.B().Xadd().Key(keys.DLQ(src)).Id("*").FieldValue().
		FieldValue("original_id", "1-0").FieldValue("app", "a").FieldValue("handler", "h").
		FieldValue("handler_attempts", "lots").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	_, err = s.List(ctx, dlq.Filter{})
	var fe *dlq.FieldError
	if !errors.As(err, &fe) || fe.ID != bad || fe.Field != "handler_attempts" {
		t.Fatalf("List = %v; want a FieldError for handler_attempts of %s", err, bad)
	}
	if _, err := s.Get(ctx, bad); !errors.As(err, &fe) {
		t.Errorf("Get = %v; want a FieldError", err)
	}
	// It can still be removed.
	if err := s.Delete(ctx, bad); err != nil {
		t.Errorf("Delete = %v", err)
	}
}
