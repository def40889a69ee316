package containerd_test

import (
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
		containerd.LabelPresencePrefix+host, strconv.FormatInt(at.Unix(), 10))
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
	sweeper, err := containerd.New(f.client,
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("sweeper-"+suffix),
		containerd.WithPull(false),
		containerd.WithStateDir(t.TempDir()),
		containerd.WithTaskCreationGrace(0),
		containerd.WithOrphanTimeout(orphan))
	if err != nil {
		t.Fatal(err)
	}
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
