package matcher_test

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/goccy/go-yaml"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

// benchNow is the match time of every benchmark; benchEvent's timestamps
// are a minute and a half before it.
var benchNow = time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)

// benchEvent is a DynamoDB-stream-like change record of about 1 KB. The
// rules of both rule generators are built so that it is a candidate for the
// same few rules whatever their number (table_0, cust_1_...): the benchmarks
// measure how the cost of a match grows with rules the event cannot match.
var benchEvent = []byte(`{"event_id":"c4ca4238a0b923820dcc509a6f75849b","event_name":"MODIFY","event_source":"aws:dynamodb",
"event_version":"1.1","aws_region":"eu-central-1","table_name":"table_0","approximate_creation_time":"2026-09-12T09:58:30Z",
"keys":{"pk":"CUSTOMER#cust_1_12345","sk":"PROFILE"},"size_bytes":734,"sequence_number":"111100000000003612345678",
"new_image":{"id":"cust_1_12345","status":"ACTIVE","tier":"gold","amount":512.25,"currency":"EUR","email":"ada@example.com",
"tags":["beta","newsletter","vip"],"updated_at":"2026-09-12T09:58:30Z","version":42,"score":97.5,
"address":{"street":"Bahnhofstrasse 1","city":"Zürich","zip":"8001","country":"CH"},
"orders":[{"sku":"TSHIRT-M","qty":2,"price":19.9},{"sku":"MUG-XL","qty":1,"price":12.5}]},
"old_image":{"id":"cust_1_12345","status":"PENDING_REVIEW","tier":"silver","amount":12,"currency":"EUR","email":"ada@example.com",
"tags":["beta"],"updated_at":"2026-09-11T17:02:11.123+02:00","version":41,"score":55,
"address":{"street":"Bahnhofstrasse 1","city":"Zürich","zip":"8001","country":"CH"},"orders":[]}}`)

var benchSizes = []int{1, 10, 100, 1000, 10000}

// mixedRules returns n rules mixing equality, prefix, numeric, nested,
// exists and temporal conditions, five per table, one app per ten rules.
func mixedRules(tb testing.TB, n int) []matcher.Rule {
	tb.Helper()
	rules := make([]matcher.Rule, 0, n)
	for i := range n {
		k := i / 5
		var src string
		switch i % 5 {
		case 0:
			src = fmt.Sprintf("event_name: [INSERT, MODIFY]\ntable_name: [table_%d]\n", k)
		case 1:
			src = fmt.Sprintf("table_name: [table_%d]\nnew_image: {id: [{prefix: \"cust_%d_\"}]}\n", k, k+1)
		case 2:
			src = fmt.Sprintf("table_name: [table_%d]\nnew_image: {amount: [{gte: %d}], version: [{lt: 100}, {gt: 1e6}]}\n", k, i%1000)
		case 3:
			src = fmt.Sprintf(`table_name: [table_%d]
new_image:
  status: [ACTIVE, {prefix: "PENDING_"}]
  address: {country: [CH, DE, AT]}
  orders: {sku: [{suffix: "-XL"}], qty: [{gte: 1}]}
old_image: {status: [{exists: true}]}
`, k)
		case 4:
			src = fmt.Sprintf("table_name: [table_%d]\nnew_image: {updated_at: [{gt: \"now()-5m\"}], deleted_at: [{exists: false}]}\n", k)
		}
		rules = append(rules, benchRule(tb, i, src))
	}
	return rules
}

// eqPrefixRules returns n rules of equality and prefix conditions only:
// even rules name a table, odd rules a customer id prefix. benchEvent
// matches rules 0 and 1.
func eqPrefixRules(tb testing.TB, n int) []matcher.Rule {
	tb.Helper()
	rules := make([]matcher.Rule, 0, n)
	for i := range n {
		src := fmt.Sprintf("event_name: [INSERT, MODIFY]\ntable_name: [table_%d]\n", i)
		if i%2 == 1 {
			src = fmt.Sprintf("event_name: [MODIFY]\nnew_image: {id: [{prefix: \"cust_%d_\"}]}\n", i)
		}
		rules = append(rules, benchRule(tb, i, src))
	}
	return rules
}

