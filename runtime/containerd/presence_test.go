package containerd_test

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// presenceLabels returns the namespace's presence labels, host id → value.
func presenceLabels(t *testing.T, f *fixture) map[string]string {
	t.Helper()
	labels, err := f.client.NamespaceService().Labels(t.Context(), f.client.DefaultNamespace())
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for k, v := range labels {
		if host, ok := strings.CutPrefix(k, containerd.LabelPresencePrefix); ok {
			out[host] = v
		}
	}
	return out
}

func setPresence(t *testing.T, f *fixture, host string, at time.Time) {
	t.Helper()
	err := f.client.NamespaceService().SetLabel(t.Context(), f.client.DefaultNamespace(),
		containerd.LabelPresencePrefix+host, strconv.FormatInt(at.UnixMilli(), 10)+" test")
	if err != nil {
		t.Fatal(err)
	}
}

// TestSweepRemovesGoneHosts: Sweep removes the containers of another host id
// whose presence label went stale (a crashed worker replaced under another
// name), and leaves those of a host with a fresh label and of a host with
// none (an older Relay, another tool). It judges others only after its own
// presence has been refreshed for half the orphan timeout, so that a
// containerd outage, which stops every refresh, is not taken for deaths.
func TestSweepRemovesGoneHosts(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	suffix := randomHex(4)
	gone, alive, silent := "gone-"+suffix, "alive-"+suffix, "silent-"+suffix
	f.plant(t, "gone-running", gone, true)
	f.plant(t, "gone-created", gone, false)
	f.plant(t, "alive-running", alive, true)
	f.plant(t, "silent-running", silent, true)
	setPresence(t, f, gone, time.Now().Add(-time.Hour))

	const orphan = 2 * time.Second
	sweeper := f.newRunner(t, "sweeper-"+suffix, containerd.WithOrphanTimeout(orphan))
	all := []string{"container alive-running", "container gone-created", "container gone-running", "container silent-running",
		"snapshot alive-running", "snapshot gone-created", "snapshot gone-running", "snapshot silent-running"}
	// The first Sweep announces the sweeper; it has not been healthy long
	// enough to judge anyone.
	if err := sweeper.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if left := containerdtest.Leftovers(t.Context(), f.client); !slices.Equal(left, all) {
		t.Fatalf("after the first Sweep: %v, want all of %v", left, all)
	}
	if _, ok := presenceLabels(t, f)["sweeper-"+suffix]; !ok {
		t.Fatalf("Sweep did not write its presence label: %v", presenceLabels(t, f))
	}

	time.Sleep(orphan/2 + 100*time.Millisecond)
	setPresence(t, f, alive, time.Now())
	if err := sweeper.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	want := []string{"container alive-running", "container silent-running", "snapshot alive-running", "snapshot silent-running"}
	if left := containerdtest.Leftovers(t.Context(), f.client); !slices.Equal(left, want) {
		t.Errorf("after Sweep: %v, want %v", left, want)
	}
	labels := presenceLabels(t, f)
	if _, ok := labels[gone]; ok {
		t.Errorf("the gone host's presence label is still there: %v", labels)
	}
	if _, ok := labels[alive]; !ok {
		t.Errorf("the live host's presence label was removed: %v", labels)
	}

	if err := sweeper.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok := presenceLabels(t, f)["sweeper-"+suffix]; ok {
		t.Error("Close left the presence label")
	}
	f.unplant(t, "alive-running", "silent-running")
}

