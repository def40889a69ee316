package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stats/redisstats"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// newGroup creates a stream with its consumer group "workers".
func newGroup(t *testing.T) (name string, src *redisstream.Source) {
	t.Helper()
	name = redistest.Name(t, "events")
	src = redisstream.New(redistest.Client(t), name, "workers", "test")
	if err := src.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return name, src
}

// runWorker runs a worker of group "workers" on cfg, as consumer w1 with a
// state directory of its own and no log unless cfg says otherwise, until
// the test ends; a worker that stops in error fails the test.
func runWorker(t *testing.T, cfg worker.Config) {
	t.Helper()
	if cfg.Group == "" {
		cfg.Group = "workers"
	}
	if cfg.Consumer == "" {
		cfg.Consumer = "w1"
	}
	if cfg.StateDir == "" {
		cfg.StateDir = t.TempDir()
	}
	if cfg.Engine.Logger == nil {
		cfg.Engine.Logger = slog.New(slog.DiscardHandler)
	}
	w, err := worker.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
}

func TestCLIHealth(t *testing.T) {
	isolateEnv(t)
	addr := redistest.Addr(t)
	ready, _ := newGroup(t)
	noGroup := redistest.Name(t, "nogroup")
	if err := redistest.Client(t).Do(t.Context(), redistest.Client(t).B().Xadd().Key(noGroup).Id("*").FieldValue().FieldValue("k", "v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	down := redistest.Start(t, redistest.Options{})
	down.Kill()
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"health_ok", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--runner", "process"}, exitOK},
		{"health_ok_json", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--runner", "process", "--json"}, exitOK},
		{"health_redis_down", []string{"--redis-uri", down.Addr, "--stream", ready, "--group", "workers", "--runner", "process"}, exitFailure},
		{"health_redis_down_json", []string{"--redis-uri", down.Addr, "--stream", ready, "--group", "workers", "--runner", "process", "--json"}, exitFailure},
		{"health_no_group", []string{"--redis-uri", addr, "--stream", noGroup, "--group", "workers", "--runner", "process"}, exitFailure},
		{"health_no_stream", []string{"--redis-uri", addr, "--stream", "no-such-stream", "--group", "workers", "--runner", "process"}, exitFailure},
		{"health_containerd_down", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--containerd-address", "testdata/no-such.sock"}, exitFailure},
		{"health_no_settings", nil, exitUsage},
		// The templates, as relay validate reads them, with no worker running.
		{"health_apps_unavailable", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--runner", "process", "--apps", "testdata/health_apps"}, exitFailure},
		{"health_apps_unavailable_json", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--runner", "process", "--apps", "testdata/health_apps", "--json"}, exitFailure},
		{"health_apps_valid", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--runner", "process", "--apps", validApps}, exitOK},
		{"health_apps_missing_root", []string{"--redis-uri", addr, "--stream", ready, "--group", "workers", "--runner", "process", "--apps", "testdata/no-such-apps"}, exitFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := relayCLI(t, "", append([]string{"health"}, tc.args...)...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			got := r.transcript(down.Addr, "<down>", addr, "<redis>", ready, "events", noGroup, "events-without-group")
			// The shared server's memory changes with every other test
			// (TestCLIStatsMemory checks the budget on a server of its own).
			checkCLIGolden(t, tc.name, projection.ReplaceAllString(got, "$1 <size>"))
		})
	}
}

// TestCLIHealthAppsFromEnv: RELAY_APPS names the root to check, and an
// unavailable app fails the health while Redis is down too: it needs no
// worker.
func TestCLIHealthAppsFromEnv(t *testing.T) {
	isolateEnv(t)
	down := redistest.Start(t, redistest.Options{})
	down.Kill()
	t.Setenv("RELAY_APPS", "testdata/health_apps")
	r := relayCLI(t, "", "health", "--redis-uri", down.Addr, "--stream", "events", "--group", "workers", "--runner", "process")
	if r.code != exitFailure || !strings.Contains(r.stderr, "relay: unhealthy: redis, apps") ||
		!regexp.MustCompile(`(?m)^apps +FAIL +shop unavailable, its rules unreadable: every message of the stream stays pending: shop/template.yaml:7:13: events\[0\]\.pattern\.id\[0\]\.prefx: unknown operator "prefx": did you mean "prefix"\? \(and 1 more error; relay validate lists them\)$`).MatchString(r.stdout) {
		t.Errorf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

// TestCLIHealthContainerd checks a reachable containerd and namespace.
func TestCLIHealthContainerd(t *testing.T) {
	isolateEnv(t)
	cc := containerdtest.Client(t)
	ready, _ := newGroup(t)
	r := relayCLI(t, "", "health", "--redis-uri", redistest.Addr(t), "--stream", ready, "--group", "workers",
		"--containerd-namespace", cc.DefaultNamespace(), "--json")
	var got healthJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK || !got.Healthy || len(got.Checks) != 10 ||
		got.Checks[4].Name != "containerd" || !got.Checks[4].OK || !strings.Contains(got.Checks[4].Detail, cc.DefaultNamespace()) {
		t.Errorf("exit %d, %v\nstdout:\n%s\nstderr:\n%s", r.code, err, r.stdout, r.stderr)
	}
}

// TestCLIStats reads seeded counters, a PEL and a DLQ.
func TestCLIStats(t *testing.T) {
	isolateEnv(t)
	rc := redistest.Client(t)
	ctx := t.Context()
	name, src := newGroup(t)
	if err := rc.Do(ctx, rc.B().Hset().Key(keys.Stats(name, "workers")).FieldValue().
		FieldValue("received", "120").FieldValue("matched", "100").FieldValue("unmatched", "15").FieldValue("malformed", "5").
		FieldValue("successes", "98").FieldValue("failures", "7").FieldValue("retries", "4").FieldValue("dlq_entries", "6").
		Build()).Error(); err != nil {
		t.Fatal(err)
	}
	// Three entries delivered, the oldest two hours old; one acknowledged.
	nowMS := time.Now().UnixMilli()
	var ids []string
	for _, ago := range []time.Duration{2*time.Hour + 5*time.Minute, time.Hour, time.Minute} {
		id := strconv.FormatInt(nowMS-ago.Milliseconds(), 10) + "-0"
		if err := rc.Do(ctx, rc.B().Xadd().Key(name).Id(id).FieldValue().FieldValue("event", "{}").Build()).Error(); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if msgs, err := src.Read(ctx, 10); err != nil || len(msgs) != 3 {
		t.Fatalf("read %d, %v", len(msgs), err)
	}
	if err := src.Ack(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	w := redisdlq.NewWriter(rc, name)
	for i := range 2 {
		if _, err := w.Write(ctx, dlq.Entry{OriginalID: fmt.Sprintf("1-%d", i+1), Group: "workers", Consumer: "c", Reason: "r", App: "a", Handler: "h", HandlerAttempts: 1}); err != nil {
			t.Fatal(err)
		}
	}
	empty, _ := newGroup(t)
	ageJSON := regexp.MustCompile(`"oldest_pending_age_seconds": [0-9.e+]+`)
	memoryJSON := regexp.MustCompile(`(?s)"memory": \{.*?\n  \}`)
	memoryText := regexp.MustCompile(`(?s)\nRedis memory: .*?\n(projected|OVER)[^\n]*\n`)
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"stats", []string{"--stream", name}, exitOK},
		{"stats_json", []string{"--stream", name, "--json"}, exitOK},
		{"stats_empty", []string{"--stream", empty}, exitOK},
		{"stats_no_group", []string{"--stream", name, "--group", "nobody"}, exitFailure},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"stats", "--redis-uri", redistest.Addr(t), "--group", "workers"}, tc.args...)
			r := relayCLI(t, "", args...)
			if r.code != tc.code {
				t.Errorf("exit %d, want %d", r.code, tc.code)
			}
			got := r.transcript(redistest.Addr(t), "<redis>", name, "events", empty, "quiet")
			// The shared server's memory changes with every other test:
			// TestCLIStatsMemory checks the memory part on a server of its own.
			got = memoryText.ReplaceAllString(memoryJSON.ReplaceAllString(got, `"memory": <memory>`), "\nRedis memory: <memory>\n")
			checkCLIGolden(t, tc.name, ageJSON.ReplaceAllString(got, `"oldest_pending_age_seconds": <age>`))
		})
	}
	r := relayCLI(t, "", "stats", "--redis-uri", redistest.Addr(t), "--stream", name, "--group", "workers", "--json")
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatal(err)
	}
	at, err := time.Parse(time.RFC3339, got.OldestPendingAt)
	if age := time.Since(at); err != nil || age < 2*time.Hour || age > 2*time.Hour+10*time.Minute ||
		got.OldestPendingAge < (2*time.Hour).Seconds() || got.Pending != 2 || got.DLQLength != 2 {
		t.Errorf("stats --json = %+v (%v)", got, err)
	}
}

var projection = regexp.MustCompile(`(projected peak at this rate:) [0-9.]+ [KMG]?i?B`)

// TestCLIStatsAfterEngine runs a known sequence through an Engine that
// keeps stats, then reads them with relay stats.
func TestCLIStatsAfterEngine(t *testing.T) {
	isolateEnv(t)
	rc := redistest.Client(t)
	name, src := newGroup(t)
	apps := writeTemplates(t, map[string]string{"shop": `
image: relay.local/busybox:latest
events:
  - {handler: ok.run, pattern: {kind: [ok]}}
  - {handler: bad.run, pattern: {kind: [bad]}, retries: 0}
`})
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"ok.run":  func(context.Context, runtime.Request) error { return nil },
		"bad.run": func(context.Context, runtime.Request) error { return errors.New("no") },
	})
	e, err := relay.NewEngine(apps, relay.Components{
		Source: redisstream.New(rc, name, "workers", "c1", redisstream.WithBlock(50*time.Millisecond)),
		State:  redisstate.New(rc), Runner: runner,
		Stream: name, Group: "workers", Consumer: "c1",
	}, relay.Config{Stats: redisstats.NewRecorder(rc, name, "workers"), StatsInterval: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.Run(ctx) }()
	for _, ev := range []string{`{"kind":"ok"}`, `{"kind":"ok"}`, `{"kind":"bad"}`, `{"kind":"other"}`, `not json`} {
		if _, err := src.Publish(t.Context(), map[string]string{"event": ev}); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "every message handled", func() bool {
		n, _, err := src.Pending(t.Context())
		l, _ := redisdlq.NewStore(rc, name).Len(t.Context())
		s, _ := redisstats.Read(t.Context(), rc, name, "workers")
		return err == nil && n == 0 && l == 2 && s.Received == 5
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	r := relayCLI(t, "", "stats", "--redis-uri", redistest.Addr(t), "--stream", name, "--group", "workers", "--json")
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK {
		t.Fatalf("exit %d, %v: %s", r.code, err, r.stderr)
	}
	want := statsJSON{Stream: name, Group: "workers", Received: 5, Matched: 3, Unmatched: 1, Malformed: 1,
		Successes: 2, Failures: 1, DLQEntries: 2, DLQLength: 2}
	if got.Memory == nil || got.Memory.Stream.Items != 5 {
		t.Errorf("stats memory = %+v, want the 5 entries of the stream", got.Memory)
	}
	if got.Holds == nil || len(got.Holds) != 0 {
		t.Errorf("stats holds = %#v, want [] (nothing held)", got.Holds)
	}
	if got.Waiting == nil || len(got.Waiting) != 0 {
		t.Errorf("stats waiting = %#v, want [] (nothing waits)", got.Waiting)
	}
	if got.Memory, got.Holds, got.Waiting = nil, nil, nil; !reflect.DeepEqual(got, want) {
		t.Errorf("stats = %+v\nwant    %+v", got, want)
	}
}

// TestCLIHealthWarnsOnEviction: a Redis whose maxmemory-policy may evict
// keys passes the health check with a warning that names the policy, what
// it may evict (under volatile-* only keys with a TTL, never the stream:
// docs/operations.md#redis-memory) and the fix; the exit code stays 0.
func TestCLIHealthWarnsOnEviction(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	ready := redistest.Name(t, "events")
	if err := redisstream.New(rc, ready, "workers", "test").EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	for policy, mayEvict := range map[string]string{
		"allkeys-lru":  "the stream, pending messages' invocation state and dedup keys",
		"volatile-lru": "retained invocation state and dedup keys (keys with a TTL)",
	} {
		if err := rc.Do(t.Context(), rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", policy).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		r := relayCLI(t, "", "health", "--redis-uri", srv.Addr, "--stream", ready, "--group", "workers", "--runner", "process", "--json")
		var got healthJSON
		if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK || !got.Healthy {
			t.Fatalf("%s: exit %d, %v\nstdout:\n%s\nstderr:\n%s", policy, r.code, err, r.stdout, r.stderr)
		}
		mem := got.Checks[2]
		want := srv.Addr + " has maxmemory-policy " + policy + ": Redis may evict " + mayEvict + "; set maxmemory-policy noeviction"
		if mem.Name != "redis memory" || !mem.OK || !mem.Warning || mem.Detail != want {
			t.Errorf("memory check = %+v, want a warning %q", mem, want)
		}
	}
}

// TestCLIStatsMemory: relay stats shows the stream's Redis memory by part
// and its projection at the current rate, and relay health fails when the
// projection exceeds 90% of maxmemory (docs/operations.md#redis-memory).
func TestCLIStatsMemory(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	ctx := t.Context()
	if err := rc.Do(ctx, rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "100000000").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	const name = "orders"
	if err := redisstream.New(rc, name, "workers", "c").EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	// 60 entries in the last 30 s: 1 per second over the 60 s window.
	now := time.Now()
	for i := range 60 {
		id := fmt.Sprintf("%d-0", now.Add(-30*time.Second+time.Duration(i)*500*time.Millisecond).UnixMilli())
		if err := rc.Do(ctx, rc.B().Xadd().Key(name).Id(id).FieldValue().FieldValue("event", `{"kind":"order","pad":"`+strings.Repeat("x", 200)+`"}`).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	base := []string{"--redis-uri", srv.Addr, "--stream", name, "--group", "workers"}
	r := relayCLI(t, "", append([]string{"stats", "--json"}, base...)...)
	var got statsJSON
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil || r.code != exitOK || got.Memory == nil {
		t.Fatalf("exit %d, %v: %s %s", r.code, err, r.stdout, r.stderr)
	}
	m := got.Memory
	if m.Stream.Items != 60 || m.Stream.PerItem < 200 || m.EventsPerSecond != 1 || m.MaxBytes != 100000000 || m.OverBudget {
		t.Errorf("memory %+v: want 60 entries of > 200 bytes at 1/s, maxmemory 100 MB, within budget", m)
	}
	// At 1 event/s a day of entries is about 20 MB; a year is far over.
	if want := int64(86400 * m.Stream.PerItem); m.Stream.Projected < want*9/10 || m.Stream.Projected > want*11/10 {
		t.Errorf("stream projected %d, want about %d (a day at 1/s)", m.Stream.Projected, want)
	}
	year := append([]string{"--stream-retention", "8760h"}, base...)
	r = relayCLI(t, "", append([]string{"stats"}, year...)...)
	if r.code != exitOK || !strings.Contains(r.stdout, "OVER BUDGET: projected peak") || !strings.Contains(r.stdout, "source stream") {
		t.Errorf("stats with a year's retention: exit %d\n%s", r.code, r.stdout)
	}
	r = relayCLI(t, "", append([]string{"health", "--runner", "process"}, year...)...)
	if r.code != exitFailure || !strings.Contains(r.stderr, "unhealthy: memory budget") {
		t.Errorf("health with a year's retention: exit %d, stderr %q; want 1 naming the memory budget\n%s", r.code, r.stderr, r.stdout)
	}
	// The failure says which part to change, and how, as a worker's
	// warning does.
	if !strings.Contains(r.stdout, "most of it is the source stream: lower REDIS_STREAM_RETENTION") {
		t.Errorf("health with a year's retention does not name the stream and its retention:\n%s", r.stdout)
	}
	r = relayCLI(t, "", append([]string{"health", "--runner", "process"}, base...)...)
	if r.code != exitOK {
		t.Errorf("health with a day's retention: exit %d\n%s%s", r.code, r.stdout, r.stderr)
	}
	r = relayCLI(t, "", append([]string{"stats", "--stream-retention", "0"}, base...)...)
	if !strings.Contains(r.stdout, "OVER BUDGET: the stream (REDIS_STREAM_RETENTION 0 keeps every entry) grows without bound") {
		t.Errorf("stats with no stream retention:\n%s", r.stdout)
	}
}

// TestCLIHealthAtMaxmemory: a Redis at maxmemory refuses the producers'
// XADD, so a minute later the event rate, and the projection with it, is
// 0. relay health must still fail its memory budget check then, saying
// that Redis is at maxmemory now (docs/operations.md#memory-budget).
func TestCLIHealthAtMaxmemory(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	ctx := t.Context()
	const name = "orders"
	if err := redisstream.New(rc, name, "workers", "c").EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	// 500 entries of 2 KB, all older than the rate's one-minute window.
	old := time.Now().Add(-5 * time.Minute)
	cmds := make(rueidis.Commands, 0, 500)
	for i := range 500 {
		cmds = append(cmds, rc.B().Xadd().Key(name).Id(fmt.Sprintf("%d-%d", old.UnixMilli(), i+1)).FieldValue().
			FieldValue("event", `{"kind":"order","pad":"`+strings.Repeat("x", 2000)+`"}`).Build())
	}
	for _, r := range rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	info, err := rc.Do(ctx, rc.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	used := regexp.MustCompile(`(?m)^used_memory:(\d+)`).FindStringSubmatch(info)
	n, _ := strconv.ParseInt(used[1], 10, 64)
	if err := rc.Do(ctx, rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", strconv.FormatInt(n-20000, 10)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Do(ctx, rc.B().Xadd().Key(name).Id("*").FieldValue().FieldValue("event", `{}`).Build()).Error(); err == nil || !strings.Contains(err.Error(), "OOM") {
		t.Fatalf("XADD on the full Redis: %v, want OOM", err)
	}
	base := []string{"--redis-uri", srv.Addr, "--stream", name, "--group", "workers"}
	r := relayCLI(t, "", append([]string{"health", "--runner", "process"}, base...)...)
	if r.code != exitFailure || !strings.Contains(r.stderr, "unhealthy: memory budget") ||
		!regexp.MustCompile(`memory budget +FAIL +OVER BUDGET now: .* at maxmemory`).MatchString(r.stdout) {
		t.Errorf("health on a Redis at maxmemory: exit %d, want 1 naming it at maxmemory:\n%s%s", r.code, r.stdout, r.stderr)
	}
}

// TestCLIHealthRedisNotAnswering: a Redis that accepts connections and
// never answers (a paused server, a black hole) is tried once: the redis
// check fails naming it, and the checks that read Redis are skipped
// rather than each dialling it and waiting out its own timeout.
func TestCLIHealthRedisNotAnswering(t *testing.T) {
	isolateEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var accepted atomic.Int32
	var held sync.WaitGroup
	stop := make(chan struct{})
	t.Cleanup(func() { close(stop); ln.Close(); held.Wait() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			held.Go(func() { <-stop; conn.Close() }) // read nothing, answer nothing
		}
	}()
	r := relayCLI(t, "", "health", "--runner", "process", "--redis-uri", ln.Addr().String(), "--stream", "orders", "--group", "workers")
	if r.code != exitFailure || !regexp.MustCompile(`(?m)^redis +FAIL`).MatchString(r.stdout) {
		t.Fatalf("health with a Redis that does not answer: exit %d, want 1 with the redis check failing:\n%s%s", r.code, r.stdout, r.stderr)
	}
	for _, check := range []string{"redis access", "redis memory", "memory budget", "held messages"} {
		if !regexp.MustCompile(`(?m)^` + check + ` +skipped +not checked: Redis is unreachable \(see the redis check\)`).MatchString(r.stdout) {
			t.Errorf("check %s is not skipped for the unreachable Redis:\n%s", check, r.stdout)
		}
	}
	if n := accepted.Load(); n > 2 {
		t.Errorf("health opened %d connections to a Redis that does not answer, want one client for every check", n)
	}
}
