package faults_test

// Minimal reproductions of bugs the soaks found in engine and runner code.
// One still open is skipped naming its bug (knownBug), so that make test
// stays green until the owner of that code fixes it; FAULTS_REPRO=1 runs it
// anyway. When a fix lands the skip goes, and the test guards against the
// bug's return, as for the ones fixed already.

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// closeAtCleanup closes r when the test ends, before the containerd client
// it uses: removals a Run left to the background then finish.
func closeAtCleanup(t *testing.T, r *ctrd.Runner) {
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("close the runner: %v", err)
		}
	})
}

// knownBug skips t, naming the bug, unless FAULTS_REPRO=1.
func knownBug(t *testing.T, bug string) {
	t.Helper()
	if os.Getenv("FAULTS_REPRO") != "1" {
		t.Skip("known bug, reproduced here (FAULTS_REPRO=1 runs it): " + bug)
	}
}

// Known bugs, as the skips and the soaks' figures name them.
const (
	bugOutputTail = "runtime/containerd: the end of a handler's output is lost when the output destination is slower than the handler " +
		"(task.Delete cancels the task's IO, closing the FIFO read ends, before the copy drained them)"
)

// slowWriter stands in for a log sink that is slower than the handler.
type slowWriter struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (w *slowWriter) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}

func (w *slowWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.String()
}

// TestReproOutputTailLost: a handler writes 2,000 short lines and a last
// one, then exits. It fits the pipe, so it exits at once, long before a
// slow destination took it all; the runner then deletes the task, whose IO
// cancellation closes the FIFOs with the rest unread. Standard output is
// forwarded verbatim (docs/apps.md#the-handler-contract): the last line
// must arrive.
func TestReproOutputTailLost(t *testing.T) {
	// Fixed: the runner drains output before deleting the task (drainOutput).
	cc := containerdtest.Client(t)
	out := &slowWriter{}
	r, err := ctrd.New(cc, ctrd.WithNamespace(cc.DefaultNamespace()), ctrd.WithHostID("faults-repro-"+randomID()),
		ctrd.WithOutput(out, out), ctrd.WithPreparedContainers(0))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, r)
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	req := runtime.Request{
		App: "repro", Handler: "tail.run", MessageID: "1-0", Attempt: 1, Event: []byte(`{}`), Timeout: time.Minute,
		Spec: runtime.Spec{Dir: dir, Image: containerdtest.Image, Command: []string{"/bin/sh", "-c",
			`i=0; while [ $i -lt 2000 ]; do echo "line $i"; i=$((i+1)); done; echo LAST`}},
	}
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	got := out.String()
	if !strings.HasSuffix(got, "[repro/tail.run] LAST\n") {
		t.Errorf("forwarded %d of 2001 lines; the last ones were lost: ...%s", strings.Count(got, "\n"), got[max(0, len(got)-120):])
	}
}

// reproApp is one app with one rule that never succeeds.
const reproApp = `
image: unused
concurrency: 1
events:
  - {handler: bad.run, pattern: {kind: [bad]}, timeout: 1s, retries: 0}
  - {handler: slow.run, pattern: {kind: [slow]}, timeout: 30s, retries: 0}
`

func reproApps(t *testing.T) *app.Set {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "repro"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "repro", app.TemplateFile), []byte(reproApp), 0o644); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

