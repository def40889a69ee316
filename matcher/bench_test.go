package matcher_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/relaydev/relay/matcher"
)

// benchRules builds n rules over DynamoDB-stream-like events: one app per
// ten rules, each rule a mix of equality, prefix, numeric, exists and
// temporal conditions on a different table.
func benchRules(b *testing.B, n int) []matcher.Rule {
	b.Helper()
	rules := make([]matcher.Rule, 0, n)
	for i := range n {
		src := fmt.Sprintf(`event_name: [INSERT, MODIFY]
table_name: [table_%d]
new_image:
  status: [ACTIVE, {prefix: "PENDING_"}]
  amount: [{gte: %d}]
  deleted_at: [{exists: false}]
  updated_at: [{gt: "now()-5m"}]
`, i%500, i%1000)
		p, err := matcher.Parse("bench.yaml", []byte(src))
		if err != nil {
			b.Fatal(err)
		}
		rules = append(rules, matcher.Rule{App: fmt.Sprintf("app%05d", i/10), Handler: fmt.Sprintf("h.f%d", i%10), Pattern: p})
	}
	return rules
}

func BenchmarkMatch(b *testing.B) {
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	event := []byte(`{"event_name":"MODIFY","table_name":"table_7","event_id":"c4ca4238a0b923820dcc509a6f75849b",
"new_image":{"id":"user_123","status":"ACTIVE","amount":512.25,"tags":["a","b","c"],"updated_at":"2026-09-12T09:58:30Z",
"address":{"city":"Zürich","zip":"8001"}},"old_image":{"id":"user_123","status":"PENDING_REVIEW","amount":12}}`)
	for _, n := range []int{100, 10000} {
		b.Run(fmt.Sprintf("rules=%d", n), func(b *testing.B) {
			set := matcher.NewSet(benchRules(b, n))
			if _, err := set.MatchAt(event, now); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := set.MatchAt(event, now); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
		})
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
		if _, err := matcher.Parse("bench.yaml", src); err != nil {
			b.Fatal(err)
		}
	}
}
