package containerdtest

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/relaydev/relay/internal/shimproc"
)

// Shim is a containerd runc shim process, as its command line names it.
type Shim struct {
	PID       int
	Namespace string
	ID        string // the container it serves
	Address   string // the containerd socket that started it
	Started   time.Time
}

func (sh Shim) String() string {
	return fmt.Sprintf("shim %d of %s (started %s)", sh.PID, sh.ID, sh.Started.Format("15:04:05.00"))
}

// Shims returns the shims serving namespace ns, of any containerd: tests
// that restart a daemon match Address themselves.
func Shims(ns string) []Shim {
	if ns == "" {
		return nil
	}
	boot := bootTime()
	var out []Shim
	for _, p := range shimproc.List() {
		if p.Namespace == ns {
			out = append(out, Shim{PID: p.PID, Namespace: p.Namespace, ID: p.ID, Address: p.Address, Started: processStart(p.PID, boot)})
		}
	}
	return out
}

// bootTime returns when the machine booted (/proc/stat btime).
func bootTime() time.Time {
	b, _ := os.ReadFile("/proc/stat")
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "btime "); ok {
			sec, _ := strconv.ParseInt(v, 10, 64)
			return time.Unix(sec, 0)
		}
	}
	return time.Time{}
}

// processStart returns when process pid started (field 22 of
// /proc/<pid>/stat, in USER_HZ, 100 on Linux, after the boot time, which
// is in whole seconds), or the zero time.
func processStart(pid int, boot time.Time) time.Time {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}
	}
	// Fields after the command, which may hold spaces, end with ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 20 {
		return time.Time{}
	}
	ticks, _ := strconv.ParseInt(fields[19], 10, 64) // field 22 overall
	return boot.Add(time.Duration(ticks) * 10 * time.Millisecond)
}

// Waits describes, for a failing test's log, what the shim's threads wait
// on in the kernel (the first frame of each thread's stack that is not an
// idle futex or epoll wait) and the files it holds open: enough to tell a
// shim blocked opening a FIFO from an idle one. Empty when /proc cannot
// tell.
func (sh Shim) Waits() string {
	proc := fmt.Sprintf("/proc/%d", sh.PID)
	var waits []string
	stacks, _ := filepath.Glob(filepath.Join(proc, "task", "*", "stack"))
	for _, p := range stacks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		first, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
		if f := strings.Fields(first); len(f) > 1 && !strings.Contains(f[1], "futex") && !strings.Contains(f[1], "epoll") {
			waits = append(waits, f[1])
		}
	}
	var files []string
	fds, _ := os.ReadDir(filepath.Join(proc, "fd"))
	for _, fd := range fds {
		if target, err := os.Readlink(filepath.Join(proc, "fd", fd.Name())); err == nil && strings.HasPrefix(target, "/") && target != "/dev/null" {
			files = append(files, fd.Name()+"="+target)
		}
	}
	if len(waits)+len(files) == 0 {
		return ""
	}
	return fmt.Sprintf("threads waiting in %v, files %v", waits, files)
}
