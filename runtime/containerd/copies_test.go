package containerd_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/runtime/containerd"
)

// TestSweepRemovesCopiesOfEarlierVersions: the copies of the exec helper
// and of the bootstraps that a Relay upgrade leaves in the state directory
// are removed by a sweep once no Runner used them for the retention, unless
// a container mounts one; younger copies stay, and so does an interrupted
// write's temporary file until it is a day old.
func TestSweepRemovesCopiesOfEarlierVersions(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	state := t.TempDir()
	plant := func(rel string, age time.Duration) string {
		p := filepath.Join(state, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("an earlier version's copy"), 0o444); err != nil {
			t.Fatal(err)
		}
		at := time.Now().Add(-age)
		if err := os.Chtimes(p, at, at); err != nil {
			t.Fatal(err)
		}
		return p
	}
	old := containerd.CopyRetention + time.Hour
	oldHelper := plant("bin/relay-exec-0011223344556677", old)
	oldBoot := plant("bootstrap/python3-00112233445566.py", old)
	oldTmp := plant("bin/.tmp-123", 25*time.Hour)
	recentBoot := plant("bootstrap/node-00112233445566.js", 2*24*time.Hour)
	recentTmp := plant("bootstrap/.tmp-456", time.Hour)
	mountedBoot := plant("bootstrap/python3-66554433221100.py", old)

	// A container of another worker still mounts mountedBoot.
	ctx := t.Context()
	img, err := f.client.GetImage(ctx, containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	id := "copies-" + randomHex(4)
	labels := map[string]string{containerd.LabelHost: "elsewhere-" + randomHex(4)}
	c, err := f.client.NewContainer(ctx, id, client.WithImage(img), client.WithSnapshotter(containerdtest.Snapshotter),
		client.WithNewSnapshot(id, img, snapshots.WithLabels(labels)), client.WithContainerLabels(labels),
		client.WithNewSpec(oci.WithImageConfig(img), oci.WithMounts([]specs.Mount{{
			Destination: "/opt/relay/bootstrap.py", Type: "bind", Source: mountedBoot, Options: []string{"bind", "ro"},
		}})))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Delete(context.WithoutCancel(ctx), client.WithSnapshotCleanup) })

	r := f.newRunner(t, "copies-"+randomHex(4), containerd.WithStateDir(state))
	if err := r.Sweep(ctx); err != nil {
		t.Fatalf("Sweep: %v", err)
	}
	for _, p := range []string{oldHelper, oldBoot, oldTmp} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: stat %v, want it removed", p, err)
		}
	}
	for _, p := range []string{recentBoot, recentTmp, mountedBoot} {
		if _, err := os.Stat(p); err != nil {
			t.Errorf("%s: %v, want it kept", p, err)
		}
	}
}
