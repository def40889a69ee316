package containerd

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/containerd/containerd/v2/defaults"
	"golang.org/x/sys/unix"
)

// A task's stdio are FIFOs that containerd's client library (cio) makes
// under fifoDir as <fifoDir>/<random>/<container id>-{stdin,stdout,stderr}
// and removes when the task's IO is closed. A worker killed while
// containerd creates its task leaves them, unread: the task's shim blocks
// opening the output FIFOs for writing until a reader appears, and with it
// every later request to that shim (docs/operations.md "containerd").
// Opening them for reading lets that creation finish, so the shim answers
// and can be stopped at once rather than when it gives up by itself.
const fifoDir = defaults.DefaultFIFODir

// stdio names the FIFOs of a task, as suffixes of its container id.
var stdio = []string{"-stdin", "-stdout", "-stderr"}

// leftFIFOs returns the FIFOs cio made for container id under dir with one
// of the suffixes (none when the client that made them closed them, the
// normal case).
func leftFIFOs(dir, id string, suffixes []string) []string {
	var paths []string
	for _, suffix := range suffixes {
		// A container id holds no glob metacharacters (containerd
		// accepts only [A-Za-z0-9_.-]), so it matches itself.
		m, _ := filepath.Glob(filepath.Join(dir, "*", id+suffix))
		for _, p := range m {
			if fi, err := os.Lstat(p); err == nil && fi.Mode()&fs.ModeNamedPipe != 0 {
				paths = append(paths, p)
			}
		}
	}
	return paths
}

// fifoReaders holds open, per container id, readers of the output FIFOs a
// dead client left: from the first attempt to end that container's shim
// until the container is removed, so that a shim that reaches its open of
// the FIFOs late (a slow creation) still finds a reader.
type fifoReaders struct {
	mu  sync.Mutex
	fds map[string][]int
}

// open opens for reading, without blocking, the output FIFOs left under
// dir for container id, unless they are open already. The shim opens stdin
// without blocking, so stdin needs no reader.
func (h *fifoReaders) open(dir, id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.fds[id]; ok {
		return
	}
	var fds []int
	for _, p := range leftFIFOs(dir, id, stdio[1:]) {
		if fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0); err == nil {
			fds = append(fds, fd)
		}
	}
	if len(fds) > 0 {
		if h.fds == nil {
			h.fds = map[string][]int{}
		}
		h.fds[id] = fds
	}
}

// close closes the readers of container id's FIFOs, if open.
func (h *fifoReaders) close(id string) {
	h.mu.Lock()
	fds := h.fds[id]
	delete(h.fds, id)
	h.mu.Unlock()
	for _, fd := range fds {
		unix.Close(fd)
	}
}

// closeAll closes every reader; the Runner is closing.
func (h *fifoReaders) closeAll() {
	h.mu.Lock()
	all := h.fds
	h.fds = nil
	h.mu.Unlock()
	for _, fds := range all {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
}

// removeLeftFIFOs removes the FIFOs a dead client left for container id,
// and each directory of them that is empty afterwards.
func removeLeftFIFOs(dir, id string) error {
	var errs []error
	for _, p := range leftFIFOs(dir, id, stdio) {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		// Fails while the directory holds another container's FIFOs,
		// which cio does not do: one directory per task.
		_ = os.Remove(filepath.Dir(p))
	}
	return errors.Join(errs...)
}
