package console_test

import (
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/relaydev/relay/console"
)

// TestOverviewMemory: the overview's Redis memory section lists the four
// parts with what they hold (4 stream entries, 1 dead letter) and the
// projection at the configured retentions: with a stream retention of 0
// and entries arriving the stream grows without bound; with one hour it
// levels off at a byte count, and the invocation state shows it is
// deleted at the acknowledgement.
func TestOverviewMemory(t *testing.T) {
	row := func(part, items string) *regexp.Regexp {
		return regexp.MustCompile(`<td>` + part + `</td><td class="n">[0-9.]+ [KMG]?i?B</td><td class="n">` + items + `</td>`)
	}
	for _, c := range []struct {
		name   string
		opt    func(*console.Config)
		want   []string
		stream string
	}{
		{"stream kept forever", func(*console.Config) {},
			[]string{"the stream (REDIS_STREAM_RETENTION 0 keeps every entry) grows without bound"}, "forever</td><td class=\"n\">unbounded"},
		{"stream kept an hour", func(c *console.Config) { c.StreamRetention = time.Hour },
			[]string{"projected peak at this rate:", "0 (deleted at ack)"}, "1h0m0s</td><td class=\"n\">"},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, c.opt)
			f.Publish(`{"kind":"order","amount":5}`)
			f.Publish(`{"kind":"order","amount":500}`)
			f.Publish(`{"kind":"refund"}`)
			f.deadLetter("shop", "orders.charge", `{"kind":"order"}`, "exit 3")
			code, body := f.get("/")
			if code != http.StatusOK {
				t.Fatalf("status %d", code)
			}
			contains(t, "overview", body, "<h3>Redis memory", ">projected<", "invocation state", "other relay keys", c.stream)
			contains(t, "overview", body, c.want...)
			for _, r := range []*regexp.Regexp{row("source stream", "4"), row("dead-letter stream", "1")} {
				if !r.MatchString(body) {
					t.Errorf("overview: no row matching %s in\n%s", r, body)
				}
			}
		})
	}
}
