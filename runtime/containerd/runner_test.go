package containerd_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/image-spec/identity"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

var (
	_ relay.Runner = (*containerd.Runner)(nil)
	_ relay.Pinger = (*containerd.Runner)(nil)
)

const handlerScript = `case "$RELAY_HANDLER" in
events.created)
	echo "welcome $(cat)"
	echo "app=$RELAY_APP id=$RELAY_MESSAGE_ID attempt=$RELAY_ATTEMPT greeting=$GREETING trace=$TRACEPARENT"
	echo "oops" >&2
	printf 'no newline'
	;;
fail.exit) echo "cannot bill" >&2; exit 3 ;;
slow.sleep) sleep 30 ;;
check.sandbox)
	echo "uid=$(id -u) gid=$(id -g) groups=$(id -G) pwd=$(pwd)"
	touch /app/x 2>/dev/null && echo app-writable
	touch /x 2>/dev/null && echo rootfs-writable
	echo data >/tmp/x && echo tmp-writable
	echo "caps=$(grep CapEff /proc/self/status | tr -d '\t')"
	echo "nnp=$(grep NoNewPrivs /proc/self/status | tr -d '\t')"
	echo "netdevs=$(tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | tr '\n' ,)"
	;;
exit.now) exit 0 ;;
count.stdin) wc -c ;;
fork.many)
	i=0
	while [ $i -lt 40 ]; do sleep 5 & i=$((i+1)); done
	echo forked
	;;
*) echo "unknown handler $RELAY_HANDLER" >&2; exit 127 ;;
esac
`

type fixture struct {
	client *client.Client
	runner *containerd.Runner
	stdout bytes.Buffer
	stderr bytes.Buffer
	dir    string
}

func newFixture(t testing.TB) *fixture {
	t.Helper()
	f := &fixture{client: containerdtest.Client(t)}
	// The handler runs as nobody: the app directory must be readable by it.
	f.dir = t.TempDir()
	if err := os.Chmod(f.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(f.dir, "handler.sh"), []byte(handlerScript), 0o644); err != nil {
		t.Fatal(err)
	}
	f.runner = f.newRunner(t, "test-"+randomHex(4))
	return f
}

