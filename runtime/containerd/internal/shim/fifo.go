package shim

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
//
// A shim can also block on a FIFO no path leads to any more: the log FIFO
// containerd makes in the task's bundle directory, which a new shim opens
// for writing before it serves a single request. When containerd gives up
// on the task before the shim got that far (its client died or cancelled,
// containerd stopped), it closes its end and removes the bundle directory,
// and the shim waits for a reader forever. The shim's FIFO library holds
// an O_PATH descriptor of each FIFO it opens, so /proc/<shim>/fd/<n>
// still reaches the file: heldFIFOs finds those, for fifoReaders to open
// (docs/operations.md "containerd").
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
// dir for container id and, when pid is not 0, the FIFOs process pid (the
// shim of id) holds only by an O_PATH descriptor, unless they are open
// already. The shim opens stdin without blocking, so stdin needs no reader.
// The error says why the FIFOs of pid could not be read (a worker without
// CAP_SYS_PTRACE); FIFOs that vanish meanwhile are not errors.
func (h *fifoReaders) open(dir, id string, pid int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.fds[id]; ok {
		return nil
	}
	held, err := heldFIFOs(pid)
	var fds []int
	for _, p := range append(leftFIFOs(dir, id, stdio[1:]), held...) {
		fd, oerr := unix.Open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
		if oerr == nil {
			fds = append(fds, fd)
		} else if errors.Is(oerr, fs.ErrPermission) && err == nil {
			err = &fs.PathError{Op: "open", Path: p, Err: oerr}
		}
	}
	if len(fds) > 0 {
		if h.fds == nil {
			h.fds = map[string][]int{}
		}
		h.fds[id] = fds
	}
	return err
}

// heldFIFOs returns, as /proc/<pid>/fd/<n> paths, the FIFOs process pid
// holds by an O_PATH descriptor: a FIFO it is still opening, or one it
// opened (the FIFO library keeps the handle until it closes the FIFO).
// None when pid is 0 or has exited; an error only when pid's descriptors
// may not be read.
func heldFIFOs(pid int) ([]string, error) {
	if pid <= 0 {
		return nil, nil
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	ents, err := os.ReadDir(filepath.Join(proc, "fd"))
	if errors.Is(err, fs.ErrPermission) {
		return nil, err
	} else if err != nil {
		return nil, nil
	}
	var paths []string
	for _, e := range ents {
		info, err := os.ReadFile(filepath.Join(proc, "fdinfo", e.Name()))
		if err != nil || !isPathDescriptor(info) {
			continue
		}
		p := filepath.Join(proc, "fd", e.Name())
		if fi, err := os.Stat(p); err == nil && fi.Mode()&fs.ModeNamedPipe != 0 {
			paths = append(paths, p)
		}
	}
	return paths, nil
}

// isPathDescriptor reports whether fdinfo, the text of a
// /proc/<pid>/fdinfo/<n> file, describes a descriptor opened with O_PATH.
func isPathDescriptor(fdinfo []byte) bool {
	for line := range strings.Lines(string(fdinfo)) {
		if v, ok := strings.CutPrefix(line, "flags:"); ok {
			flags, err := strconv.ParseUint(strings.TrimSpace(v), 8, 64)
			return err == nil && flags&unix.O_PATH != 0
		}
	}
	return false
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
