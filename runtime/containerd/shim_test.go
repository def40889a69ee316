package containerd_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/defaults"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime/containerd"
)

// shimsOf returns the shims serving namespace ns, and of those the ones
// serving container id when id is not empty.
func shimsOf(ns, id string) []containerdtest.Shim {
	return slices.DeleteFunc(containerdtest.Shims(ns), func(sh containerdtest.Shim) bool { return id != "" && sh.ID != id })
}

// fifoIO is a task's IO whose output FIFOs nobody reads, as when the
// worker creating the task dies before it opens them.
type fifoIO struct{ cfg cio.Config }

func (f fifoIO) Config() cio.Config { return f.cfg }
func (fifoIO) Cancel()              {}
func (fifoIO) Wait()                {}
func (fifoIO) Close() error         { return nil }

// interruptTaskCreation leaves what a worker killed in the middle of
// creating a task leaves: a container labelled with host, no task, and a
// shim that containerd started and then abandoned. It creates the
// container, has containerd create its task with output FIFOs that no one
// opens (the shim waits for them) and cancels the creation once the shim
// runs, as the death of the client does.
func (f *fixture) interruptTaskCreation(t *testing.T, id, host string) {
	t.Helper()
	ctx := t.Context()
	c := f.plantContainer(t, id, host)
	if c == nil {
		return
	}
	// Where and as cio makes them for a Run, and leaves them when its
	// process dies.
	fifos, err := cio.NewFIFOSetInDir(defaults.DefaultFIFODir, id, false)
	if err != nil {
		t.Error(err)
		return
	}
	t.Cleanup(func() { fifos.Close() })
	cfg := fifos.Config
	for _, p := range []string{cfg.Stdin, cfg.Stdout, cfg.Stderr} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Error(err)
			return
		}
	}
	// A cancellation, not a deadline: a deadline would reach the shim,
	// which would then give up by itself.
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		testutil.WaitFor(t, 30*time.Second, "the shim of "+id, func() bool { return len(shimsOf(f.client.DefaultNamespace(), id)) > 0 })
		time.Sleep(500 * time.Millisecond) // into the shim's wait for the FIFOs
		cancel()
	}()
	if _, err := c.NewTask(tctx, func(string) (cio.IO, error) { return fifoIO{cfg}, nil }); err == nil {
		t.Errorf("task %s created although no one reads its output", id)
	}
}

// plantContainer creates container id, labelled with host, with its
// snapshot and no task; nil after a t.Error.
func (f *fixture) plantContainer(t *testing.T, id, host string) client.Container {
	t.Helper()
	ctx := t.Context()
	img, err := f.client.GetImage(ctx, containerdtest.Image)
	if err != nil {
		t.Error(err)
		return nil
	}
	labels := map[string]string{containerd.LabelHost: host}
	c, err := f.client.NewContainer(ctx, id, client.WithImage(img), client.WithSnapshotter(containerdtest.Snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(labels)), client.WithContainerLabels(labels),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithProcessArgs("/bin/sleep", "1000")))
	if err != nil {
		t.Error(err)
		return nil
	}
	return c
}

// TestSweepEndsLeftoverShims: a worker killed while containerd created its
// task leaves a container without a task and a shim containerd no longer
// tracks (containerd 1.6). Removing such a container, as the sweep of this
// worker's successor or of any other worker does, must end that shim too,
// or a host where workers crash accumulates idle shims.
func TestSweepEndsLeftoverShims(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ns := f.client.DefaultNamespace()
	const n = 4
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			f.interruptTaskCreation(t, fmt.Sprintf("interrupted-%d-%s", i, randomHex(4)), f.runner.HostID())
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if got := len(shimsOf(ns, "")); got == 0 {
		t.Fatalf("no shim left after %d interrupted creations: the test reproduces nothing", n)
	}
	// The sweep reads the FIFOs the shim waits for, so the creation
	// finishes and the shim can be stopped; a sweep that still finds it
	// busy leaves its container to a later sweep.
	start := time.Now()
	testutil.WaitFor(t, time.Minute, "the leftover containers swept", func() bool {
		if err := f.runner.Sweep(t.Context()); err != nil {
			t.Logf("sweep: %v", err)
			return false
		}
		return len(containerdtest.Leftovers(t.Context(), f.client)) == 0
	})
	t.Logf("swept in %v", time.Since(start))
	// Nor do the FIFOs the interrupted creations left stay behind.
	for i := range n {
		if m, _ := filepath.Glob(filepath.Join(defaults.DefaultFIFODir, "*", fmt.Sprintf("interrupted-%d-*", i))); len(m) > 0 {
			t.Errorf("FIFOs left after the sweep: %q", m)
		}
	}
	// A shim exits a moment after it is asked to.
	testutil.WaitFor(t, 30*time.Second, "no shim left in the namespace", func() bool { return len(shimsOf(ns, "")) == 0 })
}

