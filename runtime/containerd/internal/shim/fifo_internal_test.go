package shim

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
	"golang.org/x/sys/unix"
)

// TestFIFOReadersReleaseAWaitingWriter: a shim opens a task's output FIFOs
// for writing and blocks until they have a reader. After the client that
// made them died, fifoReaders is that reader; removeLeftFIFOs then removes
// what the dead client left.
func TestFIFOReadersReleaseAWaitingWriter(t *testing.T) {
	dir := t.TempDir()
	const id = "app.handler-0123456789abcdef"
	set, err := cio.NewFIFOSetInDir(dir, id, false)
	if err != nil {
		t.Fatal(err)
	}
	other, err := cio.NewFIFOSetInDir(dir, id+"0", false) // an id that id prefixes
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{set.Stdin, set.Stdout, set.Stderr, other.Stdout} {
		if err := syscall.Mkfifo(p, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if got := leftFIFOs(dir, id, stdio); len(got) != 3 {
		t.Fatalf("leftFIFOs = %q, want the 3 of %s only", got, id)
	}

	// The shim's open of stdout for writing, which blocks without a reader.
	opened := make(chan error, 1)
	go func() {
		f, err := os.OpenFile(set.Stdout, os.O_WRONLY, 0)
		if err == nil {
			f.Close()
		}
		opened <- err
	}()
	select {
	case err := <-opened:
		t.Fatalf("the writer's open returned before any reader: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	var h fifoReaders
	h.open(dir, id, 0)
	h.open(dir, id, 0) // idempotent: one set of readers per container
	if n := len(h.fds[id]); n != 2 {
		t.Errorf("%d readers open, want stdout and stderr", n)
	}
	if err := <-opened; err != nil {
		t.Fatalf("the writer's open: %v", err)
	}
	h.close(id)
	if len(h.fds) != 0 {
		t.Errorf("readers left after close: %v", h.fds)
	}

	if err := removeLeftFIFOs(dir, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Dir(set.Stdout)); !os.IsNotExist(err) {
		t.Errorf("the FIFO directory of %s is still there: %v", id, err)
	}
	if _, err := os.Stat(other.Stdout); err != nil {
		t.Errorf("another container's FIFO went too: %v", err)
	}
}

// TestHeldFIFOsReachAnUnlinkedFIFO: a process blocked opening a FIFO whose
// path is gone holds it only by the O_PATH descriptor of its FIFO library;
// heldFIFOs finds that descriptor, and a reader opened through it
// releases the waiting writer.
func TestHeldFIFOsReachAnUnlinkedFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "log")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Fatal(err)
	}
	handle, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(handle)
	plain, err := os.Open(filepath.Dir(p)) // a descriptor that is no O_PATH FIFO
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	opened := make(chan error, 1)
	go func() {
		fd, err := unix.Open(fmt.Sprintf("/proc/self/fd/%d", handle), unix.O_WRONLY|unix.O_CLOEXEC, 0)
		if err == nil {
			unix.Close(fd)
		}
		opened <- err
	}()
	held, err := heldFIFOs(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), handle); !slices.Equal(held, []string{want}) {
		t.Fatalf("heldFIFOs = %q, want [%s]", held, want)
	}
	var h fifoReaders
	if err := h.open(t.TempDir(), "app.handler-0123456789abcdef", os.Getpid()); err != nil {
		t.Fatal(err)
	}
	defer h.closeAll()
	select {
	case err := <-opened:
		if err != nil {
			t.Fatalf("the writer's open: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the writer still waits for a reader")
	}
	if held, err := heldFIFOs(0); held != nil || err != nil {
		t.Errorf("heldFIFOs(0) = %q, %v; want nothing", held, err)
	}
}
