package main

import (
	"cmp"
	"context"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alecthomas/kong"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
)

// docs/operations.md#configuration: retry backoff, MinPendingIdle and the
// reclaim cadence are fixed in the binary, and so is exhaustion (a rule's
// retries come from its template only). No command reads an environment
// variable, or takes a flag, that sets them.
func TestRetryAndReclaimTimingsAreNotConfigurable(t *testing.T) {
	parser, err := kong.New(&CLI{})
	if err != nil {
		t.Fatal(err)
	}
	internal := regexp.MustCompile(`(?i)retr|backoff|attempt|reclaim|pending.?idle|heartbeat|lease|exhaust`)
	var names []string
	var walk func(n *kong.Node)
	walk = func(n *kong.Node) {
		for _, f := range n.Flags {
			for _, env := range f.Envs {
				names = append(names, n.Path()+": env "+env)
			}
			names = append(names, n.Path()+": flag --"+f.Name)
		}
		for _, c := range n.Children {
			walk(c)
		}
	}
	walk(parser.Model.Node)
	if len(names) < 10 {
		t.Fatalf("found only %v; the walk misses the CLI's flags", names)
	}
	for _, name := range names {
		if internal.MatchString(name) {
			t.Errorf("%s sets what docs/operations.md#configuration fixes", name)
		}
	}
}

// TestStartRefusesSubMillisecondInvocationRetention: invocation state's
// TTL is set in milliseconds, so a REDIS_INVOCATION_RETENTION above 0 and
// under 1ms is a usage error at start, before Redis is dialled, rather than
// a worker whose every acknowledgement and dead-letter write fails after
// its handler ran (the messages then stay pending and run again).
func TestStartRefusesSubMillisecondInvocationRetention(t *testing.T) {
	isolateRedisEnv(t)
	t.Setenv("REDIS_URI", "127.0.0.1:1") // never dialled
	t.Setenv("REDIS_STREAM", "events")
	t.Setenv("REDIS_GROUP", "relay")
	for _, v := range []string{"1ns", "500us", "-1s"} {
		r := relayCLI(t, "", "start", "--runner", "process", "--state-dir", t.TempDir(), "--invocation-retention="+v)
		if r.code != exitUsage || !strings.Contains(r.stderr, "REDIS_INVOCATION_RETENTION must be 0 (delete with the ack) or at least 1ms") {
			t.Errorf("relay start --invocation-retention=%s: exit %d, want %d naming the setting:\n%s", v, r.code, exitUsage, r.stderr)
		}
	}
}

// TestStartInvocationRetention: relay start keeps an acknowledged
// message's invocation state for REDIS_INVOCATION_RETENTION, 48h when it
// is unset, as a retained hash with a TTL; with 0 the hash is gone once
// the message has left the PEL (docs/delivery.md#invocation-state).
func TestStartInvocationRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker")
	}
	for _, setting := range []string{"", "0", "90m"} {
		t.Run("REDIS_INVOCATION_RETENTION="+cmp.Or(setting, "unset"), func(t *testing.T) {
			isolateRedisEnv(t)
			t.Setenv("REDIS_INVOCATION_RETENTION", setting)
			want := 90 * time.Minute
			switch setting {
			case "":
				os.Unsetenv("REDIS_INVOCATION_RETENTION")
				want = 48 * time.Hour
			case "0":
				want = 0
			}
			rc := redistest.Client(t)
			name := redistest.Name(t, "events")
			t.Setenv("REDIS_URI", redistest.Addr(t))
			t.Setenv("REDIS_STREAM", name)
			t.Setenv("REDIS_GROUP", "relay")
			t.Setenv("RELAY_APPS", cliApps(t))
			stdout, stderr := startInBackground(t)
			ctx := t.Context()
			testutil.WaitFor(t, 30*time.Second, "worker started", func() bool { return strings.Contains(stderr.String(), "worker started") })
			id, err := rc.Do(ctx, rc.B().Xadd().Key(name).Id("*").FieldValue().FieldValue("event", `{"kind":"refund"}`).Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}
			testutil.WaitFor(t, 30*time.Second, "the message handled and acknowledged", func() bool {
				p, err := rc.Do(ctx, rc.B().Xpending().Key(name).Group("relay").Start(id).End(id).Count(1).Build()).ToArray()
				return err == nil && len(p) == 0 && strings.Contains(stdout.String(), "[shop/refunds.run] refunded")
			})
			key := keys.Invocation(name, "relay", id)
			pttl, err := rc.Do(ctx, rc.B().Pttl().Key(key).Build()).AsInt64()
			if err != nil {
				t.Fatal(err)
			}
			terminal, err := rc.Do(ctx, rc.B().Hexists().Key(key).Field("__terminal").Build()).AsBool()
			if err != nil {
				t.Fatal(err)
			}
			if want == 0 {
				if pttl != -2 {
					t.Errorf("state of the acknowledged message has PTTL %dms, want it deleted with the ack", pttl)
				}
				return
			}
			if !terminal || pttl <= (want-time.Minute).Milliseconds() || pttl > want.Milliseconds() {
				t.Errorf("state of the acknowledged message: retained %v, PTTL %dms; want retained for %s", terminal, pttl, want)
			}
		})
	}
}

// TestStartWaitsForALateRedis: relay start begun before its Redis waits
// for it, saying so once, and starts when it answers; with a shorter
// --startup-wait it exits 1 naming the wait and the refusal
// (docs/operations.md#starting-before-redis).
func TestStartWaitsForALateRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a worker")
	}
	isolateRedisEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	srv.Stop()
	t.Setenv("REDIS_URI", srv.Addr)
	t.Setenv("REDIS_STREAM", "events")
	t.Setenv("REDIS_GROUP", "relay")
	t.Setenv("RELAY_APPS", cliApps(t))

	r := relayCLI(t, "", "start", "--runner", "process", "--state-dir", t.TempDir(), "--startup-wait", "1s")
	if r.code != exitFailure || !strings.Contains(r.stderr, "relay: worker: Redis did not answer within the start-up wait of 1s") ||
		!strings.Contains(r.stderr, "connection refused") || strings.Count(r.stderr, "Redis does not answer yet") != 1 {
		t.Errorf("relay start --startup-wait 1s on a stopped Redis: exit %d\n%s", r.code, r.stderr)
	}

	_, stderr := startInBackground(t)
	testutil.WaitFor(t, 30*time.Second, "relay start to wait for Redis", func() bool {
		return strings.Contains(stderr.String(), "Redis does not answer yet; waiting for it")
	})
	if err := srv.TryRestart(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "worker started", func() bool { return strings.Contains(stderr.String(), "worker started") })
}

// startInBackground runs relay start with the process runner as consumer
// w1 until the test ends, and returns its output.
func startInBackground(t *testing.T) (stdout, stderr *testutil.Buffer) {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	stdout, stderr = &testutil.Buffer{}, &testutil.Buffer{}
	exit := make(chan int, 1)
	go func() {
		exit <- run(ctx, []string{"start", "--runner", "process", "--state-dir", t.TempDir(), "--consumer", "w1"}, stdout, stderr)
	}()
	t.Cleanup(func() {
		stop()
		<-exit
		if t.Failed() {
			t.Logf("stderr:\n%s", stderr)
		}
	})
	return stdout, stderr
}
