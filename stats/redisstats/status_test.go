package redisstats_test

import (
	"reflect"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// TestStatus: each worker's status is its own field; readers skip a stale
// one and a field that is not a status, merge the holds by app and reason
// (summing the counts), and a cleared status is gone.
func TestStatus(t *testing.T) {
	rc := redistest.Client(t)
	s := redistest.Name(t, "events")
	now := time.Now()
	orders := stats.Hold{App: "orders", Reason: stats.ReasonRulesUnreadable, Error: "orders/template.yaml:5:13: unknown operator", Held: 3}
	for _, w := range []stats.WorkerStatus{
		{Consumer: "w1", UpdatedAt: now, Holds: []stats.Hold{orders}},
		{Consumer: "w2", UpdatedAt: now.Add(-time.Second), Holds: []stats.Hold{
			{App: "orders", Reason: stats.ReasonRulesUnreadable, Error: "orders/template.yaml:5:13: unknown operator", Held: 10_000, AtLeast: true},
			{App: "billing", Reason: stats.ReasonAppUnavailable, Error: "image missing", Held: 1},
		}},
		{Consumer: "dead", UpdatedAt: now.Add(-stats.StatusStaleAfter - time.Second), Holds: []stats.Hold{{Reason: stats.ReasonError, Error: "gone", Held: 7}}},
	} {
		if err := redisstats.WriteStatus(t.Context(), rc, s, "workers", w); err != nil {
			t.Fatal(err)
		}
	}
	if err := rc.Do(t.Context(), rc.B().Hset().Key(keys.Status(s, "workers")).FieldValue().FieldValue("junk", "{not json").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	ws, err := redisstats.ReadStatus(t.Context(), rc, s, "workers", now)
	if err != nil || len(ws) != 2 || ws[0].Consumer != "w1" || ws[1].Consumer != "w2" {
		t.Fatalf("ReadStatus = %+v, %v; want w1 and w2 (dead is stale, junk is no status)", ws, err)
	}
	want := []stats.Hold{
		{App: "billing", Reason: stats.ReasonAppUnavailable, Error: "image missing", Held: 1},
		{App: "orders", Reason: stats.ReasonRulesUnreadable, Error: orders.Error, Held: 10_003, AtLeast: true},
	}
	if got := stats.Holds(ws); !reflect.DeepEqual(got, want) {
		t.Errorf("Holds = %+v\nwant    %+v", got, want)
	}
	if got := want[1].String(); got != "app orders: rules_unreadable, holds at least 10003 messages: orders/template.yaml:5:13: unknown operator" {
		t.Errorf("String = %q", got)
	}
	if err := redisstats.ClearStatus(t.Context(), rc, s, "workers", "w2"); err != nil {
		t.Fatal(err)
	}
	if got, err := redisstats.ReadHolds(t.Context(), rc, s, "workers"); err != nil || !reflect.DeepEqual(got, []stats.Hold{orders}) {
		t.Errorf("ReadHolds after w2 cleared = %+v, %v; want w1's", got, err)
	}
	ttl, err := rc.Do(t.Context(), rc.B().Pttl().Key(keys.Status(s, "workers")).Build()).AsInt64()
	if err != nil || ttl <= 0 {
		t.Errorf("the status hash's TTL = %d ms, %v; want it to expire once no worker writes", ttl, err)
	}
}