// TestReproReclaimedMessageNotHeartbeated guards a bug the containerd soak
// found, since fixed: a worker whose message slots were all taken
// reclaimed an idle entry (XAUTOCLAIM makes it the owner and resets the
// idle time) and then waited for a slot before handling it. While it
// waited, the entry was not in flight, so the heartbeat skipped it and its
// idle time passed MinPendingIdle: another worker reclaimed it and
// delivered it a second time while this one still held it.
// docs/delivery.md#concurrency-and-heartbeat: other workers must not
// reclaim live work. Either fix passes: a busy worker leaves the entry in
// the PEL for others (bounded reclaim), or it heartbeats what it holds;
// what may not happen is that the worker owns the entry and lets it go
// idle. Once the worker has room, it handles the entry.
func TestReproReclaimedMessageNotHeartbeated(t *testing.T) {
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "repro")
	ctx := context.Background()
	src := redisstream.New(rc, streamName, soakGroup, "w", redisstream.WithBlock(100*time.Millisecond))
	if err := src.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	slow := func(ctx context.Context, _ runtime.Request) error {
		select {
		case <-release:
		case <-ctx.Done():
		}
		return nil
	}
	const minIdle = 300 * time.Millisecond
	e, err := relay.NewEngine(reproApps(t), relay.Components{
		Source: src, State: redisstate.New(rc), Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"repro/slow.run": slow}),
		Stream: streamName, Group: soakGroup, Consumer: "w",
	}, relay.Config{MaxConcurrency: 1, MinPendingIdle: minIdle, ReclaimInterval: 50 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond, ConcurrencyWait: 30 * time.Second, ShutdownTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	// An entry another consumer took and never handled.
	ghost, err := ghostReadScript.Exec(ctx, rc, []string{streamName}, []string{`{"kind":"slow"}`, soakGroup, "ghost", "1"}).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	held := ghost[1]
	// Two slow messages fill the worker's two message slots (twice its
	// concurrency of 1): one runs, one waits for the app's slot.
	for range 2 {
		if _, err := src.Publish(ctx, map[string]string{"event": `{"kind":"slow"}`}); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = e.Run(runCtx) }()
	defer func() { stop(); <-done }()

	// pending reports the entry's owner and idle time, ok false once it
	// left the PEL.
	pending := func() (owner string, idle time.Duration, ok bool) {
		rows, err := rc.Do(ctx, rc.B().Xpending().Key(streamName).Group(soakGroup).Start(held).End(held).Count(1).Build()).ToArray()
		if err != nil || len(rows) != 1 {
			return "", 0, false
		}
		f, _ := rows[0].ToArray()
		owner, _ = f[1].ToString()
		ms, _ := f[2].AsInt64()
		return owner, time.Duration(ms) * time.Millisecond, true
	}
	// While its slots are full, the worker must not hold the entry idle.
	deadline := time.Now().Add(5 * minIdle)
	for time.Now().Before(deadline) {
		if owner, idle, ok := pending(); ok && owner == "w" && idle > minIdle {
			t.Fatalf("entry %s, owned by the live worker w, has been idle %s > MinPendingIdle %s: another worker would reclaim and deliver it again",
				held, idle, minIdle)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// Room again: the worker reclaims and handles it.
	close(release)
	testutil.WaitFor(t, 30*time.Second, "the idle entry handled and acknowledged", func() bool {
		_, _, ok := pending()
		return !ok
	})
}

// onceSource delivers one message through Read, once, and nothing else;
// two Engines each with one deliver the same message at the same time, as
// overlapping deliveries do (TestReproReclaimedMessageNotHeartbeated showed
// one way; a duplicate consumer name or a worker paused past
// MinPendingIdle are others).
type onceSource struct {
	*redisstream.Source
	msg  stream.Message
	sent atomic.Bool
}

func (s *onceSource) Read(ctx context.Context, _ int) ([]stream.Message, error) {
	if !s.sent.Swap(true) {
		return []stream.Message{s.msg}, nil
	}
	select {
	case <-ctx.Done():
	case <-time.After(50 * time.Millisecond):
	}
	return nil, nil
}

func (s *onceSource) Reclaim(context.Context, time.Duration, int) ([]stream.Message, []string, bool, error) {
	return nil, nil, true, nil
}

// barrierState holds each settlement that writes a dead-letter entry
// until two arrived or a few seconds passed, so that two deliveries that
// both decided to write are sure to overlap.
type barrierState struct {
	relay.StateStore
	arrived chan struct{}
}

func (b *barrierState) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	for _, st := range ss {
		for _, t := range st.Transitions {
			if t.Entry == nil {
				continue
			}
			b.arrived <- struct{}{}
			deadline := time.After(3 * time.Second)
			for len(b.arrived) < 2 {
				select {
				case <-deadline:
					return b.StateStore.Settle(ctx, ss)
				case <-time.After(5 * time.Millisecond):
				}
			}
			return b.StateStore.Settle(ctx, ss)
		}
	}
	return b.StateStore.Settle(ctx, ss)
}

// TestReproDuplicateDLQFromOverlappingDeliveries guards a bug the
// containerd soak found, since fixed (the settlement writes the entry in
// one step with its marker, fenced on the exhausted attempt's token): an
// invocation's last attempt ended without an outcome (its
// worker died; the lease expired) and two deliveries of its message ran at
// once. Each Claim reported it Exhausted without a DLQ marker, so each
// wrote a DLQ entry: two entries for one exhausted invocation, without any
// crash in the DLQ-write→marker window.
func TestReproDuplicateDLQFromOverlappingDeliveries(t *testing.T) {
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "repro")
	ctx := context.Background()
	pub := redisstream.New(rc, streamName, soakGroup, "w")
	if err := pub.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	event := `{"kind":"bad"}`
	id, err := pub.Publish(ctx, map[string]string{"event": event})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Read(ctx, 1); err != nil { // pending, as for a delivery
		t.Fatal(err)
	}
	// Its only attempt was claimed by a worker that then died: the lease
	// expires at once.
	key := invocation.Key{Stream: streamName, Group: soakGroup, MessageID: id}
	if r := redisstate.New(rc).Claim(ctx, []invocation.ClaimRequest{{Key: key, Field: "repro/bad.run", Lease: time.Millisecond, MaxAttempts: 1}}); r[0].Err != nil || r[0].Status != invocation.Claimed {
		t.Fatalf("seed claim: %+v", r[0])
	}
	time.Sleep(10 * time.Millisecond)

	apps := reproApps(t)
	arrived := make(chan struct{}, 2)
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, consumer := range []string{"a", "b"} {
		src := &onceSource{Source: redisstream.New(rc, streamName, soakGroup, consumer), msg: stream.Message{ID: id, Fields: map[string]string{"event": event}}}
		e, err := relay.NewEngine(apps, relay.Components{
			Source: src, State: &barrierState{StateStore: redisstate.New(rc), arrived: arrived}, Runner: runtime.NewFunc(nil),
			Stream: streamName, Group: soakGroup, Consumer: consumer,
		}, relay.Config{ShutdownTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() { _ = e.Run(runCtx) })
	}
	store := redisdlq.NewStore(rc, streamName)
	testutil.WaitFor(t, 10*time.Second, "a DLQ entry", func() bool { n, _ := store.Len(ctx); return n >= 1 })
	time.Sleep(3500 * time.Millisecond) // past the barrier's wait: a second writer would have written
	stop()
	wg.Wait()
	entries, err := store.List(ctx, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		var b strings.Builder
		for _, e := range entries {
			fmt.Fprintf(&b, "\n  by %s: %s", e.Consumer, e.Reason)
		}
		t.Errorf("%d DLQ entries for one exhausted invocation, want 1:%s", len(entries), b.String())
	}
}

// TestReproSweepOrphansTask: a worker dies while containerd creates the
// task of its container; its replacement (same host id) sweeps at start.
// Sweep finds the container without a task yet, deletes it, and the task
// containerd then finishes creating has no container: Sweep, which lists
// containers and snapshots, never removes it, and its shim and runc init
// stay. Every container, task and snapshot Relay creates is removed, and
// leftovers are swept (docs/operations.md#containerd).
func TestReproSweepOrphansTask(t *testing.T) {
	// Fixed: Sweep ends the shim, and with it the task, of a container
	// that is gone (sweepShims).
	cc := containerdtest.Client(t)
	ctx := t.Context()
	ns := cc.DefaultNamespace()
	host := "faults-repro-" + randomID()
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	sweeper, err := ctrd.New(cc, ctrd.WithNamespace(ns), ctrd.WithHostID(host), ctrd.WithPreparedContainers(0))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, sweeper)
	nsCtx := namespaces.WithNamespace(ctx, ns)
	var orphans []string
	t.Cleanup(func() {
		// Remove what the bug leaves, task and shim, so that neither
		// outlives the test.
		cctx := namespaces.WithNamespace(context.Background(), ns)
		for _, id := range orphans {
			removeTask(cctx, cc, id)
		}
		killPIDs(shimPIDs(os.Getenv(containerdtest.EnvAddress), ns))
	})
	// The dying worker's runner: it creates containers and their tasks
	// while the sweeper, which shares its host id as a replacement would,
	// sweeps again and again, as at a restart racing a task's creation.
	r, err := ctrd.New(cc, ctrd.WithNamespace(ns), ctrd.WithHostID(host), ctrd.WithOutput(io.Discard, io.Discard),
		ctrd.WithPreparedContainers(0))
	if err != nil {
		t.Fatal(err)
	}
	closeAtCleanup(t, r)
	stop := make(chan struct{})
	var sweeps sync.WaitGroup
	sweeps.Go(func() {
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = sweeper.Sweep(ctx)
		}
	})
	// orphanTasks lists the namespace's tasks whose container is gone.
	orphanTasks := func() []string {
		resp, err := cc.TaskService().List(nsCtx, &tasks.ListTasksRequest{})
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, tk := range resp.Tasks {
			if _, err := cc.LoadContainer(nsCtx, tk.ID); err != nil {
				ids = append(ids, tk.ID)
			}
		}
		return ids
	}
	for try := 0; try < 200 && len(orphans) == 0; try++ {
		req := runtime.Request{App: "repro", Handler: "orphan.run", MessageID: "1-0", Attempt: 1, Event: []byte(`{}`), Timeout: 10 * time.Second,
			Spec: runtime.Spec{Dir: dir, Image: containerdtest.Image, Command: []string{"/bin/true"}}}
		_, _ = r.Run(ctx, req)
		orphans = orphanTasks()
	}
	close(stop)
	sweeps.Wait()
	_ = sweeper.Sweep(ctx)
	if len(orphans) > 0 {
		// Give Sweep its chance: whatever it leaves now stays for good.
		orphans = orphanTasks()
	}
	if len(orphans) > 0 {
		t.Errorf("tasks left without their container after Sweep: %v", orphans)
	}
}
