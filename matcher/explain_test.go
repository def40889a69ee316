package matcher_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

func TestExplain(t *testing.T) {
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	tests := []struct {
		name, pattern, event string
		want                 []string // "+path: reason" or "-path: reason"
	}{
		{"literal fails", "new_image: {status: [COMPLETED]}", `{"new_image":{"status":"PENDING"}}`,
			[]string{`-new_image.status: "PENDING" is not one of [COMPLETED]`}},
		{"literal matches", "status: [COMPLETED, FAILED]", `{"status":"FAILED"}`,
			[]string{`+status: "FAILED" is one of [COMPLETED, FAILED]`}},
		{"literals quoted when not plain", `k: [null, "true", "", "35", hello world, 35, true]`, `{"k":1}`,
			[]string{`-k: 1 is not one of [null, "true", "", "35", "hello world", 35, true]`}},
		{"prefix fails", "id: [{prefix: user_}]", `{"id":"123"}`,
			[]string{`-id: "123" does not start with "user_"`}},
		{"prefix on a number", "id: [{prefix: user_}]", `{"id":123}`,
			[]string{`-id: 123 does not start with "user_" (a number, not a string)`}},
		{"suffix matches", "email: [{suffix: \"@example.com\"}]", `{"email":"a@example.com"}`,
			[]string{`+email: "a@example.com" ends with "@example.com"`}},
		{"missing", "created_at: [{gt: \"now()-5m\"}]", `{}`,
			[]string{`-created_at: missing`}},
		{"exists false on null", "deleted_at: [{exists: false}]", `{"deleted_at":null}`,
			[]string{`-deleted_at: present (exists: false)`}},
		{"exists false on absence", "deleted_at: [{exists: false}]", `{}`,
			[]string{`+deleted_at: missing (exists: false)`}},
		{"exists true on absence", "id: [{exists: true}]", `{}`,
			[]string{`-id: missing (exists: true)`}},
		{"exists true on false", "id: [{exists: true}]", `{"id":false}`,
			[]string{`+id: present (exists: true)`}},
		{"numeric fails", "score: [{gt: 70}]", `{"score":42}`,
			[]string{`-score: 42 is not > 70`}},
		{"numeric matches exactly", "score: [{gte: 3.5e1}]", `{"score":35.0}`,
			[]string{`+score: 35.0 is >= 35`}},
		{"number as a string", "score: [35]", `{"score":"35"}`,
			[]string{`-score: "35" is not one of [35] (a string, not a number)`}},
		{"comparison on a string", "score: [{lt: 10}]", `{"score":"5"}`,
			[]string{`-score: "5" is not < 10 (a string, not a number)`}},
		{"temporal fails", "created_at: [{gt: \"now()-5m\"}]", `{"created_at":"2026-09-12T09:50:00Z"}`,
			[]string{`-created_at: "2026-09-12T09:50:00Z" is not > now()-5m = 2026-09-12T09:55:00Z`}},
		{"temporal matches with offset", "created_at: [{gt: \"now()-5m\"}]", `{"created_at":"2026-09-12T11:58:00+02:00"}`,
			[]string{`+created_at: "2026-09-12T11:58:00+02:00" is > now()-5m = 2026-09-12T09:55:00Z`}},
		{"temporal on garbage", "created_at: [{lte: \"now()\"}]", `{"created_at":"yesterday"}`,
			[]string{`-created_at: "yesterday" is not <= now() = 2026-09-12T10:00:00Z (not an RFC 3339 timestamp)`}},
		{"temporal on a number", "created_at: [{lte: \"now()\"}]", `{"created_at":1}`,
			[]string{`-created_at: 1 is not <= now() = 2026-09-12T10:00:00Z (a number, not an RFC 3339 timestamp)`}},
		{"several alternatives fail", "score: [35, {gt: 100}, {prefix: x}, {exists: false}]", `{"score":"35"}`,
			[]string{`-score: "35" is not one of [35] (a string, not a number); is not > 100 (a string, not a number); does not start with "x"; is present (exists: false)`}},
		{"later alternative matches", "id: [{prefix: org_}, {prefix: user_}]", `{"id":"user_1"}`,
			[]string{`+id: "user_1" starts with "user_"`}},
		{"array element matches", "tags: [a, b]", `{"tags":["c",["b"]]}`,
			[]string{`+tags: ["c",["b"]] contains "b", which is one of [a, b]`}},
		{"array without match", "tags: [a, {prefix: x}]", `{"tags":["c","d"]}`,
			[]string{`-tags: ["c","d"] has no element that is one of [a] or starts with "x"`}},
		{"empty array", "tags: [a]", `{"tags":[]}`,
			[]string{`-tags: [] is an empty array`}},
		{"siblings are all listed", "event_name: [INSERT]\ntable_name: [users]", `{"event_name":"INSERT","table_name":"orders"}`,
			[]string{`+event_name: "INSERT" is one of [INSERT]`, `-table_name: "orders" is not one of [users]`}},
		{"missing parent", "new_image: {status: [A], gone: [{exists: false}]}", `{}`,
			[]string{`-new_image.status: missing (new_image is missing)`, `+new_image.gone: missing (exists: false; new_image is missing)`}},
		{"missing grandparent", "a: {b: {c: [1]}}", `{"x":1}`,
			[]string{`-a.b.c: missing (a is missing)`}},
		{"parent not an object", "new_image: {status: [A]}", `{"new_image":"x"}`,
			[]string{`-new_image.status: missing (new_image is a string, not an object)`}},
		{"parent empty array", "new_image: {status: [A]}", `{"new_image":[]}`,
			[]string{`-new_image.status: missing (new_image is an empty array)`}},
		{"array element matches a nested map", "items: {sku: [A], qty: [{gt: 5}]}", `{"items":[{"sku":"B","qty":1},{"sku":"A","qty":9}]}`,
			[]string{`+items[1].sku: "A" is one of [A]`, `+items[1].qty: 9 is > 5`}},
		{"one element array", "items: {sku: [A]}", `{"items":[{"sku":"B"}]}`,
			[]string{`-items[0].sku: "B" is not one of [A]`}},
		{"no element matches a nested map", "items: {sku: [A], qty: [{gt: 5}]}", `{"items":[{"sku":"A","qty":1},{"sku":"B","qty":9}]}`,
			[]string{`-items: no element of [{"qty":1,"sku":"A"},{"qty":9,"sku":"B"}] matches {sku: ["A"], qty: [{gt: 5}]}`}},
		{"nested alternatives fail", "result: [{status: [OK]}, {status: [DEGRADED]}]", `{"result":{"status":"DOWN"}}`,
			[]string{`-result: {"status":"DOWN"} does not match {status: ["OK"]}; does not match {status: ["DEGRADED"]}`}},
		{"nested alternative matches", "result: [{status: [OK]}, {status: [DEGRADED]}]", `{"result":{"status":"DEGRADED"}}`,
			[]string{`+result: {"status":"DEGRADED"} matches {status: ["DEGRADED"]}`}},
		{"nested alternative allows absence", "a: [x, {b: [{exists: false}]}]", `{}`,
			[]string{`+a: missing, and {b: [{exists: false}]} allows that`}},
		{"field names that are not words are quoted", `"a.b": {"c d": [1]}`, `{"a.b":{"c d":1}}`,
			[]string{`+"a.b"."c d": 1 is one of [1]`}},
		{"long values are shortened", "k: [x]", `{"k":"` + strings.Repeat("y", 100) + `"}`,
			[]string{`-k: "` + strings.Repeat("y", 58) + `… is not one of [x]`}},
		{"html is not escaped", "k: [x]", `{"k":"<a&b>"}`,
			[]string{`-k: "<a&b>" is not one of [x]`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := mustParse(t, tt.pattern)
			ev, err := matcher.DecodeEvent([]byte(tt.event))
			if err != nil {
				t.Fatal(err)
			}
			x := matcher.Explain(p, ev, now)
			var got []string
			for _, c := range x.Conditions {
				mark := "-"
				if c.Matched {
					mark = "+"
				}
				got = append(got, mark+c.String())
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("Explain (-want +got):\n%s", diff)
			}
			if x.Matched != p.MatchValue(ev, now) {
				t.Errorf("Matched = %v, MatchValue disagrees", x.Matched)
			}
		})
	}
}

