package console_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// The overview's workers panel lists the invocations live workers keep
// waiting for their rules' flow control, summed over the workers, with the
// age of the oldest one's event (docs/flow-control.md#waiting).
func TestOverviewShowsFlowControlWaiting(t *testing.T) {
	f := newFixture(t)
	f.Publish(`{"kind":"order","amount":5}`)
	f.deliver("worker-1")
	now := time.Now()
	for _, st := range []stats.WorkerStatus{
		{Consumer: "worker-1", UpdatedAt: now, Waiting: []stats.Waiting{{App: "shop", Handler: "orders.charge", Limit: "rate", Count: 3, Oldest: now.Add(-90 * time.Second)}}},
		{Consumer: "worker-2", UpdatedAt: now, Waiting: []stats.Waiting{{App: "shop", Handler: "orders.charge", Limit: "rate", Count: 4, Oldest: now.Add(-10 * time.Second)}}},
	} {
		if err := redisstats.WriteStatus(t.Context(), f.Redis, f.Stream, f.Group, st); err != nil {
			t.Fatal(err)
		}
	}
	code, body := f.get("/")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "overview", body, "Waiting for flow control", "<code>shop/orders.charge</code>", "<td>rate</td>", `<td class="n">7</td>`, `<td class="n">1m30s</td>`)
}
