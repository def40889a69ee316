package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	taskapi "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/redistest"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// containerdConcurrency is each containerd worker's MAX_CONCURRENCY: three
// workers then run up to twelve containers on a two-core machine.
const containerdConcurrency = 4

// containerdApp runs /app/handler.sh (containerdHandler) in the test image.
const containerdApp = `
image: ` + containerdtest.Image + `
command: ["/bin/sh", "/app/handler.sh"]
concurrency: 4
events:
  - {handler: ok.run, pattern: {kind: [ok]}, timeout: 5s, retries: 4}
  - {handler: flaky.run, pattern: {kind: [flaky]}, timeout: 5s, retries: 3}
  - {handler: bad.run, pattern: {kind: [bad]}, timeout: 5s, retries: 1}
  - {handler: hang.run, pattern: {kind: [hang]}, timeout: 1s, retries: 3}
  - {handler: stuck.run, pattern: {kind: [stuck]}, timeout: 1s, retries: 0}
  - {handler: big.run, pattern: {kind: [big]}, timeout: 10s, retries: 4}
`

// containerdHandler is every handler of containerdApp. Each run first
// prints a start marker, which the worker's output writer records.
const containerdHandler = `#!/bin/sh
echo "FAULTS-START $RELAY_MESSAGE_ID $RELAY_ATTEMPT"
event=$(cat)
case "$RELAY_HANDLER" in
ok.run) exit 0 ;;
flaky.run)
	fail=$(echo "$event" | sed -n 's/.*"fail":\([0-9]*\).*/\1/p')
	if [ "$RELAY_ATTEMPT" -le "${fail:-0}" ]; then
		echo "planned failure $RELAY_ATTEMPT of $fail" >&2
		exit 1
	fi
	exit 0 ;;
bad.run)
	echo "always fails" >&2
	exit 3 ;;
hang.run)
	# Past the 1s timeout on the first attempt only.
	if [ "$RELAY_ATTEMPT" -le 1 ]; then sleep 60; fi
	exit 0 ;;
stuck.run)
	sleep 60 ;;
big.run)
	# About 3 MB on stdout, then the end marker.
	line=xxxxxxxxxx
	for i in 1 2 3 4 5 6 7; do line=$line$line; done
	yes "$line" | head -n 2500
	echo "FAULTS-END $RELAY_MESSAGE_ID $RELAY_ATTEMPT"
	exit 0 ;;
*)
	echo "unknown handler $RELAY_HANDLER" >&2
	exit 2 ;;
esac
`

// containerdRules are the containerd soak's expectations, matching
// containerdApp and containerdHandler.
var containerdRules = map[string]rule{
	"ok":    {handler: "ok.run", attempts: 5},
	"flaky": {handler: "flaky.run", attempts: 4},
	"bad":   {handler: "bad.run", attempts: 2, alwaysFails: true, reason: "handler exited with code 3: always fails"},
	"hang":  {handler: "hang.run", attempts: 4},
	"stuck": {handler: "stuck.run", attempts: 1, alwaysFails: true, reason: "timed out"},
	"big":   {handler: "big.run", attempts: 5, endMarker: true},
}

