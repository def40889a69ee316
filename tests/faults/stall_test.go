package faults_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

// stallDuration is how long TestContainerdStallSoak stalls containerd:
// RELAY_SOAK_CONTAINERD_STALL (make soak: 60s), else 5s.
func stallDuration(t *testing.T) time.Duration {
	v := os.Getenv("RELAY_SOAK_CONTAINERD_STALL")
	if v == "" {
		return 5 * time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("RELAY_SOAK_CONTAINERD_STALL=%q: %v", v, err)
	}
	return d
}

// TestContainerdStallSoak stalls a private containerd (SIGSTOP) while two
// worker processes run busybox handlers through it and events keep coming,
// then continues it (docs/operations.md "Faults"). Invocations started
// before or during the stall wait for containerd; the rest wait for a
// concurrency slot and stay pending. Once containerd answers again every
// message is processed as docs/delivery.md promises (the ledger), within
// a minute, and no container, task or snapshot is left once the workers'
// sweeps ran. How long the handlers waited and how long the work took to
// resume are logged.
func TestContainerdStallSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	stall := stallDuration(t)
	daemon := containerdtest.Private(t)
	cc := containerdtest.Client(t)
	ns := cc.DefaultNamespace()
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "stall")
	src := redisstream.New(rc, streamName, soakGroup, "publisher")
	ctx := context.Background()
	if err := src.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	s := newSoak(t, envRedis+"="+redistest.Addr(t), envStream+"="+streamName,
		envApps+"="+writeSoakApp(t, containerdApp, containerdHandler),
		envRunner+"=containerd", envSocket+"="+daemon.Socket, envNamespace+"="+ns, envHelper+"="+buildExecHelper(t))
	names := []string{"c1", "c2"}
	s.startWorkers(names...)

	const events = 60
	published := map[string]event{}
	var newest string
	var stalled, resumed time.Time
	for i := range events {
		if i == events/3 {
			daemon.Pause()
			stalled = time.Now()
		}
		if !stalled.IsZero() && resumed.IsZero() && time.Since(stalled) >= stall {
			daemon.Resume()
			resumed = time.Now()
		}
		ev := event{kind: "ok"}
		switch i % 5 {
		case 1:
			ev = event{kind: "flaky", fail: 1}
		case 2:
			ev.kind = "bad"
		}
		newest = publish(t, rc, src, fmt.Sprintf(`{"kind":%q,"fail":%d,"n":%d}`, ev.kind, ev.fail, i))
		published[newest] = ev
		// Spread over the stall, whatever its length.
		time.Sleep(max(100*time.Millisecond, stall/events))
	}
	if resumed.IsZero() {
		time.Sleep(time.Until(stalled.Add(stall)))
		daemon.Resume()
		resumed = time.Now()
	}
	waitQuiet(t, rc, src, newest, 5*time.Minute)
	t.Logf("containerd stalled %v; every message acknowledged %v after it answered again", stall, time.Since(resumed).Round(100*time.Millisecond))

	nsCtx := namespaces.WithNamespace(ctx, ns)
	var left []string
	testutil.WaitFor(t, 30*time.Second, "the workers' sweeps removing every leftover", func() bool {
		left = containerdtest.Leftovers(nsCtx, cc)
		for _, tk := range tasksIn(nsCtx, t, cc) {
			left = append(left, tk.String())
		}
		return len(left) == 0
	})
	s.stopAll()
	s.checkCrashes()
	f := checkLedger(t, ledgerInput{
		rc: rc, stream: streamName, rules: containerdRules, events: published, deleted: map[string]bool{},
		// Attempts in flight when containerd stalled may outlive their
		// lease and be counted lost when another worker takes over.
		attemptBudget: len(names) * containerdConcurrency * 2,
		rerunBudget:   len(names) * containerdConcurrency,
	})
	f.leftContainers, f.leftSnapshots, f.leftTasks = 0, 0, 0
	for _, l := range left {
		switch {
		case strings.HasPrefix(l, "container "):
			f.leftContainers++
		case strings.HasPrefix(l, "snapshot "):
			f.leftSnapshots++
		default:
			f.leftTasks++
		}
	}
	logFigures(t, fmt.Sprintf("%s: ledger (containerd stalled %v)", t.Name(), stall), f, s)
	t.Logf("lines logged: %d %q, %d %q, %d %q",
		s.countLogLines("no concurrency slot within the wait"), "no concurrency slot within the wait",
		s.countLogLines("container cleanup failed"), "container cleanup failed",
		s.countLogLines("attempt lost"), "attempt lost")
}
