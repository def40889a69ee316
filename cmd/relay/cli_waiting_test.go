package main

import (
	"context"
	"encoding/json"
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
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// TestCLIShowsFlowControlWaiting: a rule with concurrency 1 across the
// cluster runs one of three events while two wait; relay stats prints
// them in its waiting table (and in JSON), and relay health warns once
// the oldest waiting event is older than --waiting-age, and not before
// (docs/flow-control.md#waiting).
func TestCLIShowsFlowControlWaiting(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	name := redistest.Name(t, "events")
	root := testutil.AppsRoot(t, map[string]string{
		"slow": "image: x\nconcurrency: 4\nevents:\n  - {handler: jobs.work, pattern: {kind: [work]}, timeout: 1m, concurrency: 1, concurrency_scope: cluster}\n"})
	release := make(chan struct{})
	runWorker(t, worker.Config{Redis: rc, Streams: []string{name}, Apps: template.Dir(root),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"slow/jobs.work": func(context.Context, runtime.Request) error { <-release; return nil }}),
		Engine: relay.Config{StatsInterval: 20 * time.Millisecond},
	})
	released := false
	t.Cleanup(func() { // before the worker stops
		if !released {
			close(release)
		}
	})
	src := redisstream.New(rc, name, "workers", "producer")
	for range 3 {
		if _, err := src.Publish(t.Context(), map[string]string{"event": `{"kind":"work"}`}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "one attempt running, two waiting for its slot", func() bool {
		ws, err := redisstats.ReadStatus(t.Context(), rc, name, "workers", time.Now())
		return err == nil && len(ws) == 1 && len(ws[0].Running) == 1 && len(ws[0].Waiting) == 1 && ws[0].Waiting[0].Count == 2
	})
	base := []string{"--redis-uri", srv.Addr, "--stream", name, "--group", "workers"}
	r := relayCLI(t, "", append([]string{"stats"}, base...)...)
	for _, want := range []string{"Waiting for flow control", "RULE", "OLDEST EVENT", "slow/jobs.work  concurrency  2"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("relay stats lacks %q: exit %d\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	r = relayCLI(t, "", append([]string{"stats", "--json"}, base...)...)
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("relay stats --json: %v\n%s%s", err, r.stdout, r.stderr)
	}
	if len(got.Waiting) != 1 || got.Waiting[0].App != "slow" || got.Waiting[0].Limit != "concurrency" || got.Waiting[0].Count != 2 || got.Waiting[0].Oldest.IsZero() {
		t.Errorf("relay stats --json waiting = %+v, want slow/jobs.work: 2 waiting for concurrency, with the oldest event's time", got.Waiting)
	}

	health := append([]string{"health", "--runner", "process"}, base...)
	r = relayCLI(t, "", health...)
	if !strings.Contains(r.stdout, "flow control") || strings.Contains(r.stdout, "flow control      WARN") || r.code != exitOK {
		t.Errorf("relay health with the default --waiting-age: exit %d, want flow control ok\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = relayCLI(t, "", append(health, "--waiting-age", "1ms")...)
	for _, want := range []string{"flow control", "WARN", "slow/jobs.work: 2 invocations waiting for its concurrency limit", "over --waiting-age 1ms"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("relay health --waiting-age 1ms lacks %q: exit %d\n%s%s", want, r.code, r.stdout, r.stderr)
		}
	}
	if r.code != exitOK {
		t.Errorf("relay health --waiting-age 1ms: exit %d, want 0 (a warning)", r.code)
	}

	close(release)
	released = true
	testutil.WaitFor(t, 10*time.Second, "nothing waiting once the slot frees", func() bool {
		ws, err := redisstats.ReadStatus(t.Context(), rc, name, "workers", time.Now())
		return err == nil && len(ws) == 1 && len(stats.SumWaiting(ws)) == 0 && len(ws[0].Running) == 0
	})
}
