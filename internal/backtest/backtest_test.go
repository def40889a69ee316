package backtest_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/backtest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func rule(t *testing.T, handler, pattern string) app.Rule {
	t.Helper()
	p, err := yamlpattern.Parse("template.yaml", []byte(pattern))
	if err != nil {
		t.Fatal(err)
	}
	return app.Rule{Handler: handler, Pattern: p, Timeout: time.Second}
}

// TestBacktestCountsAStreamOfKnownContent: 30 orders (amounts 0..29), 10
// signups, 5 malformed events and 2 entries without an event, oldest
// first; the rules' counts and first matches follow from that.
func TestBacktestCountsAStreamOfKnownContent(t *testing.T) {
	c := redistest.Client(t)
	ctx := context.Background()
	stream := redistest.Name(t, "events")
	add := func(fields ...string) {
		cmd := c.B().Xadd().Key(stream).Id("*").FieldValue()
		for i := 0; i < len(fields); i += 2 {
			cmd = cmd.FieldValue(fields[i], fields[i+1])
		}
		if err := c.Do(ctx, cmd.Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 30 {
		add("event", fmt.Sprintf(`{"type":"orders.placed","amount":%d}`, i))
	}
	for i := range 10 {
		add("event", fmt.Sprintf(`{"type":"users.created","n":%d}`, i))
	}
	for range 5 {
		add("event", `not json`)
	}
	add("other", "x")
	add("other", "y")
	apps, err := app.NewSet(
		&app.App{Name: "shop", Rules: []app.Rule{
			rule(t, "orders.record", `{type: [orders.placed]}`),
			rule(t, "orders.big", `{type: [orders.placed], amount: [{gt: 24}]}`),
			rule(t, "orders.refund", `{type: [orders.refunded]}`),
		}},
		&app.App{Name: "users", Rules: []app.Rule{rule(t, "users.welcome", `{type: [{prefix: "users."}]}`)}},
	)
	if err != nil {
		t.Fatal(err)
	}
	res, err := backtest.Run(ctx, c, stream, apps, 100, 3, 0, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if res.Examined != 47 || res.Matched != 40 || res.Unmatched != 0 || res.Malformed != 7 {
		t.Errorf("examined %d, matched %d, unmatched %d, malformed %d; want 47, 40, 0, 7", res.Examined, res.Matched, res.Unmatched, res.Malformed)
	}
	want := map[string]int{"orders.record": 30, "orders.big": 5, "orders.refund": 0, "users.welcome": 10}
	if len(res.Rules) != 4 {
		t.Fatalf("%d rules, want 4", len(res.Rules))
	}
	for _, r := range res.Rules {
		if r.Matches != want[r.Handler] {
			t.Errorf("%s/%s matched %d, want %d", r.App, r.Handler, r.Matches, want[r.Handler])
		}
		if len(r.First) != min(3, want[r.Handler]) {
			t.Errorf("%s: %d first matches, want %d", r.Handler, len(r.First), min(3, want[r.Handler]))
		}
	}
	// Newest first: the biggest orders.
	if big := res.Rules[1]; big.First[0].Event != `{"type":"orders.placed","amount":29}` {
		t.Errorf("orders.big's first match %s, want the newest order (amount 29)", big.First[0].Event)
	}
	// A window of the newest 12 holds 7 malformed entries and 5 signups.
	res, err = backtest.Run(ctx, c, stream, apps, 12, 3, 0, time.Now())
	if err != nil || res.Examined != 12 || res.Malformed != 7 || res.Rules[3].Matches != 5 || res.Rules[0].Matches != 0 {
		t.Errorf("window of 12: %+v, %v", res, err)
	}
	// Under a 35-byte limit the orders with two-digit amounts (36 bytes)
	// are dead-lettered undecoded by the workers: malformed here too.
	res, err = backtest.Run(ctx, c, stream, apps, 100, 3, 35, time.Now())
	if err != nil || res.Malformed != 7+20 || res.Rules[0].Matches != 10 {
		t.Errorf("under a 35-byte limit: malformed %d, orders.record %d (%v); want 27 and 10", res.Malformed, res.Rules[0].Matches, err)
	}
	if _, err := backtest.Run(ctx, c, stream, apps, backtest.MaxWindow+1, 3, 0, time.Now()); err == nil {
		t.Error("a window over MaxWindow was accepted")
	}
}
