package redisdlq_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
)

// addRaw writes a DLQ entry with an explicit id, so tests control the time
// in it; fields are the wire fields.
func addRaw(t *testing.T, c rueidis.Client, s *redisdlq.Store, id string, fields ...string) {
	t.Helper()
	cmd := c.B().Xadd().Key(s.Key()).Id(id).FieldValue()
	for i := 0; i+1 < len(fields); i += 2 {
		cmd = cmd.FieldValue(fields[i], fields[i+1])
	}
	if err := c.Do(t.Context(), cmd.Build()).Error(); err != nil {
		t.Fatal(err)
	}
}

func entryFields(app, handler, reason string) []string {
	return []string{"original_id", "1-1", "app", app, "handler", handler, "reason", reason, "event", "{}"}
}

func ids(p dlq.Page) []string {
	var out []string
	for _, e := range p.Entries {
		out = append(out, e.ID)
	}
	return out
}

// TestPage walks the stream page by page with every filter, and checks that
// a page never reads more than its scan budget.
func TestPage(t *testing.T) {
	t.Parallel()
	s, c, _ := newStore(t)
	ctx := t.Context()
	for i := 1; i <= 10; i++ {
		app := "shop"
		if i%2 == 0 {
			app = "billing"
		}
		addRaw(t, c, s, fmt.Sprintf("%d-0", i*1000), entryFields(app, "h"+fmt.Sprint(i%3), fmt.Sprintf("exit %d: Payment Provider down", i))...)
	}
	addRaw(t, c, s, "11000-0", "app", "shop") // undecodable: no original_id

	// Unfiltered, three per page: the cursor walks everything once.
	var all []string
	var undecodable int
	q := dlq.PageQuery{Count: 3}
	for range 10 {
		p, err := s.Page(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, ids(p)...)
		undecodable += len(p.Undecodable)
		if p.Next == "" {
			break
		}
		q.After = p.Next
	}
	want := []string{"1000-0", "2000-0", "3000-0", "4000-0", "5000-0", "6000-0", "7000-0", "8000-0", "9000-0", "10000-0"}
	if !slices.Equal(all, want) {
		t.Errorf("walk = %v, want %v", all, want)
	}
	if undecodable != 1 {
		t.Errorf("undecodable = %d, want 1", undecodable)
	}
	// The largest id is a valid cursor with nothing after it.
	if p, err := s.Page(ctx, dlq.PageQuery{After: "18446744073709551615-18446744073709551615"}); err != nil || len(p.Entries) != 0 || p.Next != "" {
		t.Errorf("page after the largest id = %+v, %v; want an empty page", p, err)
	}

	for _, tc := range []struct {
		name string
		q    dlq.PageQuery
		want []string
		next string
	}{
		{"app", dlq.PageQuery{Filter: dlq.Filter{App: "billing"}, Count: 2}, []string{"2000-0", "4000-0"}, "4000-0"},
		{"handler", dlq.PageQuery{Filter: dlq.Filter{Handler: "h0"}}, []string{"3000-0", "6000-0", "9000-0"}, ""},
		{"reason ignores case", dlq.PageQuery{Reason: "EXIT 1"}, []string{"1000-0", "10000-0"}, ""},
		{"since", dlq.PageQuery{Filter: dlq.Filter{Since: time.UnixMilli(9000)}}, []string{"9000-0", "10000-0"}, ""},
		{"before", dlq.PageQuery{Before: time.UnixMilli(3000)}, []string{"1000-0", "2000-0"}, ""},
		{"since and before", dlq.PageQuery{Filter: dlq.Filter{Since: time.UnixMilli(4000)}, Before: time.UnixMilli(6000)}, []string{"4000-0", "5000-0"}, ""},
		{"empty range", dlq.PageQuery{Filter: dlq.Filter{Since: time.UnixMilli(6000)}, Before: time.UnixMilli(4000)}, nil, ""},
		{"cursor before since", dlq.PageQuery{Filter: dlq.Filter{Since: time.UnixMilli(9000)}, After: "1000-0"}, []string{"9000-0", "10000-0"}, ""},
		// The scan budget ends the page early, with a cursor to go on.
		{"scan budget", dlq.PageQuery{Filter: dlq.Filter{App: "nobody"}, Count: 2, Scan: 4}, nil, "4000-0"},
		{"scan budget partial", dlq.PageQuery{Filter: dlq.Filter{App: "billing"}, Count: 5, Scan: 5}, []string{"2000-0", "4000-0"}, "5000-0"},
	} {
		p, err := s.Page(ctx, tc.q)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if got := ids(p); !slices.Equal(got, tc.want) || p.Next != tc.next {
			t.Errorf("%s: entries %v next %q, want %v next %q", tc.name, got, p.Next, tc.want, tc.next)
		}
		if tc.q.Scan > 0 && p.Scanned > max(tc.q.Scan, tc.q.Count) {
			t.Errorf("%s: scanned %d entries, budget %d", tc.name, p.Scanned, tc.q.Scan)
		}
	}

	if _, err := s.Page(ctx, dlq.PageQuery{After: "nope"}); err == nil {
		t.Error("a cursor that is no stream id was accepted")
	}
	p, err := s.Page(ctx, dlq.PageQuery{After: "10000-0"})
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := dlq.IsUndecodable(p.Undecodable[0]); !ok || id != "11000-0" || len(p.Entries) != 0 || p.Next != "" {
		t.Errorf("last page = %+v, want only the undecodable 11000-0", p)
	}
}