func benchRule(tb testing.TB, i int, src string) matcher.Rule {
	p, err := yamlpattern.Parse("bench.yaml", []byte(src))
	if err != nil {
		tb.Fatal(err)
	}
	return matcher.Rule{App: fmt.Sprintf("app%05d", i/10), Handler: fmt.Sprintf("h.f%d", i%10), Pattern: p}
}

// benchMatch runs the pre-parsed match path (Set.AppendMatches into a
// reused slice) for every size, reporting events/s.
func benchMatch(b *testing.B, gen func(testing.TB, int) []matcher.Rule, wantMatches func(n int) int) {
	event, err := matcher.DecodeEvent(benchEvent)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range benchSizes {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			set := matcher.NewSet(gen(b, n))
			var dst []matcher.Target
			if got := len(set.AppendMatches(dst, event, benchNow)); got != wantMatches(n) {
				b.Fatalf("%d matches, want %d", got, wantMatches(n))
			}
			b.ReportAllocs()
			for b.Loop() {
				dst = set.AppendMatches(dst[:0], event, benchNow)
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkMatch matches a pre-parsed ~1 KB event against mixed rules.
func BenchmarkMatch(b *testing.B) {
	benchMatch(b, mixedRules, func(n int) int { return min(n, 5) })
}

// BenchmarkMatchEqualityPrefix matches a pre-parsed ~1 KB event against
// equality and prefix rules only (the throughput target).
func BenchmarkMatchEqualityPrefix(b *testing.B) {
	benchMatch(b, eqPrefixRules, func(n int) int { return min(n, 2) })
}

// BenchmarkMatchValue is BenchmarkMatch through Set.MatchValue, which
// returns a new slice for the matches.
func BenchmarkMatchValue(b *testing.B) {
	event, err := matcher.DecodeEvent(benchEvent)
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			set := matcher.NewSet(mixedRules(b, n))
			b.ReportAllocs()
			for b.Loop() {
				if len(set.MatchValue(event, benchNow)) != 5 {
					b.Fatal("want 5 matches")
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkMatchBytes is BenchmarkMatch from the event's JSON text, as the
// worker matches it: DecodeEvent, then the match.
func BenchmarkMatchBytes(b *testing.B) {
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			set := matcher.NewSet(mixedRules(b, n))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := set.MatchAt(benchEvent, benchNow); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
			b.SetBytes(int64(len(benchEvent)))
		})
	}
}

// exampleRules returns the event rules of the example apps under
// examples/apps, in dispatch order (apps by name, rules as declared).
func exampleRules(tb testing.TB) []matcher.Rule {
	tb.Helper()
	files, err := filepath.Glob(filepath.Join("..", "examples", "apps", "*", "template.yaml"))
	if err != nil || len(files) == 0 {
		tb.Fatalf("no example templates: %v", err)
	}
	var rules []matcher.Rule
	for _, f := range files { // Glob sorts, so apps come in name order
		src, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		var tmpl struct {
			Events []struct {
				Handler string         `yaml:"handler"`
				Pattern map[string]any `yaml:"pattern"`
			} `yaml:"events"`
		}
		if err := yaml.Unmarshal(src, &tmpl); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
		for _, e := range tmpl.Events {
			text, err := yaml.Marshal(e.Pattern)
			if err != nil {
				tb.Fatal(err)
			}
			p, err := yamlpattern.Parse(f, text)
			if err != nil {
				tb.Fatalf("%s: %v", f, err)
			}
			rules = append(rules, matcher.Rule{App: filepath.Base(filepath.Dir(f)), Handler: e.Handler, Pattern: p})
		}
	}
	return rules
}

// BenchmarkDecodeMatch measures what the worker does per event: Set.Match
// on the JSON text of benchEvent (decode and match), against the example
// apps' rules plus 100 mixed rules. The anchors run in the same process so
// that the figure can be read as a ratio on a shared machine: json.Valid
// (validation alone) and json.Unmarshal into map[string]any (a full decode
// with encoding/json).
func BenchmarkDecodeMatch(b *testing.B) {
	set := matcher.NewSet(append(exampleRules(b), mixedRules(b, 100)...))
	b.Run("anchor=json.Valid", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchEvent)))
		for b.Loop() {
			if !json.Valid(benchEvent) {
				b.Fatal("invalid")
			}
		}
	})
	b.Run("anchor=json.Unmarshal", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchEvent)))
		for b.Loop() {
			var v map[string]any
			if err := json.Unmarshal(benchEvent, &v); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("MatchAt", func(b *testing.B) {
		b.ReportAllocs()
		b.SetBytes(int64(len(benchEvent)))
		for b.Loop() {
			if got, err := set.MatchAt(benchEvent, benchNow); err != nil || len(got) != 5 {
				b.Fatalf("MatchAt = %v, %v; want 5 targets", got, err)
			}
		}
	})
	// The parts of MatchAt: validating the text, validating it and
	// building the referenced values, matching those values.
	for _, part := range []struct {
		name         string
		validateOnly bool
	}{{"part=validate", true}, {"part=decode", false}} {
		b.Run(part.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(benchEvent)))
			for b.Loop() {
				if !set.ScanLoop(benchEvent, part.validateOnly, 1) {
					b.Fatal("malformed")
				}
			}
		})
	}
	b.Run("part=match", func(b *testing.B) {
		event, ok := set.DecodeReferenced(benchEvent)
		if !ok {
			b.Fatal("malformed")
		}
		var dst []matcher.Target
		b.ReportAllocs()
		for b.Loop() {
			if dst = set.AppendMatches(dst[:0], event, benchNow); len(dst) != 5 {
				b.Fatalf("%d targets, want 5", len(dst))
			}
		}
	})
}

