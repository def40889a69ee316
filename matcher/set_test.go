package matcher_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
)

func mustParse(t testing.TB, src string) *matcher.Pattern {
	t.Helper()
	p, err := matcher.Parse("test.yaml", []byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestSet(t *testing.T) {
	users := mustParse(t, "table_name: [users]")
	insert := mustParse(t, "event_name: [INSERT]")
	anyEvent := mustParse(t, "event_name: [{exists: true}]")
	never := mustParse(t, "never: [{exists: true}]")
	// Sorted by app, then declaration order, as the caller passes them.
	set := matcher.NewSet([]matcher.Rule{
		{App: "audit", Handler: "log.all", Pattern: anyEvent},
		{App: "audit", Handler: "log.never", Pattern: never},
		{App: "audit", Handler: "log.users", Pattern: users},
		{App: "billing", Handler: "nil.pattern", Pattern: nil},
		{App: "billing", Handler: "users.insert", Pattern: insert},
		{App: "crm", Handler: "users.sync", Pattern: users},
	})
	if set.Len() != 6 {
		t.Errorf("Len() = %d", set.Len())
	}
	tests := []struct {
		name  string
		event string
		want  []matcher.Target
	}{
		{"every matching rule, no dedup", `{"event_name":"INSERT","table_name":"users"}`, []matcher.Target{
			{App: "audit", Handler: "log.all", Rule: 0},
			{App: "audit", Handler: "log.users", Rule: 2},
			{App: "billing", Handler: "users.insert", Rule: 1},
			{App: "crm", Handler: "users.sync", Rule: 0},
		}},
		{"some rules", `{"event_name":"DELETE","table_name":"orders"}`, []matcher.Target{
			{App: "audit", Handler: "log.all", Rule: 0},
		}},
		{"unmatched is nil", `{"other":1}`, nil},
	}
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := set.MatchAt([]byte(tt.event), now)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("MatchAt (-want +got):\n%s", diff)
			}
			got, err = set.Match([]byte(tt.event))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Match (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSetMalformed(t *testing.T) {
	set := matcher.NewSet([]matcher.Rule{{App: "a", Handler: "h.f", Pattern: mustParse(t, "k: [{exists: false}]")}})
	for _, ev := range []string{``, `null`, `[]`, `"x"`, `{"a":`, `{} {}`} {
		got, err := set.Match([]byte(ev))
		if !errors.Is(err, matcher.ErrMalformed) || got != nil {
			t.Errorf("Match(%q) = %v, %v; want ErrMalformed", ev, got, err)
		}
	}
}

func TestSetUsesMatchTime(t *testing.T) {
	set := matcher.NewSet([]matcher.Rule{{App: "a", Handler: "h.recent", Pattern: mustParse(t, `t: [{gt: "now()-5m"}]`)}})
	ev := []byte(`{"t":"2026-09-12T10:00:00Z"}`)
	for _, tt := range []struct {
		now  time.Time
		want int
	}{
		{time.Date(2026, 9, 12, 10, 4, 59, 0, time.UTC), 1},
		{time.Date(2026, 9, 12, 10, 5, 0, 0, time.UTC), 0},
		{time.Date(2026, 9, 12, 12, 4, 0, 0, time.FixedZone("CEST", 2*3600)), 1},
	} {
		got, err := set.MatchAt(ev, tt.now)
		if err != nil || len(got) != tt.want {
			t.Errorf("MatchAt(now=%v) = %v, %v; want %d targets", tt.now, got, err, tt.want)
		}
	}
	// Match uses the wall clock: an event from a minute ago is recent.
	recent := fmt.Appendf(nil, `{"t":%q}`, time.Now().Add(-time.Minute).Format(time.RFC3339Nano))
	if got, err := set.Match(recent); err != nil || len(got) != 1 {
		t.Errorf("Match(recent) = %v, %v", got, err)
	}
}

func TestSetCopiesRules(t *testing.T) {
	rules := []matcher.Rule{{App: "a", Handler: "h.f", Pattern: mustParse(t, "k: [1]")}}
	set := matcher.NewSet(rules)
	rules[0] = matcher.Rule{App: "b", Handler: "x.y", Pattern: mustParse(t, "k: [2]")}
	got, err := set.Match([]byte(`{"k":1}`))
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]matcher.Target{{App: "a", Handler: "h.f"}}, got); diff != "" {
		t.Errorf("Match (-want +got):\n%s", diff)
	}
}

// TestSetConcurrent runs matches from many goroutines; run with -race.
func TestSetConcurrent(t *testing.T) {
	var rules []matcher.Rule
	for i := range 50 {
		rules = append(rules, matcher.Rule{
			App:     fmt.Sprintf("app%02d", i/5),
			Handler: fmt.Sprintf("h.f%d", i),
			Pattern: mustParse(t, fmt.Sprintf("n: [{gte: %d}]\nt: [{gt: \"now()-1h\"}]", i)),
		})
	}
	set := matcher.NewSet(rules)
	ev := fmt.Appendf(nil, `{"n":25,"t":%q}`, time.Now().Format(time.RFC3339))
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 200 {
				got, err := set.Match(ev)
				if err != nil || len(got) != 26 {
					t.Errorf("Match = %d targets, %v; want 26", len(got), err)
					return
				}
			}
		})
	}
	wg.Wait()
}

// TestSetIndexAgreesWithScan builds one Set from every corpus pattern and
// checks, for every corpus event, that it returns exactly the rules a plain
// scan with Pattern.MatchValue finds.
func TestSetIndexAgreesWithScan(t *testing.T) {
	var rules []matcher.Rule
	var events []string
	for file, cases := range loadCorpus(t) {
		for _, c := range cases {
			events = append(events, c.Match...)
			events = append(events, c.NoMatch...)
			p, err := matcher.Parse(file, []byte(c.Pattern))
			if err != nil {
				continue
			}
			rules = append(rules, matcher.Rule{App: file, Handler: c.Name, Pattern: p})
		}
	}
	// Sorted by app name as the caller would pass them.
	slices.SortStableFunc(rules, func(a, b matcher.Rule) int { return strings.Compare(a.App, b.App) })
	set := matcher.NewSet(rules)
	now := mustTime(t, corpusNow)
	matched := 0
	for _, ev := range events {
		v, err := matcher.DecodeEvent([]byte(ev))
		if err != nil {
			t.Fatal(err)
		}
		var want []matcher.Target
		perApp := map[string]int{}
		for _, r := range rules {
			if r.Pattern.MatchValue(v, now) {
				want = append(want, matcher.Target{App: r.App, Handler: r.Handler, Rule: perApp[r.App]})
			}
			perApp[r.App]++
		}
		got := set.MatchValue(v, now)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("event %s (-scan +set):\n%s", ev, diff)
		}
		matched += len(got)
	}
	if matched == 0 {
		t.Error("no event matched any rule")
	}
}
