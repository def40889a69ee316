package containerd

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/cio"
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
	h.open(dir, id)
	h.open(dir, id) // idempotent: one set of readers per container
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
