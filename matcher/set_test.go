package matcher_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

func mustParse(t testing.TB, src string) *matcher.Pattern {
	t.Helper()
	p, err := yamlpattern.Parse("test.yaml", []byte(src))
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
	now := time.Now().Format(time.RFC3339)
	// Matches reuse decoding memory across calls: events of different
	// shapes, and malformed ones, must not see each other's values.
	events := []struct {
		text      []byte
		want      int
		malformed bool
	}{
		{fmt.Appendf(nil, `{"n":25,"t":%q}`, now), 26, false},
		{fmt.Appendf(nil, `{"t":%q,"n":[3,{"n":49}],"x":{"n":49}}`, now), 4, false},
		{fmt.Appendf(nil, `{"n":49,"t":%q,"n":`, now), 0, true},
		{fmt.Appendf(nil, `{"t":[%q],"m":49}`, now), 0, false},
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 400 {
				ev := events[(g+i)%len(events)]
				got, err := set.Match(ev.text)
				if errors.Is(err, matcher.ErrMalformed) != ev.malformed || len(got) != ev.want {
					t.Errorf("Match(%s) = %d targets, %v; want %d", ev.text, len(got), err, ev.want)
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
			p, err := yamlpattern.Parse(file, []byte(c.Pattern))
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

// scanMatch is the plain evaluation a Set must agree with: every rule's
// MatchValue, in order.
func scanMatch(rules []matcher.Rule, ev map[string]any, now time.Time) []matcher.Target {
	var want []matcher.Target
	perApp := map[string]int{}
	for _, r := range rules {
		if r.Pattern != nil && r.Pattern.MatchValue(ev, now) {
			want = append(want, matcher.Target{App: r.App, Handler: r.Handler, Rule: perApp[r.App]})
		}
		perApp[r.App]++
	}
	return want
}

// TestSetAgreesWithScanRandom is a differential test: random rule sets over
// a small vocabulary (so that rules share fields and values and events hit
// them), random events, and the Set's result, order included, must equal a
// scan of every rule.
func TestSetAgreesWithScanRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	sets, events, matched := 200, 50, 0
	if testing.Short() {
		sets = 40
	}
	for s := range sets {
		n := 1 + rng.IntN(60)
		rules := make([]matcher.Rule, n)
		for i := range rules {
			rules[i] = matcher.Rule{App: fmt.Sprintf("app%d", i*4/n), Handler: fmt.Sprintf("h.f%d", i)}
			if rng.IntN(30) > 0 {
				rules[i].Pattern = mustParse(t, randomPattern(rng, 2))
			}
		}
		set := matcher.NewSet(rules)
		for range events {
			ev := randomEvent(rng, 3)
			want := scanMatch(rules, ev, now)
			got := set.MatchValue(ev, now)
			// The same event as JSON text, through the decoder of Match.
			text, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			fromText, err := set.MatchAt(text, now)
			if err != nil || !slices.Equal(fromText, got) {
				t.Fatalf("set %d, MatchAt(%s) = %v, %v; MatchValue: %v", s, text, fromText, err, got)
			}
			if diff := cmp.Diff(want, got); diff != "" {
				var b strings.Builder
				for _, r := range rules {
					fmt.Fprintf(&b, "  %s/%s: %v\n", r.App, r.Handler, r.Pattern)
				}
				t.Fatalf("set %d, event %v (-scan +set):\n%s\nrules:\n%s", s, ev, diff, &b)
			}
			matched += len(got)
		}
	}
	if matched == 0 {
		t.Fatal("no event matched any rule")
	}
	t.Logf("%d matches", matched)
}

// Vocabulary of the random patterns and events: few names and values, so
// that they collide often, and values of every JSON type.
var (
	randNames   = []string{"a", "b", "id", "status", "n", "t"}
	randStrings = []string{"x", "y", "user_1", "user_22", "org_3", "", "35", "2026-09-12T09:58:00Z", "2026-09-12T11:58:00+02:00", "1999-01-01T00:00:00Z"}
	randNumbers = []string{"0", "1", "35", "35.0", "3.5e1", "-1", "1e2", "-0", "9007199254740993"}
	randAlts    = []string{
		`{prefix: "user_"}`, `{prefix: "user_2"}`, `{prefix: ""}`, `{prefix: "o"}`, `{suffix: "_1"}`, `{suffix: "Z"}`,
		"{exists: true}", "{exists: false}", "{gt: 1}", "{gte: 35}", "{lt: 0}", "{lte: 3.5e1}",
		`{gt: "now()-5m"}`, `{lt: "now()"}`, `{gte: "now()-1h30m"}`,
		"null", "true", "false",
	}
)

// randomPattern returns the YAML flow text of a random pattern with nested
// maps down to depth.
func randomPattern(rng *rand.Rand, depth int) string {
	var b strings.Builder
	writeRandomFields(rng, &b, depth)
	return b.String()
}

func writeRandomFields(rng *rand.Rand, b *strings.Builder, depth int) {
	names := slices.Clone(randNames)
	rng.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	b.WriteByte('{')
	for i, name := range names[:1+rng.IntN(3)] {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(name + ": [")
		for j := range 1 + rng.IntN(3) {
			if j > 0 {
				b.WriteString(", ")
			}
			switch k := rng.IntN(10); {
			case k < 4:
				fmt.Fprintf(b, "%q", randStrings[rng.IntN(len(randStrings))])
			case k < 6:
				b.WriteString(randNumbers[rng.IntN(len(randNumbers))])
			case k < 9 || depth == 0:
				b.WriteString(randAlts[rng.IntN(len(randAlts))])
			default:
				writeRandomFields(rng, b, depth-1)
			}
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
}

// randomEvent returns a random decoded event with objects and arrays down
// to depth.
func randomEvent(rng *rand.Rand, depth int) map[string]any {
	ev, err := matcher.DecodeEvent(randomObject(rng, depth))
	if err != nil {
		panic(err)
	}
	return ev
}

func randomObject(rng *rand.Rand, depth int) []byte {
	b := []byte{'{'}
	for _, name := range randNames {
		if rng.IntN(3) == 0 {
			continue
		}
		if len(b) > 1 {
			b = append(b, ',')
		}
		b = fmt.Appendf(b, "%q:", name)
		b = appendRandomValue(rng, b, depth)
	}
	return append(b, '}')
}

func appendRandomValue(rng *rand.Rand, b []byte, depth int) []byte {
	switch k := rng.IntN(12); {
	case k < 5:
		return fmt.Appendf(b, "%q", randStrings[rng.IntN(len(randStrings))])
	case k < 7:
		return append(b, randNumbers[rng.IntN(len(randNumbers))]...)
	case k == 7:
		return append(b, []string{"null", "true", "false"}[rng.IntN(3)]...)
	case k < 10 && depth > 0:
		return append(b, randomObject(rng, depth-1)...)
	case depth > 0:
		b = append(b, '[')
		for j := range rng.IntN(4) {
			if j > 0 {
				b = append(b, ',')
			}
			b = appendRandomValue(rng, b, depth-1)
		}
		return append(b, ']')
	}
	return append(b, `"x"`...)
}

func TestSetAppendMatches(t *testing.T) {
	set := matcher.NewSet([]matcher.Rule{
		{App: "a", Handler: "h.users", Pattern: mustParse(t, "table_name: [users]")},
		{App: "a", Handler: "h.ids", Pattern: mustParse(t, `new_image: {id: [{prefix: "user_"}]}`)},
		{App: "b", Handler: "h.any", Pattern: mustParse(t, "event_name: [{exists: true}]")},
	})
	ev, err := matcher.DecodeEvent([]byte(`{"event_name":"INSERT","table_name":"users","new_image":{"id":"user_1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	prev := matcher.Target{App: "x", Handler: "y.z"}
	dst := make([]matcher.Target, 1, 8)
	dst[0] = prev
	got := set.AppendMatches(dst, ev, now)
	want := append([]matcher.Target{prev}, set.MatchValue(ev, now)...)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("AppendMatches (-want +got):\n%s", diff)
	}
	if len(want) != 4 || &got[0] != &dst[0] {
		t.Errorf("AppendMatches = %v; want 3 targets appended in place", got)
	}
	if got := set.AppendMatches(nil, map[string]any{"other": 1}, now); got != nil {
		t.Errorf("AppendMatches(nil, unmatched) = %v, want nil", got)
	}
}