// TestPageNewestAndFilters pages newest first, filters by a handler
// prefix and event text ignoring case, and counts what a filter selects
// within a budget.
func TestPageNewestAndFilters(t *testing.T) {
	t.Parallel()
	s, c, _ := newStore(t)
	ctx := t.Context()
	var want []string
	for i := 1; i <= 12; i++ {
		id := fmt.Sprintf("%d-0", i*1000)
		f := []string{"original_id", "1-1", "app", "shop", "handler", fmt.Sprintf("Orders.Charge%d", i%2), "reason", "exit 3",
			"event", fmt.Sprintf(`{"customer":"C_%d"}`, i%3)}
		addRaw(t, c, s, id, f...)
		want = append([]string{id}, want...)
	}
	var got []string
	q := dlq.PageQuery{Newest: true, Count: 5}
	for range 5 {
		p, err := s.Page(ctx, q)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ids(p)...)
		if p.Next == "" {
			break
		}
		q.After = p.Next
	}
	if !slices.Equal(got, want) {
		t.Errorf("newest first: %v, want %v", got, want)
	}
	p, err := s.Page(ctx, dlq.PageQuery{Newest: true, HandlerPrefix: "orders.charge1", Text: "c_0"})
	if err != nil {
		t.Fatal(err)
	}
	// handler Orders.Charge1: odd i; customer C_0: i divisible by 3 → 9, 3.
	if g := ids(p); !slices.Equal(g, []string{"9000-0", "3000-0"}) {
		t.Errorf("prefix and text, newest first: %v", g)
	}
	p, err = s.Page(ctx, dlq.PageQuery{Newest: true, Before: time.UnixMilli(5000), Count: 2})
	if err != nil || !slices.Equal(ids(p), []string{"4000-0", "3000-0"}) || p.Next != "3000-0" {
		t.Errorf("newest first before 5000: %v next %q, %v", ids(p), p.Next, err)
	}
	n, complete, err := s.Count(ctx, dlq.PageQuery{HandlerPrefix: "ORDERS.CHARGE0"}, 1000)
	if err != nil || n != 6 || !complete {
		t.Errorf("count: %d complete %v, %v; want 6 complete", n, complete, err)
	}
	if n, complete, _ := s.Count(ctx, dlq.PageQuery{HandlerPrefix: "orders"}, 5); n != 5 || complete {
		t.Errorf("count within a budget of 5: %d complete %v; want 5, incomplete", n, complete)
	}
}