// newRunner returns a Runner on the fixture's namespace and output with
// host id host, then opts.
func (f *fixture) newRunner(t testing.TB, host string, opts ...containerd.Option) *containerd.Runner {
	t.Helper()
	r, err := containerd.New(f.client, append([]containerd.Option{
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID(host),
		containerd.WithOutput(syncWriter(&f.stdout), syncWriter(&f.stderr)),
		// No registry here: an absent image must fail at once (pulling is
		// tested against a local registry in pull_test.go).
		containerd.WithPull(false),
		containerd.WithStateDir(t.TempDir()),
		// Sweep tests plant task-less containers and expect them gone.
		containerd.WithTaskCreationGrace(0),
		// Tests assert that nothing is left after each Run; prepared
		// containers have tests of their own (oneshot_test.go).
		containerd.WithPreparedContainers(0),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// syncWriter makes a bytes.Buffer safe to read while containerd's copy
// goroutines may still be writing (they are done before Run returns).
func syncWriter(b *bytes.Buffer) *runtime.Output { return runtime.NewOutput(b) }

func (f *fixture) request(handler string) runtime.Request {
	return runtime.Request{
		App: "users", Handler: handler, MessageID: "1700000000000-0", Attempt: 3,
		Event:   []byte(`{"id":42}`),
		Timeout: 20 * time.Second,
		Env:     map[string]string{"TRACEPARENT": "00-t-s-01"},
		Spec: runtime.Spec{
			Dir:     f.dir,
			Image:   containerdtest.Image,
			Command: []string{"/bin/sh", "/app/handler.sh"},
			Env:     map[string]string{"GREETING": "hello"},
		},
	}
}

func (f *fixture) run(t testing.TB, req runtime.Request) (runtime.Result, error) {
	t.Helper()
	res, err := f.runner.Run(t.Context(), req)
	containerdtest.AssertClean(t, f.client)
	return res, err
}

func TestRunSuccess(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	res, err := f.run(t, f.request("events.created"))
	if err != nil {
		t.Fatalf("%v\nstderr:\n%s", err, &f.stderr)
	}
	if res.Duration <= 0 {
		t.Errorf("Duration = %v", res.Duration)
	}
	// stdin reached EOF (cat returned) and the env contract holds.
	wantOut := "[users/events.created] welcome {\"id\":42}\n" +
		"[users/events.created] app=users id=1700000000000-0 attempt=3 greeting=hello trace=00-t-s-01\n" +
		"[users/events.created] no newline\n"
	if got := f.stdout.String(); got != wantOut {
		t.Errorf("stdout:\n%s\nwant:\n%s", got, wantOut)
	}
	if got, want := f.stderr.String(), "[users/events.created] oops\n"; got != want {
		t.Errorf("stderr = %q, want %q", got, want)
	}
}

func TestRunExitCode(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	_, err := f.run(t, f.request("fail.exit"))
	ee, ok := errors.AsType[*runtime.ExitError](err)
	if !ok || ee.Code != 3 || ee.TimedOut {
		t.Fatalf("got %v, want ExitError code 3", err)
	}
	if !strings.Contains(f.stderr.String(), "[users/fail.exit] cannot bill\n") {
		t.Errorf("stderr = %q", f.stderr.String())
	}
}

func TestRunTimeout(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("slow.sleep")
	req.Timeout = 500 * time.Millisecond
	start := time.Now()
	_, err := f.run(t, req)
	ee, ok := errors.AsType[*runtime.ExitError](err)
	if !ok || !ee.TimedOut || ee.Code != 137 {
		t.Fatalf("got %v, want a timed-out ExitError with code 137", err)
	}
	if el := time.Since(start); el > 15*time.Second {
		t.Errorf("Run returned %v after a 500ms timeout", el)
	}
}

func TestRunCancelled(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(500*time.Millisecond, cancel)
	_, err := f.runner.Run(ctx, f.request("slow.sleep"))
	if _, ok := errors.AsType[*runtime.ExitError](err); ok || !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want an infrastructure error wrapping context.Canceled", err)
	}
	containerdtest.AssertClean(t, f.client)
}

func TestRunSandbox(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if _, err := f.run(t, f.request("check.sandbox")); err != nil {
		t.Fatalf("%v\n%s", err, &f.stderr)
	}
	out := f.stdout.String()
	for _, want := range []string{
		"uid=65534 gid=65534 groups=65534 pwd=/app\n",
		"tmp-writable\n",
		"caps=CapEff:0000000000000000\n",
		"nnp=NoNewPrivs:1\n",
		"netdevs=lo,\n", // a new, empty network namespace
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, bad := range []string{"app-writable", "rootfs-writable"} {
		if strings.Contains(out, bad) {
			t.Errorf("%s:\n%s", bad, out)
		}
	}

	f.stdout.Reset()
	req := f.request("check.sandbox")
	req.Spec.Network = "host"
	if _, err := f.run(t, req); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(f.stdout.String(), "netdevs=lo,\n") {
		t.Errorf("network: host still sees only lo:\n%s", &f.stdout)
	}
}

// TestRunStdin checks a large event arrives whole, and that a handler
// exiting at once without reading stdin is not an error (stdin is closed
// after the process may already have exited).
func TestRunStdin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("count.stdin")
	req.Event = bytes.Repeat([]byte("x"), 1<<20)
	if _, err := f.run(t, req); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(strings.TrimPrefix(f.stdout.String(), "[users/count.stdin] ")); got != "1048576" {
		t.Errorf("handler read %s bytes, want 1048576", got)
	}
	for range 10 {
		req := f.request("exit.now")
		req.Event = bytes.Repeat([]byte("x"), 1<<20) // more than a pipe holds
		if _, err := f.run(t, req); err != nil {
			t.Fatal(err)
		}
	}
}

func TestRunPidsLimit(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("fork.many")
	req.Spec.PIDs = 10
	_, err := f.run(t, req)
	t.Logf("err=%v\nstdout:\n%sstderr (first lines):\n%.300s", err, &f.stdout, f.stderr.String())
	// Without the limit all 40 start and the script prints "forked" and
	// exits 0. With it the shell fails to fork; its own message may not get
	// out of a fork-starved container, so only the outcome is asserted.
	if err == nil || strings.Contains(f.stdout.String(), "forked") {
		t.Errorf("40 background processes under pids=10 all started (err %v)", err)
	}
}

func TestRunCommandNotFound(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("events.created")
	req.Spec.Command = []string{"/bin/does-not-exist"}
	_, err := f.run(t, req)
	ee, ok := errors.AsType[*runtime.ExitError](err)
	if !ok || ee.Code != 127 {
		t.Fatalf("got %v, want ExitError code 127", err)
	}
	t.Log(err)
}

func TestRunUnavailable(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	tests := map[string]func(*runtime.Request){
		"missing image":        func(r *runtime.Request) { r.Spec.Image = "relay.local/missing:latest" },
		"no image":             func(r *runtime.Request) { r.Spec.Image = "" },
		"runtime image absent": func(r *runtime.Request) { r.Spec.Image, r.Spec.Runtime = "", "python3" },
		"unknown runtime":      func(r *runtime.Request) { r.Spec.Image, r.Spec.Runtime = "", "ruby" },
		"missing directory":    func(r *runtime.Request) { r.Spec.Dir = filepath.Join(f.dir, "gone") },
		"private directory": func(r *runtime.Request) {
			private := filepath.Join(t.TempDir(), "app")
			if err := os.Mkdir(private, 0o750); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(private, 0o750); err != nil {
				t.Fatal(err)
			}
			r.Spec.Dir = private
		},
	}
	for name, mutate := range tests {
		t.Run(name, func(t *testing.T) {
			req := f.request("events.created")
			mutate(&req)
			_, err := f.run(t, req)
			if !errors.Is(err, runtime.ErrUnavailable) {
				t.Fatalf("got %v, want ErrUnavailable", err)
			}
			if _, ok := errors.AsType[*runtime.ExitError](err); ok {
				t.Fatalf("got an ExitError: %v", err)
			}
			t.Log(err)
		})
	}
	req := f.request("events.created")
	req.Spec.Image = "relay.local/missing:latest"
	_, err := f.run(t, req)
	if want := "image relay.local/missing:latest: not found in containerd namespace " + f.client.DefaultNamespace() + " and pulling is off; import it (scripts/images.sh"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q lacks the operator hint %q", err, want)
	}
	req = f.request("events.created")
	req.Spec.Dir = t.TempDir()
	if err := os.Chmod(req.Spec.Dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if _, err := f.run(t, req); err == nil || !strings.Contains(err.Error(), "chmod -R o+rX") {
		t.Errorf("private app directory: error %v lacks the chmod hint", err)
	}
}

func TestRunConcurrent(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i := range 4 {
		wg.Go(func() {
			req := f.request("events.created")
			req.Event = []byte(fmt.Sprintf(`{"n":%d}`, i))
			_, err := f.runner.Run(t.Context(), req)
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	containerdtest.AssertClean(t, f.client)
	for _, l := range strings.Split(strings.TrimSuffix(f.stdout.String(), "\n"), "\n") {
		if !strings.HasPrefix(l, "[users/events.created] ") || strings.Count(l, "[users/") != 1 {
			t.Errorf("interleaved line %q", l)
		}
	}
}

// TestHostIDBound: a host id too long for a containerd label is refused by
// New, not by every Run.
func TestHostIDBound(t *testing.T) {
	c, err := client.New(filepath.Join(t.TempDir(), "nothing.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := containerd.New(c, containerd.WithHostID(strings.Repeat("x", containerd.MaxHostIDBytes))); err != nil {
		t.Errorf("host id of MaxHostIDBytes: %v", err)
	}
	_, err = containerd.New(c, containerd.WithHostID(strings.Repeat("x", containerd.MaxHostIDBytes+1)))
	if err == nil || !strings.Contains(err.Error(), "at most 1024") {
		t.Errorf("host id over MaxHostIDBytes: err = %v, want the bound named", err)
	}
}

func TestPing(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if err := f.runner.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	bad, err := client.New(filepath.Join(t.TempDir(), "nothing.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	r, err := containerd.New(bad)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	if err := r.Ping(ctx); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Ping of a dead socket = %v, want ErrUnavailable", err)
	}
}

func TestSweep(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	img, err := f.client.GetImage(ctx, containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	plant := func(id, host string, start bool) { f.plant(t, id, host, start) }
	plant("leftover-running", f.runner.HostID(), true)
	plant("leftover-created", f.runner.HostID(), false)
	plant("other-host", "someone-else", false)
	// a snapshot whose container was never created
	diffIDs, err := img.RootFS(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sn := f.client.SnapshotService(containerdtest.Snapshotter)
	if _, err := sn.Prepare(ctx, "leftover-snapshot", identity.ChainID(diffIDs).String(), snapshots.WithLabels(map[string]string{containerd.LabelHost: f.runner.HostID()})); err != nil {
		t.Fatal(err)
	}

	if err := f.runner.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	left := containerdtest.Leftovers(ctx, f.client)
	if want := []string{"container other-host", "snapshot other-host"}; strings.Join(left, ",") != strings.Join(want, ",") {
		t.Errorf("after Sweep: %v, want only the other host's %v", left, want)
	}
	if err := f.runner.Sweep(ctx); err != nil {
		t.Errorf("second Sweep: %v", err)
	}
	f.unplant(t, "other-host")
}

// plant creates a busybox container labelled with host, as a crashed
// Runner would leave it; start also starts its task (sleep 1000).
func (f *fixture) plant(t *testing.T, id, host string, start bool) {
	t.Helper()
	f.plantOwned(t, id, host, "", start)
}

// plantOwned is plant with a relay.owner label, unless owner is empty.
func (f *fixture) plantOwned(t *testing.T, id, host, owner string, start bool) {
	t.Helper()
	ctx := t.Context()
	img, err := f.client.GetImage(ctx, containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	labels := map[string]string{containerd.LabelHost: host}
	if owner != "" {
		labels[containerd.LabelOwner] = owner
	}
	c, err := f.client.NewContainer(ctx, id,
		client.WithImage(img),
		client.WithSnapshotter(containerdtest.Snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(labels)),
		client.WithContainerLabels(labels),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("/bin/sleep", "1000")))
	if err != nil {
		t.Fatal(err)
	}
	if start {
		task, err := c.NewTask(ctx, cio.NullIO)
		if err != nil {
			t.Fatal(err)
		}
		if err := task.Start(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// unplant removes containers planted by plant, with their tasks and
// snapshots.
func (f *fixture) unplant(t *testing.T, ids ...string) {
	t.Helper()
	ctx := t.Context()
	for _, id := range ids {
		c, err := f.client.LoadContainer(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		if task, err := c.Task(ctx, nil); err == nil {
			if _, err := task.Delete(ctx, client.WithProcessKill); err != nil && !errdefs.IsNotFound(err) {
				t.Fatal(err)
			}
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			t.Fatal(err)
		}
	}
}

// TestConcurrentSweeps: two processes with one host id (a restarted worker
// while its predecessor still runs, or two workers given the same consumer
// name) sweep the same leftovers at once. containerd 1.6 answers the loser
// of a task deletion with "ttrpc: closed"; that is not a failure when the
// task is gone.
func TestConcurrentSweeps(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	other := f.newRunner(t, f.runner.HostID())
	for round := range 5 {
		for i := range 3 {
			f.plant(t, fmt.Sprintf("leftover-%d-%d", round, i), f.runner.HostID(), true)
		}
		errs := make(chan error, 2)
		for _, r := range []*containerd.Runner{f.runner, other} {
			go func() { errs <- r.Sweep(ctx) }()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: concurrent Sweep: %v", round, err)
			}
		}
		containerdtest.AssertClean(t, f.client)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// runInBackground starts r.Run(req) and returns where its error arrives.
func runInBackground(t *testing.T, r *containerd.Runner, req runtime.Request) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(t.Context(), req)
		done <- err
	}()
	return done
}

// TestSweepSparesRunningInvocations: Sweep runs periodically while the
// Runner works, so it must leave the containers of invocations in flight.
func TestSweepSparesRunningInvocations(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("events.created")
	req.Spec.Command = []string{"/bin/sh", "-c", "sleep 1; echo survived"}
	done := runInBackground(t, f.runner, req)
	ctx := t.Context()
	testutil.WaitFor(t, 10*time.Second, "the invocation's container", func() bool {
		conts, err := f.client.Containers(ctx)
		return err == nil && len(conts) == 1
	})
	if err := f.runner.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("invocation in flight was disturbed by Sweep: %v", err)
	}
	containerdtest.AssertClean(t, f.client)
}

// A container without a task yet may be one whose task containerd is still
// creating for a worker that died: Sweep leaves it for the grace period,
// so that the task cannot outlive its container (found by the fault soak).
func TestSweepSparesContainerStillGettingItsTask(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ctx := t.Context()
	img, err := f.client.GetImage(ctx, containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	host := "grace-" + randomHex(4)
	labels := map[string]string{containerd.LabelHost: host}
	id := "young-" + randomHex(4)
	if _, err := f.client.NewContainer(ctx, id,
		client.WithImage(img), client.WithSnapshotter(containerdtest.Snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(labels)), client.WithContainerLabels(labels),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("/bin/true"))); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		grace time.Duration
		kept  bool
	}{{time.Hour, true}, {0, false}} {
		r, err := containerd.New(f.client, containerd.WithExecHelper(testExecHelper), containerd.WithNamespace(f.client.DefaultNamespace()), containerd.WithHostID(host),
			containerd.WithPull(false), containerd.WithTaskCreationGrace(c.grace))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		_, err = f.client.LoadContainer(ctx, id)
		if kept := err == nil; kept != c.kept {
			t.Errorf("grace %v: container kept = %v, want %v (%v)", c.grace, kept, c.kept, err)
		}
		// Gone before the next process of this host id starts, which would
		// otherwise take a live twin's fresh presence label for a reason
		// to wait.
		if err := r.Close(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