// TestWarmContainersOfAGoneWorker: a worker that died with a warm container
// and was replaced under another host id. While the first lives, the other's
// Sweep leaves its container alone, for longer than the orphan timeout;
// once it stops refreshing its presence (as a SIGKILL stops it) the other's
// Sweep removes the container.
func TestWarmContainersOfAGoneWorker(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": warmPython})
	const orphan = 2 * time.Second
	suffix := randomHex(4)
	crashed := f.newRunner(t, "crashed-"+suffix, containerd.WithOrphanTimeout(orphan))
	replacement := f.newRunner(t, "replacement-"+suffix, containerd.WithOrphanTimeout(orphan))
	req := f.warmRequest("handlers.count", "1-0")
	a, _ := f.count(t, crashed, req)

	for deadline := time.Now().Add(2 * orphan); time.Now().Before(deadline); time.Sleep(orphan / 10) {
		if err := replacement.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if i, s := f.count(t, crashed, req); i != a || s != "2" {
		t.Fatalf("a live worker's warm container was swept: ran in %s (served %s), want %s serving its second", i, s, a)
	}

	containerd.StopPresence(crashed)
	testutil.WaitFor(t, 30*time.Second, "the gone worker's warm container swept", func() bool {
		return replacement.Sweep(t.Context()) == nil && len(containerdtest.Leftovers(t.Context(), f.client)) == 0
	})
	labels, err := f.client.NamespaceService().Labels(t.Context(), f.client.DefaultNamespace())
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := labels[containerd.LabelPresencePrefix+"crashed-"+suffix]; ok {
		t.Errorf("the gone worker's presence label is still there: %v", labels)
	}
	if err := replacement.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestTwinHostIDIsNotSwept: two live Runners given one host id (two workers
// with one consumer name) must not take each other's running containers
// for leftovers: Sweep spares what another live owner (relay.owner)
// created. Once the first is gone, its leftovers go at the next sweep.
func TestTwinHostIDIsNotSwept(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	host := "twin-" + randomHex(4)
	const orphan = 5 * time.Second // refreshes every second
	first := f.newRunner(t, host, containerd.WithOrphanTimeout(orphan))
	second := f.newRunner(t, host, containerd.WithOrphanTimeout(orphan))
	req := f.request("events.created")
	req.Spec.Command = []string{"/bin/sh", "-c", "sleep 3; echo survived"}
	done := runInBackground(t, first, req)
	testutil.WaitFor(t, 10*time.Second, "the first runner's container", func() bool {
		return len(containerdtest.Leftovers(t.Context(), f.client)) > 0
	})
	// The second sweeps again and again while the first runs and refreshes.
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if err := second.Sweep(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatalf("the first runner's handler: %v (its container was swept by its twin?)", err)
	}
	if !strings.Contains(f.stdout.String(), "survived") {
		t.Errorf("handler output %q, want survived", f.stdout.String())
	}

	// The first dies leaving a container: spared while it lived, swept
	// once it is gone.
	f.plantOwned(t, "left-by-first", host, containerd.Owner(first), true)
	if err := second.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if left := containerdtest.Leftovers(t.Context(), f.client); len(left) == 0 {
		t.Fatal("a live twin's container was swept")
	}
	containerd.StopPresence(first)
	testutil.WaitFor(t, 20*time.Second, "the dead twin's leftover swept", func() bool {
		return second.Sweep(t.Context()) == nil && len(containerdtest.Leftovers(t.Context(), f.client)) == 0
	})
	if err := second.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, ok := presenceLabels(t, f)[host]; ok {
		t.Error("Close left the presence label it wrote last")
	}
}

// TestOwnerLiveness: Sweep spares, under its own host id, the objects of
// another Runner that may still run, and not those of a process that is
// gone: exited, a zombie its parent has not reaped yet, a later process
// given the same pid, or a previous process that had this process's pid
// (a restart in a container).
func TestOwnerLiveness(t *testing.T) {
	f := newFixture(t)
	other := f.newRunner(t, f.runner.HostID())
	done := exec.Command("true")
	if err := done.Run(); err != nil {
		t.Fatal(err)
	}
	// A child that exits and is not waited for stays a zombie.
	zombie := exec.Command("true")
	if err := zombie.Start(); err != nil {
		t.Fatal(err)
	}
	zombieOwner := containerd.OwnerOf(zombie.Process.Pid) + "-feedface"
	testutil.WaitFor(t, 10*time.Second, "the child to exit", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", zombie.Process.Pid))
		return err == nil && strings.Contains(string(b), ") Z ")
	})
	defer zombie.Wait()
	pid := strconv.Itoa(os.Getpid())
	initOwner := containerd.OwnerOf(1)
	for owner, want := range map[string]bool{
		containerd.Owner(f.runner):                     false, // its own: isLive decides
		containerd.Owner(other):                        true,  // another Runner of this process
		containerd.OwnerOf(os.Getpid()) + "-feedface":  false, // a previous process with this pid
		pid + "-feedface":                              false,
		strconv.Itoa(done.Process.Pid) + "-1-feedface": false, // exited
		zombieOwner:             false, // killed, not reaped
		initOwner + "-feedface": true,  // init runs
		"1-12345-feedface":      false, // another process that had pid 1
		"1-feedface":            true,  // pid only (no start time): init runs
		"garbage":               false,
		"":                      false, // a Relay before owner labels
	} {
		if got := containerd.OwnedByAnotherLiveRunner(f.runner, owner); got != want {
			t.Errorf("owner %q: spared = %v, want %v", owner, got, want)
		}
	}
	containerd.StopPresence(other)
	if containerd.OwnedByAnotherLiveRunner(f.runner, containerd.Owner(other)) {
		t.Error("a stopped Runner's objects are still spared")
	}
}