// startShim starts a shim for container id of namespace ns, as containerd
// does, in a bundle directory of its own, which it returns; the shim is
// killed at the end of the test. Its log is a FIFO, read here when withLog
// (the shim then serves) and by no one otherwise (it waits).
func startShim(t *testing.T, ns, id string, withLog bool) string {
	t.Helper()
	bundle := filepath.Join(t.TempDir(), id)
	if err := os.Mkdir(bundle, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(bundle, "log"), 0o700); err != nil {
		t.Fatal(err)
	}
	if withLog {
		log, err := os.OpenFile(filepath.Join(bundle, "log"), os.O_RDONLY|syscall.O_NONBLOCK, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { log.Close() })
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), []byte(`{"ociVersion":"1.0.2"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	address := os.Getenv(containerdtest.EnvAddress)
	publisher, err := exec.LookPath("containerd")
	if err != nil {
		publisher = "containerd"
	}
	start := exec.Command("containerd-shim-runc-v2", "-namespace", ns, "-id", id, "-address", address, "-publish-binary", publisher, "start")
	start.Dir = bundle
	start.Env = append(os.Environ(), "TTRPC_ADDRESS="+address+".ttrpc")
	if out, err := start.CombinedOutput(); err != nil {
		t.Fatalf("start the shim: %v\n%s", err, out)
	}
	t.Cleanup(func() {
		for _, sh := range shimsOf(ns, id) {
			_ = syscall.Kill(sh.PID, syscall.SIGKILL)
		}
	})
	return bundle
}

// TestSweepEndsShimWithoutContainer: a shim of the namespace whose
// container is gone (containerd 1.6 forgets one it started while it was
// stopping) is ended by a sweep once it has been so for the task-creation
// grace; a shim of another namespace is not.
func TestSweepEndsShimWithoutContainer(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ns := f.client.DefaultNamespace()
	id := "forgotten-" + randomHex(8)
	startShim(t, ns, id, true)
	other := ns + "-other"
	startShim(t, other, id, true)
	if len(shimsOf(ns, id)) == 0 || len(shimsOf(other, id)) == 0 {
		t.Fatal("the shims did not start")
	}
	patient := f.newRunner(t, "patient-"+randomHex(4), containerd.WithTaskCreationGrace(time.Hour))
	for range 2 {
		if err := patient.Sweep(t.Context()); err != nil {
			t.Fatalf("Sweep: %v", err)
		}
	}
	if len(shimsOf(ns, id)) == 0 {
		t.Fatal("a sweep ended a shim without its container before the grace was over")
	}
	if err := f.runner.Sweep(t.Context()); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	testutil.WaitFor(t, 10*time.Second, "the shim without a container gone", func() bool { return len(shimsOf(ns, id)) == 0 })
	if len(shimsOf(other, id)) == 0 {
		t.Error("the sweep ended a shim of another namespace")
	}
}

// TestSweepEndsShimWaitingForItsLog: containerd makes a FIFO for a shim's
// log in the task's bundle directory and starts the shim, which opens it
// for writing before it serves any request. When containerd gives up on
// the task before that (its client died or cancelled, containerd was
// stopping), it closes its end and removes the bundle directory, FIFO
// included: the shim then waits for a reader no path leads to, and never
// answers. Removing the container such a creation left must still end
// that shim, or every later sweep finds it busy and keeps the container.
// The shim is started here the way containerd starts one.
func TestSweepEndsShimWaitingForItsLog(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	ns := f.client.DefaultNamespace()
	id := "log-wait-" + randomHex(8)
	if f.plantContainer(t, id, f.runner.HostID()) == nil {
		return
	}
	bundle := startShim(t, ns, id, false)
	testutil.WaitFor(t, 10*time.Second, "the shim of "+id+" waiting for its log", func() bool {
		sh := shimsOf(ns, id)
		if len(sh) == 0 {
			return false
		}
		stacks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/stack", sh[0].PID))
		for _, p := range stacks {
			if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), "fifo_open") {
				return true
			}
		}
		return false
	})
	// As containerd does once it gave up on the task.
	if err := os.RemoveAll(bundle); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the leftover container swept", func() bool {
		if err := f.runner.Sweep(t.Context()); err != nil {
			t.Logf("sweep: %v", err)
			return false
		}
		return len(containerdtest.Leftovers(t.Context(), f.client)) == 0
	})
	testutil.WaitFor(t, 10*time.Second, "the shim gone", func() bool { return len(shimsOf(ns, id)) == 0 })
}
