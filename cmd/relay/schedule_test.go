package main

import (
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/schedule/cron"

	"github.com/google/go-cmp/cmp"
)

// The golden files mask times; the values themselves are checked here,
// across Paris's spring-forward night (2026-03-29, 02:00 → 03:00).
func TestFiresListsUTCAndLocalAcrossDST(t *testing.T) {
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		t.Fatal(err)
	}
	s := app.Schedule{Name: "nightly", Handler: "reports.nightly", Cron: cron.MustParse("30 2 * * *", paris)}
	got, err := fires("shop", s, time.Date(2026, 3, 27, 12, 0, 0, 0, time.UTC), 3)
	if err != nil {
		t.Fatal(err)
	}
	want := []fireJSON{
		{UTC: "2026-03-28T01:30:00Z", Local: "2026-03-28T02:30:00+01:00 CET"},
		// 02:30 does not exist that night: it fires once, at the jump.
		{UTC: "2026-03-29T01:00:00Z", Local: "2026-03-29T03:00:00+02:00 CEST"},
		{UTC: "2026-03-30T00:30:00Z", Local: "2026-03-30T02:30:00+02:00 CEST"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("fires (-want +got):\n%s", diff)
	}
}
