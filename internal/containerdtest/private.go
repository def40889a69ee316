package containerdtest

import (
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/relaydev/relay/internal/testutil"
)

// Daemon is a containerd of one test's own, run by scripts/containerd.sh
// under a temporary state directory, for tests that stop, restart or
// stall it without disturbing others.
type Daemon struct {
	State  string // the state directory
	Socket string // its gRPC socket
	t      testing.TB
}

// Private starts a Daemon, points CONTAINERD_ADDRESS at it (with t.Setenv,
// so not in parallel tests) and stops it when the test ends, after the
// cleanup of the Clients made afterwards. Without root or a containerd
// setup the test is skipped, or fails under RELAY_TEST_REQUIRE=1; -short
// skips always.
func Private(t testing.TB) *Daemon { return PrivateIn(t, t.TempDir()) }

// PrivateIn is Private with its state (root, state and socket) under
// state, a directory on a filesystem of the test's choice (Tmpfs).
func PrivateIn(t testing.TB, state string) *Daemon {
	t.Helper()
	if testing.Short() {
		t.Skip("containerd integration test skipped with -short")
	}
	if os.Geteuid() != 0 || os.Getenv(EnvAddress) == "" {
		unavailable(t, "needs root and a containerd setup (%s); runs a private daemon of its own", EnvAddress)
	}
	if os.Getenv(EnvImageArchive) == "" {
		unavailable(t, "%s is not set: a private daemon has no image to copy from", EnvImageArchive)
	}
	d := &Daemon{State: state, t: t}
	d.Socket = filepath.Join(d.State, "containerd", "containerd.sock")
	d.script("start")
	// Registered first, so it runs after the cleanup of Clients.
	t.Cleanup(func() {
		d.Resume() // a stopped daemon ignores SIGTERM until continued
		_ = exec.Command("bash", scriptPath(), "stop", d.State).Run()
	})
	t.Setenv(EnvAddress, d.Socket)
	return d
}

// Stop stops the daemon (SIGTERM); its shims and their tasks stay.
func (d *Daemon) Stop() { d.script("stop") }

// Start starts the stopped daemon again, on the same state.
func (d *Daemon) Start() { d.script("start") }

// Pause stalls the daemon with SIGSTOP: its socket stays open, and calls
// wait without an answer until Resume. It returns once every thread of the
// daemon has stopped (testutil.StopProcess).
func (d *Daemon) Pause() {
	d.t.Helper()
	pid := d.PID()
	if pid == 0 {
		d.t.Fatal("containerdtest: Pause: the daemon is not running")
	}
	testutil.StopProcess(d.t, pid)
}

// Resume continues a paused daemon (SIGCONT).
func (d *Daemon) Resume() { d.signal(syscall.SIGCONT) }

// PID is the daemon's process id, 0 when it is not running.
func (d *Daemon) PID() int {
	b, err := os.ReadFile(filepath.Join(d.State, "containerd.pid"))
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

func (d *Daemon) signal(sig syscall.Signal) {
	if pid := d.PID(); pid > 0 {
		_ = syscall.Kill(pid, sig)
	}
}

func (d *Daemon) script(cmd string) {
	d.t.Helper()
	out, err := exec.Command("bash", scriptPath(), cmd, d.State).CombinedOutput()
	if err != nil {
		d.t.Fatalf("containerdtest: containerd.sh %s %s: %v\n%s", cmd, d.State, err, out)
	}
}

// scriptPath is scripts/containerd.sh of this repository.
func scriptPath() string {
	_, file, _, _ := goruntime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "scripts", "containerd.sh")
}

// Tmpfs mounts a tmpfs of size bytes on a new directory and returns it: a
// small filesystem for a test to fill. It is unmounted (lazily, should a
// process still use it) when the test ends, after the cleanups registered
// later. It needs root.
func Tmpfs(t testing.TB, size int64) string {
	t.Helper()
	if os.Geteuid() != 0 {
		unavailable(t, "mounting a tmpfs needs root")
	}
	dir := t.TempDir()
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+strconv.FormatInt(size, 10)); err != nil {
		t.Fatalf("containerdtest: mount a tmpfs on %s: %v", dir, err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// Fill writes a new file in dir until the filesystem holding it has no
// space left, and returns a function that removes the file. Call it again
// to take what was freed since.
func Fill(t testing.TB, dir string) (free func()) {
	t.Helper()
	f, err := os.CreateTemp(dir, "containerdtest-fill-*")
	if err != nil {
		t.Fatalf("containerdtest: fill %s: %v", dir, err)
	}
	defer f.Close()
	path := f.Name()
	for _, chunk := range []int{1 << 20, 4 << 10, 1} {
		buf := make([]byte, chunk)
		for {
			if _, err := f.Write(buf); err != nil {
				break
			}
		}
	}
	return func() {
		if err := os.Remove(path); err != nil {
			t.Errorf("containerdtest: free %s: %v", dir, err)
		}
	}
}
