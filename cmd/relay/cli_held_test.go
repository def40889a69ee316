package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/worker"
)

// TestCLIHealthAndStatsNameHeldMessages: a worker serving an app whose
// pattern has a typo holds every message of the stream; relay health
// fails naming the app, the error's file:line:col and the messages held,
// and relay stats prints the same, as a table and in --json
// (docs/operations.md#held-messages).
func TestCLIHealthAndStatsNameHeldMessages(t *testing.T) {
	isolateEnv(t)
	name, src := newGroup(t)
	root := testutil.AppsRoot(t, map[string]string{
		"users":  "image: x\nevents:\n  - {handler: events.created, pattern: {kind: [user]}}\n",
		"orders": "image: x\nevents:\n  - {handler: orders.new, pattern: {kind: [{prefx: ord}]}}\n",
	})
	runWorker(t, worker.Config{Redis: redistest.Client(t), Streams: []string{name}, Apps: template.Dir(root),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"users/events.created": func(context.Context, runtime.Request) error { return nil }}),
		Engine: relay.Config{StatsInterval: 20 * time.Millisecond},
	})
	for range 2 {
		if _, err := src.Publish(t.Context(), map[string]string{"event": `{"kind":"user"}`}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the worker to publish the held messages", func() bool {
		hs, err := redisstats.ReadHolds(t.Context(), redistest.Client(t), name, "workers")
		return err == nil && len(hs) == 1 && hs[0].Held == 2
	})
	args := []string{"--redis-uri", redistest.Addr(t), "--stream", name, "--group", "workers"}
	pos := regexp.MustCompile(`orders/template\.yaml:3:\d+: `)

	r := relayCLI(t, "", append([]string{"health", "--runner", "process"}, args...)...)
	if r.code != exitFailure || !strings.Contains(r.stderr, "unhealthy: held messages") ||
		!strings.Contains(r.stdout, "app orders: rules_unreadable, holds 2 messages: ") || !pos.MatchString(r.stdout) {
		t.Errorf("relay health: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}

	r = relayCLI(t, "", append([]string{"stats"}, args...)...)
	if r.code != exitOK || !regexp.MustCompile(`(?m)^orders +rules_unreadable +2 +orders/template\.yaml:3:`).MatchString(r.stdout) {
		t.Errorf("relay stats: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	r = relayCLI(t, "", append([]string{"stats", "--json"}, args...)...)
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK || len(got.Holds) != 1 ||
		got.Holds[0].App != "orders" || got.Holds[0].Reason != stats.ReasonRulesUnreadable || got.Holds[0].Held != 2 || !pos.MatchString(got.Holds[0].Error) {
		t.Errorf("relay stats --json: exit %d, %v, holds %+v\nstdout:\n%s", r.code, err, got.Holds, r.stdout)
	}
}
