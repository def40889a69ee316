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

// TestCLIHealthWarnsOfStalledHandlersAndLostData: a handler that hangs
// past its timeout holds both slots of its app while a third message
// waits; relay health warns naming each attempt, its running time and
// timeout, and the full slots (docs/operations.md#stalled-handlers).
// Redis then restarts empty: relay health warns that the worker created
// the group again and that both attempts run for messages Redis lost
// (docs/operations.md#redis-lost-its-data). Warnings do not fail it.
func TestCLIHealthWarnsOfStalledHandlersAndLostData(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	name := redistest.Name(t, "events")
	root := testutil.AppsRoot(t, map[string]string{
		"slow": "image: x\nconcurrency: 2\nevents:\n  - {handler: jobs.work, pattern: {kind: [work]}, timeout: 200ms}\n"})
	release := make(chan struct{})
	runWorker(t, worker.Config{Redis: rc, Streams: []string{name}, Apps: template.Dir(root),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"slow/jobs.work": func(context.Context, runtime.Request) error { <-release; return nil }}),
		Engine: relay.Config{StatsInterval: 20 * time.Millisecond, MinPendingIdle: 300 * time.Millisecond, ReclaimInterval: 50 * time.Millisecond,
			HeartbeatInterval: 50 * time.Millisecond},
	})
	t.Cleanup(func() { close(release) }) // before the worker stops
	src := redisstream.New(rc, name, "workers", "producer")
	for range 3 {
		if _, err := src.Publish(t.Context(), map[string]string{"event": `{"kind":"work"}`}); err != nil {
			t.Fatal(err)
		}
	}
	running := func(cond func(stats.WorkerStatus) bool) func() bool {
		return func() bool {
			ws, err := redisstats.ReadStatus(t.Context(), rc, name, "workers", time.Now())
			return err == nil && len(ws) == 1 && len(ws[0].Running) == 2 && cond(ws[0])
		}
	}
	testutil.WaitFor(t, 10*time.Second, "two attempts past their timeout", running(func(w stats.WorkerStatus) bool {
		return w.Running[1].PastTimeout(time.Now())
	}))
	args := []string{"health", "--runner", "process", "--redis-uri", srv.Addr, "--stream", name, "--group", "workers"}
	r := relayCLI(t, "", args...)
	for _, want := range []string{"running handlers  WARN", "slow/jobs.work on w1 has run for ", "past its 200ms timeout", "the runtime did not stop it",
		"app slow: all 2 slots taken on w1", "1 other message pending: queued work waits for a slot", "redis data        ok"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("relay health lacks %q: exit %d\nstdout:\n%s\nstderr:\n%s", want, r.code, r.stdout, r.stderr)
		}
	}
	if r.code != exitOK {
		t.Errorf("relay health: exit %d, want 0 (a warning)\n%s%s", r.code, r.stdout, r.stderr)
	}

	srv.Stop()
	srv.Restart(t)
	testutil.WaitFor(t, 10*time.Second, "the group recreated and both attempts lost", running(func(w stats.WorkerStatus) bool {
		return w.GroupRecreations == 1 && w.Running[0].Lost && w.Running[1].Lost
	}))
	r = relayCLI(t, "", append(args, "--json")...)
	var got healthJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK || !got.Healthy {
		t.Fatalf("relay health --json: exit %d, %v\n%s%s", r.code, err, r.stdout, r.stderr)
	}
	checks := map[string]healthCheckJSON{}
	for _, c := range got.Checks {
		checks[c.Name] = c
	}
	if c := checks["redis data"]; !c.Warning || !strings.Contains(c.Detail, "w1 created consumer group workers again from id 0 at ") ||
		!strings.Contains(c.Detail, "Redis lost its data") {
		t.Errorf("redis data check = %+v", c)
	}
	if c := checks["running handlers"]; !c.Warning || strings.Count(c.Detail, "which Redis no longer has pending for w1") != 2 {
		t.Errorf("running handlers check = %+v", c)
	}
}
