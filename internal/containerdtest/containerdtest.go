// Package containerdtest connects tests to a real containerd
// (docs/operations.md#local-services-for-development).
//
// Tests need root and CONTAINERD_ADDRESS, the socket of a running daemon:
//
//	scripts/containerd.sh start /tmp/relay-dev   # prints the socket path
//	export CONTAINERD_ADDRESS=/tmp/relay-dev/containerd/containerd.sock
//	export RELAY_TEST_IMAGE_ARCHIVE=$(scripts/images.sh /tmp/relay-dev "$CONTAINERD_ADDRESS" | tail -n1)
//
// Without them a test is skipped with the reason, unless RELAY_TEST_REQUIRE=1
// makes it fail; -short skips always. Client gives each test a namespace
// relay-test-<random> of its own holding the test image (Image), imported
// from RELAY_TEST_IMAGE_ARCHIVE or, when that is unset, copied from the
// namespace "relay". At cleanup the test fails if a container or an active
// snapshot is left in its namespace, which is then deleted with everything
// in it.
package containerdtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/images/archive"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
)

// Image is the test image built by scripts/images.sh: static busybox with
// its applets in /bin, /etc/passwd with nobody (65534), empty /app and /tmp.
const Image = "relay.local/busybox:latest"

// Snapshotter is the snapshotter the image is unpacked into.
const Snapshotter = "overlayfs"

// Environment variables read by Client.
const (
	EnvAddress      = "CONTAINERD_ADDRESS"
	EnvImageArchive = "RELAY_TEST_IMAGE_ARCHIVE"
	EnvRequire      = "RELAY_TEST_REQUIRE"
)

// sourceNamespace is where scripts/images.sh imports the image.
const sourceNamespace = "relay"

// cleanupTimeout bounds the cleanup of one test namespace.
const cleanupTimeout = time.Minute

// Client returns a client for CONTAINERD_ADDRESS whose default namespace
// (client.DefaultNamespace) is a fresh relay-test-<random> namespace holding
// Image, unpacked. The client is closed and the namespace deleted at the end
// of the test; the test fails if a container or an active snapshot is left.
func Client(t testing.TB) *client.Client {
	t.Helper()
	if testing.Short() {
		t.Skip("containerd integration test skipped with -short")
	}
	addr := os.Getenv(EnvAddress)
	if addr == "" {
		unavailable(t, "%s is not set (scripts/containerd.sh start /tmp/relay-dev prints a socket)", EnvAddress)
	}
	if os.Geteuid() != 0 {
		unavailable(t, "containerd tests need root")
	}
	ns := "relay-test-" + randomHex(6)
	c, err := client.New(addr, client.WithDefaultNamespace(ns), client.WithTimeout(5*time.Second))
	if err != nil {
		unavailable(t, "containerd at %s: %v", addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.Version(ctx); err != nil {
		c.Close()
		unavailable(t, "containerd at %s is unreachable: %v", addr, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), cleanupTimeout)
		defer cancel()
		ctx = namespaces.WithNamespace(ctx, ns)
		if left := Leftovers(ctx, c); len(left) > 0 {
			t.Errorf("containerdtest: left behind in namespace %s: %s", ns, strings.Join(left, ", "))
		}
		if err := deleteNamespace(ctx, c, ns); err != nil {
			t.Errorf("containerdtest: delete namespace %s: %v", ns, err)
		}
		removeCgroupParents(ns)
		c.Close()
	})

	ctx, cancel = context.WithTimeout(namespaces.WithNamespace(context.Background(), ns), time.Minute)
	defer cancel()
	if err := importImage(ctx, c); err != nil {
		unavailable(t, "test image %s: %v", Image, err)
	}
	return c
}

// Leftovers lists the containers and active snapshots in the client's
// default namespace, or in ctx's namespace when ctx has one. An empty result
// means every invocation cleaned up after itself.
func Leftovers(ctx context.Context, c *client.Client) []string {
	if _, ok := namespaces.Namespace(ctx); !ok {
		ctx = namespaces.WithNamespace(ctx, c.DefaultNamespace())
	}
	var left []string
	conts, err := c.Containers(ctx)
	if err != nil {
		return []string{"list containers: " + err.Error()}
	}
	for _, ct := range conts {
		left = append(left, "container "+ct.ID())
	}
	err = c.SnapshotService(Snapshotter).Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if info.Kind == snapshots.KindActive {
			left = append(left, "snapshot "+info.Name)
		}
		return nil
	})
	if err != nil {
		left = append(left, "list snapshots: "+err.Error())
	}
	slices.Sort(left)
	return left
}