func TestExplainNil(t *testing.T) {
	x := matcher.Explain(nil, map[string]any{"a": 1}, time.Now())
	if x.Matched || len(x.Conditions) != 0 {
		t.Errorf("Explain(nil) = %+v", x)
	}
}

// checkExplanation checks that x agrees with MatchValue and that its
// conditions are complete: Matched is the AND of the conditions, and each
// has a path and a reason.
func checkExplanation(t *testing.T, p *matcher.Pattern, x matcher.Explanation, ev map[string]any, now time.Time, what string) {
	t.Helper()
	if want := p.MatchValue(ev, now); x.Matched != want {
		t.Errorf("%s: Explain says matched=%v, MatchValue says %v", what, x.Matched, want)
	}
	all := len(x.Conditions) > 0
	for _, c := range x.Conditions {
		all = all && c.Matched
		if c.Path == "" || c.Reason == "" {
			t.Errorf("%s: condition without path or reason: %+v", what, c)
		}
	}
	if all != x.Matched {
		t.Errorf("%s: matched=%v but conditions say %v:\n%s", what, x.Matched, all, formatConditions(x.Conditions))
	}
}

func formatConditions(cs []matcher.Condition) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "  %v %s\n", c.Matched, c)
	}
	return b.String()
}

// TestExplainAgreesWithCorpus explains every corpus event against every
// corpus pattern, not just its own case's.
func TestExplainAgreesWithCorpus(t *testing.T) {
	var patterns []*matcher.Pattern
	var events []map[string]any
	var texts []string
	for file, cases := range loadCorpus(t) {
		for _, c := range cases {
			if len(c.Errors) > 0 {
				continue
			}
			patterns = append(patterns, mustParse(t, c.Pattern))
			for _, ev := range append(c.Match, c.NoMatch...) {
				v, err := matcher.DecodeEvent([]byte(ev))
				if err != nil {
					t.Fatalf("%s %s: %v", file, c.Name, err)
				}
				events = append(events, v)
				texts = append(texts, ev)
			}
		}
	}
	now := mustTime(t, corpusNow)
	matched := 0
	for _, p := range patterns {
		for i, ev := range events {
			x := matcher.Explain(p, ev, now)
			checkExplanation(t, p, x, ev, now, fmt.Sprintf("pattern %s, event %s", p, texts[i]))
			if x.Matched {
				matched++
			}
		}
	}
	if matched == 0 {
		t.Error("nothing matched")
	}
	t.Logf("%d patterns × %d events, %d matches", len(patterns), len(events), matched)
}

