package stats_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/stats"
)

// SumWaiting adds up the workers' waiting invocations per rule and limit,
// keeps the oldest event's time, and sorts them.
func TestSumWaiting(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	ws := []stats.WorkerStatus{
		{Consumer: "w1", Waiting: []stats.Waiting{
			{App: "shop", Handler: "charge", Limit: "rate", Count: 3, Oldest: t0.Add(time.Minute)},
			{App: "shop", Handler: "charge", Limit: "concurrency", Count: 1, Oldest: t0},
		}},
		{Consumer: "w2"},
		{Consumer: "w3", Waiting: []stats.Waiting{
			{App: "shop", Handler: "charge", Limit: "rate", Count: 2, Oldest: t0},
			{App: "search", Handler: "reindex", Limit: "debounce", Count: 5},
		}},
	}
	want := []stats.Waiting{
		{App: "search", Handler: "reindex", Limit: "debounce", Count: 5},
		{App: "shop", Handler: "charge", Limit: "concurrency", Count: 1, Oldest: t0},
		{App: "shop", Handler: "charge", Limit: "rate", Count: 5, Oldest: t0},
	}
	if diff := cmp.Diff(want, stats.SumWaiting(ws)); diff != "" {
		t.Errorf("SumWaiting (-want +got):\n%s", diff)
	}
	if got := stats.SumWaiting(nil); len(got) != 0 {
		t.Errorf("SumWaiting(nil) = %v", got)
	}
}