// TestContainerdSoak runs three worker processes with the real containerd
// runner against a private containerd, publishes a few hundred events whose
// busybox handlers succeed, fail a few times, always fail, hang past their
// timeout or write megabytes to stdout, and meanwhile SIGKILLs workers
// (preferably while they run containers), restarts containerd (twice for
// 300 events) and deletes pending entries. The ledger check then holds
// Redis to docs/delivery.md, and no container, task or snapshot may be left once
// the workers' sweeps ran. No shim may outlive its task either: the shims
// of the namespace are counted before the events and after the soak
// quiesced, and one left idle fails the test, also one containerd forgot
// while it was restarting.
func TestContainerdSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	shared := os.Getenv(containerdtest.EnvAddress)
	if os.Geteuid() != 0 || shared == "" {
		msg := "needs root and a containerd setup (CONTAINERD_ADDRESS, see internal/containerdtest); it runs a private daemon of its own"
		if os.Getenv(containerdtest.EnvRequire) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	if os.Getenv(containerdtest.EnvImageArchive) == "" {
		t.Setenv(containerdtest.EnvImageArchive, exportTestImage(t, shared))
	}
	// A private daemon, so that restarting it disturbs no other test.
	daemon := containerdtest.Private(t)
	socket := daemon.Socket
	var ns string
	// Runs after containerdtest's cleanup deleted the namespace: a shim
	// still serving it is a leak, stopped here so it does not outlive
	// the test (the daemon's stop leaves shims running by design).
	t.Cleanup(func() {
		if pids := shimPIDs(socket, ns); len(pids) > 0 {
			t.Logf("killing %d idle shims left in namespace %s: %v", len(pids), ns, pids)
			killPIDs(pids)
		}
	})
	cc := containerdtest.Client(t)
	ns = cc.DefaultNamespace()

	rc := redistest.Client(t)
	streamName := redistest.Name(t, "soak")
	appsRoot := writeSoakApp(t, containerdApp, containerdHandler)
	ctx := context.Background()
	src := redisstream.New(rc, streamName, soakGroup, "publisher")
	if err := src.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	helper := buildExecHelper(t)
	s := newSoak(t, envRedis+"="+redistest.Addr(t), envStream+"="+streamName, envApps+"="+appsRoot,
		envRunner+"=containerd", envSocket+"="+socket, envNamespace+"="+ns, envHelper+"="+helper)
	names := []string{"c1", "c2", "c3"}
	s.startWorkers(names...)

	nsCtx := namespaces.WithNamespace(ctx, ns)
	// containersOf counts the containers worker name is running.
	containersOf := func(name string) int {
		cs, err := cc.Containers(nsCtx, fmt.Sprintf("labels.%q==%q", ctrd.LabelHost, "faults/"+name))
		if err != nil {
			return 0
		}
		return len(cs)
	}
	restartTasks := 0           // handlers running when containerd went down
	var restartWindows []window // from the stop of each containerd restart to its start
	stopKills := s.faultEvery(1500*time.Millisecond, 1500*time.Millisecond, func() {
		// Kill mid-handler when some worker runs a container.
		var busy []string
		for _, n := range names {
			if containersOf(n) > 0 {
				busy = append(busy, n)
			}
		}
		victim := names[rand.IntN(len(names))]
		if len(busy) > 0 {
			victim = busy[rand.IntN(len(busy))]
			s.mu.Lock()
			s.killsMidHandler++
			s.mu.Unlock()
		}
		s.restart(victim, syscall.SIGKILL)
	})
	restartContainerd := func() {
		s.fault(func() {
			if resp, err := cc.TaskService().List(nsCtx, nil); err == nil {
				restartTasks += len(resp.Tasks)
			}
			from := time.Now()
			daemon.Stop()
			time.Sleep(300 * time.Millisecond) // down long enough for calls to fail
			daemon.Start()
			s.mu.Lock()
			s.containerdRestarts++
			restartWindows = append(restartWindows, window{from, time.Now()})
			s.mu.Unlock()
		})
	}

	shimsBefore := len(shimsOf(socket, ns))
	events := containerdEvents()
	restarts, deletions := faultCount(events, 2, 150), faultCount(events, 3, 100)
	published := map[string]event{}
	deleted := map[string]bool{}
	var newest string
	payload := func(kind string, fail, i int) string {
		return fmt.Sprintf(`{"kind":%q,"fail":%d,"n":%d}`, kind, fail, i)
	}
	for i := range events {
		if spreadAt(i, events, restarts) && s.containerdRestarts < restarts {
			restartContainerd()
		}
		if spreadAt(i, events, deletions) && len(deleted) < deletions {
			s.fault(func() {
				id, gone := deleteWhilePending(t, rc, streamName, payload("ok", 0, -i), len(deleted))
				published[id] = event{kind: "ok"}
				deleted[gone] = true
				if stream.CompareID(id, newest) > 0 {
					newest = id
				}
			})
		}
		ev := event{kind: "ok"}
		switch r := rand.IntN(100); {
		case r < 20:
			ev = event{kind: "flaky", fail: 1 + rand.IntN(2)}
		case r < 35:
			ev.kind = "bad"
		case r < 45:
			ev = event{kind: "hang", fail: 1}
		case r < 50:
			ev.kind = "stuck"
		case r < 65:
			ev.kind = "big"
		}
		id := publish(t, rc, src, payload(ev.kind, ev.fail, i))
		published[id] = ev
		newest = id
		time.Sleep(100 * time.Millisecond) // about 10 events a second, spread over the faults
	}
	stopKills()
	waitQuiet(t, rc, src, newest, 5*time.Minute)

	// Every container, task and shim is gone once the sweeps of the live
	// workers and the start-up sweeps of the restarted ones have run: a
	// shim outlives its task only when its container is gone too (a task
	// created after a sweep removed its container, a shim containerd
	// forgot while restarting), and sweeps end those.
	var left []string
	var tasks []taskInfo
	idle := func() []containerdtest.Shim {
		return slices.DeleteFunc(shimsOf(socket, ns), func(sh containerdtest.Shim) bool {
			return slices.ContainsFunc(tasks, func(tk taskInfo) bool { return !tk.orphan && tk.id == sh.ID })
		})
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		left, tasks = containerdtest.Leftovers(nsCtx, cc), tasksIn(nsCtx, t, cc)
		if len(left)+len(tasks) == 0 && len(idle()) <= shimsBefore || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.stopAll()
	s.checkCrashes()
	t.Logf("shims whose container was gone, ended by sweeps: %d", s.countLogLines("ending a containerd shim whose container is gone"))
	// Removed here, so that none outlives the test; any task left fails.
	var orphans, other []string
	for _, tk := range tasks {
		if tk.orphan {
			orphans = append(orphans, tk.String())
			removeTask(nsCtx, cc, tk.id)
		} else {
			other = append(other, tk.String())
		}
	}
	if len(orphans) > 0 {
		t.Errorf("tasks left without their container: %s", strings.Join(orphans, ", "))
	}
	if len(left)+len(other) > 0 {
		t.Errorf("left behind in namespace %s 30s after the soak quiesced: %s", ns, strings.Join(append(left, other...), ", "))
		for _, l := range append(left, other...) {
			s.logLinesOf(l[strings.LastIndexByte(l, ' ')+1:])
		}
	}

	s.mu.Lock()
	kills := s.kills
	s.mu.Unlock()
	f := checkLedger(t, ledgerInput{
		rc: rc, stream: streamName, rules: containerdRules, events: published, deleted: deleted,
		strandBudget:  kills,
		attemptBudget: kills*2*containerdConcurrency + restartTasks,
	})
	f.leftContainers, f.leftSnapshots, f.leftTasks, f.orphanTasks = 0, 0, len(other), len(orphans)
	for _, l := range left {
		switch {
		case strings.HasPrefix(l, "container "):
			f.leftContainers++
		case strings.HasPrefix(l, "snapshot "):
			f.leftSnapshots++
		}
	}
	var leaked []string
	for _, sh := range idle() {
		what := sh.String()
		if slices.ContainsFunc(restartWindows, func(w window) bool { return startedDuring(sh, w) }) {
			what += " (started while containerd was restarting)"
		}
		leaked = append(leaked, what)
	}
	if len(leaked) > 0 {
		t.Errorf("idle shims left without their task (%d before the soak): %s", shimsBefore, strings.Join(leaked, ", "))
		for _, sh := range idle() {
			if w := sh.Waits(); w != "" {
				t.Logf("%s: %s", sh, w)
			}
			s.logLinesOf(sh.ID)
		}
	}
	f.idleShims = len(leaked)
	logFigures(t, t.Name()+": ledger", f, s)
}

// window is a span of time.
type window struct{ from, to time.Time }

// startedDuring reports whether sh started during containerd's restart
// window w or shortly before: containerd 1.6 forgets a shim it started
// while it was stopping, which only a sweep's shim listing finds.
func startedDuring(sh containerdtest.Shim, w window) bool {
	return !sh.Started.Before(w.from.Add(-5*time.Second)) && !sh.Started.After(w.to)
}

// taskInfo is one task found in a namespace.
type taskInfo struct {
	id, status string
	orphan     bool // its container does not exist
}

func (tk taskInfo) String() string {
	if tk.orphan {
		return fmt.Sprintf("task %s (%s, no container)", tk.id, tk.status)
	}
	return fmt.Sprintf("task %s (%s)", tk.id, tk.status)
}

// tasksIn lists the tasks in ctx's namespace.
func tasksIn(ctx context.Context, t *testing.T, cc *client.Client) []taskInfo {
	resp, err := cc.TaskService().List(ctx, &taskapi.ListTasksRequest{})
	if err != nil {
		t.Errorf("list tasks: %v", err)
		return nil
	}
	var out []taskInfo
	for _, tk := range resp.Tasks {
		_, err := cc.LoadContainer(ctx, tk.ID)
		out = append(out, taskInfo{id: tk.ID, status: tk.Status.String(), orphan: errdefs.IsNotFound(err)})
	}
	return out
}

// removeTask kills and deletes task id through the task service, which
// works without its container.
func removeTask(ctx context.Context, cc *client.Client, id string) {
	_, _ = cc.TaskService().Kill(ctx, &taskapi.KillRequest{ContainerID: id, Signal: uint32(syscall.SIGKILL), All: true})
	for range 50 {
		if _, err := cc.TaskService().Delete(ctx, &taskapi.DeleteTaskRequest{ContainerID: id}); err == nil || errdefs.IsNotFound(err) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// shimPIDs returns the PIDs of the runc shims serving namespace ns of the
// containerd at socket.
func shimPIDs(socket, ns string) []int {
	var pids []int
	for _, sh := range shimsOf(socket, ns) {
		pids = append(pids, sh.PID)
	}
	return pids
}

// shimsOf returns the runc shims serving namespace ns of the containerd at
// socket.
func shimsOf(socket, ns string) []containerdtest.Shim {
	return slices.DeleteFunc(containerdtest.Shims(ns), func(sh containerdtest.Shim) bool { return sh.Address != socket })
}

func killPIDs(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

func containerdEvents() int {
	if v, err := strconv.Atoi(os.Getenv("RELAY_SOAK_CONTAINERD_EVENTS")); err == nil && v > 0 {
		return v
	}
	return 300
}

// exportTestImage writes the test image from the namespace scripts/images.sh
// imports it into, on the containerd at addr, to an archive for the private
// daemon, when make test did not say where its archive is.
func exportTestImage(t *testing.T, addr string) string {
	t.Helper()
	c, err := client.New(addr, client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatalf("containerd at %s: %v", addr, err)
	}
	defer c.Close()
	path := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx := namespaces.WithNamespace(context.Background(), "relay")
	if err := c.Export(ctx, f, archive.WithImage(c.ImageService(), containerdtest.Image)); err != nil {
		t.Fatalf("%s is unset and exporting %s from namespace relay at %s failed (run scripts/images.sh): %v",
			containerdtest.EnvImageArchive, containerdtest.Image, addr, err)
	}
	return path
}