// TestExplainAgreesWithRandom does the same on random patterns and events.
func TestExplainAgreesWithRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	matched := 0
	for i := range 3000 {
		p := mustParse(t, randomPattern(rng, 2))
		ev := randomEvent(rng, 3)
		x := matcher.Explain(p, ev, now)
		checkExplanation(t, p, x, ev, now, fmt.Sprintf("#%d pattern %s, event %v", i, p, ev))
		if x.Matched {
			matched++
		}
	}
	if matched < 100 {
		t.Errorf("only %d of 3000 random events matched; the generator needs more overlap", matched)
	}
}

func TestSetExplain(t *testing.T) {
	set := matcher.NewSet([]matcher.Rule{
		{App: "a", Handler: "h.users", Pattern: mustParse(t, "table_name: [users]")},
		{App: "a", Handler: "h.nil", Pattern: nil},
		{App: "b", Handler: "h.insert", Pattern: mustParse(t, "event_name: [INSERT]")},
	})
	ev, err := matcher.DecodeEvent([]byte(`{"event_name":"INSERT","table_name":"orders"}`))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	want := []matcher.Explanation{
		{Target: matcher.Target{App: "a", Handler: "h.users"}, Conditions: []matcher.Condition{
			{Path: "table_name", Reason: `"orders" is not one of [users]`},
		}},
		{Target: matcher.Target{App: "a", Handler: "h.nil", Rule: 1}},
		{Target: matcher.Target{App: "b", Handler: "h.insert"}, Matched: true, Conditions: []matcher.Condition{
			{Path: "event_name", Matched: true, Reason: `"INSERT" is one of [INSERT]`},
		}},
	}
	got := set.Explain(ev, now)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Set.Explain (-want +got):\n%s", diff)
	}
	var matched []matcher.Target
	for _, x := range got {
		if x.Matched {
			matched = append(matched, x.Target)
		}
	}
	if !slices.Equal(matched, set.MatchValue(ev, now)) {
		t.Errorf("Explain matched %v, MatchValue %v", matched, set.MatchValue(ev, now))
	}
}

// FuzzExplain checks that Explain never panics and always agrees with
// MatchValue, with complete conditions.
func FuzzExplain(f *testing.F) {
	addCorpusSeeds(f, func(p, ev string) { f.Add(p, ev) })
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, pattern, event string) {
		p, err := yamlpattern.Parse("fuzz.yaml", []byte(pattern))
		if err != nil {
			return
		}
		ev, err := matcher.DecodeEvent([]byte(event))
		if err != nil {
			return
		}
		checkExplanation(t, p, matcher.Explain(p, ev, now), ev, now, fmt.Sprintf("pattern %s, event %s", p, event))
	})
}
