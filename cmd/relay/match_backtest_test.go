package main

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"testing"

	"github.com/relaydev/relay/internal/redistest"
)

// seedBacktestStream writes a stream of known content with fixed ids,
// 1700000000000-0 (oldest) to 1700000000000-17 (newest), for the apps in
// testdata/apps: 6 new pending orders (orders.created), 4 completed orders
// (orders.completed), 3 new users scoring 99 (users.created and
// users.scored), 3 events no rule matches, one entry that is not JSON and
// one without an event field. broken/audit.all matches the 13 events with
// an event_name; broken's other rule does not parse, so it is not listed.
func seedBacktestStream(t *testing.T) string {
	t.Helper()
	rc := redistest.Client(t)
	name := redistest.Name(t, "events")
	var entries [][2]string
	add := func(n int, field, value string) {
		for range n {
			entries = append(entries, [2]string{field, value})
		}
	}
	add(6, "event", `{"event_name":"INSERT","table_name":"orders","new_image":{"status":"PENDING","total":150}}`)
	add(4, "event", `{"event_name":"MODIFY","table_name":"orders","new_image":{"status":"COMPLETED"}}`)
	add(1, "event", `{"table_name":"other"}`)
	add(3, "event", `{"event_name":"INSERT","table_name":"users","new_image":{"id":"user_7","score":99}}`)
	add(2, "event", `{"table_name":"other"}`)
	add(1, "event", `not json`)
	add(1, "payload", `{}`)
	for i, e := range entries {
		id := fmt.Sprintf("1700000000000-%d", i)
		if err := rc.Do(t.Context(), rc.B().Xadd().Key(name).Id(id).FieldValue().FieldValue(e[0], e[1]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	return name
}

// TestMatchBacktest runs relay match --backtest against a stream of known
// content on a real redis-server and compares the transcripts with
// testdata/match_backtest_<name>.golden.
func TestMatchBacktest(t *testing.T) {
	isolateEnv(t)
	st := seedBacktestStream(t)
	addr := redistest.Addr(t)
	base := []string{"match", "--apps", "testdata/apps", "--now", "2026-09-12T10:00:00Z"}
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{name: "all", args: []string{"--backtest", "100"}},
		{name: "window", args: []string{"--backtest", "8", "--first", "2"}},
		{name: "app", args: []string{"--backtest", "10000", "--app", "users"}},
		{name: "json", args: []string{"--backtest", "3", "--app", "users", "--first", "1", "--json"}},
		{name: "unknown_app", args: []string{"--backtest", "10", "--app", "nope"}, code: exitUsage},
		{name: "app_alone", args: []string{"--app", "users"}, code: exitUsage},
		{name: "too_big", args: []string{"--backtest", "10001"}, code: exitUsage},
		{name: "zero", args: []string{"--backtest", "0"}, code: exitUsage},
		{name: "bad_first", args: []string{"--backtest", "10", "--first", "101"}, code: exitUsage},
		{name: "with_event", args: []string{"--backtest", "10", "--event", "{}"}, code: exitUsage},
		{name: "with_explain", args: []string{"--backtest", "10", "--explain"}, code: exitUsage},
		{name: "missing_stream", args: []string{"--backtest", "10", "--stream", "no-such-stream"}, code: exitFailure},
		{name: "no_redis", args: []string{"--backtest", "10", "--redis-uri", "127.0.0.1:1"}, code: exitFailure},
		{name: "no_settings", args: []string{"--backtest", "10", "--redis-uri", "", "--stream", ""}, code: exitUsage},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{}, base...), "--redis-uri", addr, "--stream", st)
			r := relayCLI(t, "", append(args, tc.args...)...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d; stderr %s", r.code, tc.code, r.stderr)
			}
			checkGolden(t, filepath.Join("testdata", "match_backtest_"+tc.name+".golden"), r.transcript(addr, "<redis>", st, "events"))
		})
	}
}

// TestMatchBacktestCounts checks the counts of the whole stream in the
// JSON output, rule by rule, against what the fixture holds.
func TestMatchBacktestCounts(t *testing.T) {
	isolateEnv(t)
	st := seedBacktestStream(t)
	r := relayCLI(t, "", "match", "--apps", "testdata/apps", "--redis-uri", redistest.Addr(t), "--stream", st,
		"--backtest", "10000", "--first", "100", "--json")
	if r.code != 0 {
		t.Fatalf("exit %d: %s", r.code, r.stderr)
	}
	var out struct {
		Examined, Matched, Unmatched, Malformed int
		Newest, Oldest                          string
		Rules                                   []struct {
			App, Handler string
			Matches      int
			First        []struct{ ID, Event string }
		}
	}
	if err := json.Unmarshal([]byte(r.stdout), &out); err != nil {
		t.Fatal(err)
	}
	if out.Examined != 18 || out.Matched != 13 || out.Unmatched != 3 || out.Malformed != 2 ||
		out.Newest != "1700000000000-17" || out.Oldest != "1700000000000-0" {
		t.Errorf("totals %+v, want 18 examined (17 back to 0): 13 matched, 3 unmatched, 2 malformed", out)
	}
	want := map[string]int{"broken/audit.all": 13, "orders/orders.created": 6,
		"orders/orders.completed": 4, "orders/orders.recent": 0, "orders/orders.priority": 0,
		"users/users.created": 3, "users/users.scored": 3}
	if len(out.Rules) != len(want) {
		t.Errorf("%d rules, want %d", len(out.Rules), len(want))
	}
	for _, rule := range out.Rules {
		name := rule.App + "/" + rule.Handler
		if rule.Matches != want[name] || len(rule.First) != want[name] {
			t.Errorf("%s: %d matches, %d listed; want %d", name, rule.Matches, len(rule.First), want[name])
		}
	}
}