// AssertClean fails the test if Leftovers still reports anything after
// cleanTimeout: a one-shot container is removed in the background after
// its Run returned (docs/runtimes.md "One-shot containers").
func AssertClean(t testing.TB, c *client.Client) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), cleanTimeout+10*time.Second)
	defer cancel()
	deadline := time.Now().Add(cleanTimeout)
	for {
		left := Leftovers(ctx, c)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("left behind in namespace %s: %s", c.DefaultNamespace(), strings.Join(left, ", "))
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// cleanTimeout bounds AssertClean's wait for background removals, and
// for prepared containers, which a Runner removes 10 s after its app's
// last Run: well beyond that, as a loaded machine is slow to remove.
const cleanTimeout = 30 * time.Second

func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("containerdtest: "+format, args...)
	}
	t.Skipf("containerdtest: "+format, args...)
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// importImage makes Image available, unpacked, in ctx's namespace.
func importImage(ctx context.Context, c *client.Client) error {
	var archiveReader io.Reader
	if path := os.Getenv(EnvImageArchive); path != "" {
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		archiveReader = f
	} else {
		var buf bytes.Buffer
		src := namespaces.WithNamespace(ctx, sourceNamespace)
		err := c.Export(src, &buf, archive.WithImage(c.ImageService(), Image))
		if err != nil {
			return fmt.Errorf("%s unset and no image in namespace %s (run scripts/images.sh): %w", EnvImageArchive, sourceNamespace, err)
		}
		archiveReader = &buf
	}
	imgs, err := c.Import(ctx, archiveReader)
	if err != nil {
		return fmt.Errorf("import: %w", err)
	}
	found := false
	for _, im := range imgs {
		if im.Name != Image {
			continue
		}
		found = true
		if err := client.NewImage(c, im).Unpack(ctx, Snapshotter); err != nil {
			return fmt.Errorf("unpack: %w", err)
		}
	}
	if !found {
		return fmt.Errorf("archive does not contain %s", Image)
	}
	return nil
}

// deleteNamespace removes everything in ns, then ns itself.
func deleteNamespace(ctx context.Context, c *client.Client, ns string) error {
	var errs []error
	conts, err := c.Containers(ctx)
	errs = append(errs, err)
	for _, ct := range conts {
		if task, err := ct.Task(ctx, nil); err == nil {
			_, err := task.Delete(ctx, client.WithProcessKill)
			errs = append(errs, ignoreNotFound(err))
		}
		errs = append(errs, ignoreNotFound(ct.Delete(ctx, client.WithSnapshotCleanup)))
	}
	imgs, err := c.ImageService().List(ctx)
	errs = append(errs, err)
	for i, im := range imgs {
		var opts []images.DeleteOpt
		if i == len(imgs)-1 {
			opts = append(opts, images.SynchronousDelete()) // run GC once, at the end
		}
		errs = append(errs, ignoreNotFound(c.ImageService().Delete(ctx, im.Name, opts...)))
	}
	// Whatever GC did not collect: snapshots (children first), content, leases.
	sn := c.SnapshotService(Snapshotter)
	for range 10 {
		var leaves []string
		parents := map[string]bool{}
		err := sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
			leaves = append(leaves, info.Name)
			parents[info.Parent] = true
			return nil
		})
		errs = append(errs, err)
		leaves = slices.DeleteFunc(leaves, func(k string) bool { return parents[k] })
		if len(leaves) == 0 {
			break
		}
		for _, k := range leaves {
			errs = append(errs, ignoreNotFound(sn.Remove(ctx, k)))
		}
	}
	errs = append(errs, c.ContentStore().Walk(ctx, func(info content.Info) error {
		return ignoreNotFound(c.ContentStore().Delete(ctx, info.Digest))
	}))
	ls, err := c.LeasesService().List(ctx)
	errs = append(errs, err)
	for _, l := range ls {
		errs = append(errs, ignoreNotFound(c.LeasesService().Delete(ctx, l)))
	}
	errs = append(errs, ignoreNotFound(c.NamespaceService().Delete(ctx, ns)))
	return errors.Join(errs...)
}

// removeCgroupParents removes the per-namespace parent cgroups
// (/sys/fs/cgroup/<controller>/<ns> on cgroup v1, /sys/fs/cgroup/<ns> on v2)
// that runc creates and never removes; without this every test namespace
// leaves empty directories behind. rmdir fails, harmlessly, on a cgroup that
// is still in use.
func removeCgroupParents(ns string) {
	dirs, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup", "*", ns))
	for _, d := range append(dirs, filepath.Join("/sys/fs/cgroup", ns)) {
		os.Remove(d)
	}
}

func ignoreNotFound(err error) error {
	if errdefs.IsNotFound(err) {
		return nil
	}
	return err
}

// Environment variables naming the python3 and node runtime image archives
// built by scripts/runtime-images.sh, and the references they hold.
const (
	EnvPythonArchive = "RELAY_TEST_PYTHON_IMAGE_ARCHIVE"
	EnvNodeArchive   = "RELAY_TEST_NODE_IMAGE_ARCHIVE"
	PythonImage      = "relay.local/python3:bookworm"
	NodeImage        = "relay.local/node:bookworm"
)

// ImportArchive imports the image archive named by the environment
// variable env into c's default namespace and unpacks ref from it. Without
// the variable the test is skipped, or fails under RELAY_TEST_REQUIRE=1.
func ImportArchive(t testing.TB, c *client.Client, env, ref string) {
	t.Helper()
	path := os.Getenv(env)
	if path == "" {
		msg := env + " is not set (scripts/runtime-images.sh STATE_DIR SOCKET RUNTIME prints the archive path)"
		if os.Getenv(EnvRequire) == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ctx, cancel := context.WithTimeout(namespaces.WithNamespace(t.Context(), c.DefaultNamespace()), 5*time.Minute)
	defer cancel()
	imgs, err := c.Import(ctx, f)
	if err != nil {
		t.Fatalf("import %s: %v", path, err)
	}
	for _, im := range imgs {
		if im.Name == ref {
			if err := client.NewImage(c, im).Unpack(ctx, Snapshotter); err != nil {
				t.Fatalf("unpack %s: %v", ref, err)
			}
			return
		}
	}
	t.Fatalf("%s does not contain %s", path, ref)
}