func BenchmarkDecodeEvent(b *testing.B) {
	b.ReportAllocs()
	b.SetBytes(int64(len(benchEvent)))
	for b.Loop() {
		if _, err := matcher.DecodeEvent(benchEvent); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNewSet(b *testing.B) {
	rules := mixedRules(b, 10000)
	b.ReportAllocs()
	for b.Loop() {
		matcher.NewSet(rules)
	}
}

func BenchmarkExplain(b *testing.B) {
	event, err := matcher.DecodeEvent(benchEvent)
	if err != nil {
		b.Fatal(err)
	}
	set := matcher.NewSet(mixedRules(b, 100))
	b.ReportAllocs()
	for b.Loop() {
		set.Explain(event, benchNow)
	}
}

func BenchmarkParse(b *testing.B) {
	src := []byte(`event_name: [INSERT, MODIFY]
table_name: [users]
new_image:
  status: [ACTIVE, {prefix: "PENDING_"}]
  amount: [{gte: 10}, {lt: -5}]
  deleted_at: [{exists: false}]
  updated_at: [{gt: "now()-5m"}]
`)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := yamlpattern.Parse("bench.yaml", src); err != nil {
			b.Fatal(err)
		}
	}
}

// TestBenchRules checks the benchmark's premises: the event is about 1 KB
// and the generators give the matches the benchmarks expect.
func TestBenchRules(t *testing.T) {
	if n := len(benchEvent); n < 900 || n > 1200 {
		t.Errorf("benchEvent is %d bytes, want about 1 KB", n)
	}
	event, err := matcher.DecodeEvent(benchEvent)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 10, 1000} {
		for name, gen := range map[string]func(testing.TB, int) []matcher.Rule{"mixed": mixedRules, "eqprefix": eqPrefixRules} {
			rules := gen(t, n)
			set := matcher.NewSet(rules)
			got := set.MatchValue(event, benchNow)
			want := scanMatch(rules, event, benchNow)
			if fmt.Sprint(got) != fmt.Sprint(want) || len(want) != min(n, map[string]int{"mixed": 5, "eqprefix": 2}[name]) {
				t.Errorf("%s rules=%d: Set %v, scan %v", name, n, got, want)
			}
		}
	}
}
