package testutil

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// StopProcess stops process pid with SIGSTOP and returns once every one of
// its threads has stopped. SIGSTOP only asks them to: on a loaded machine
// a process has gone on answering calls, and a worker's timers firing, for
// a while after the signal was sent, which a test that stalls the process
// on purpose must not mistake for the stall.
func StopProcess(t testing.TB, pid int) {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatalf("testutil: SIGSTOP to pid %d: %v", pid, err)
	}
	if !WaitStopped(pid, 30*time.Second) {
		t.Fatalf("testutil: pid %d has threads still running 30s after SIGSTOP", pid)
	}
}

// WaitStopped waits until every thread of process pid has stopped
// (Stopped), at most within; it reports whether they did.
func WaitStopped(pid int, within time.Duration) bool {
	for deadline := time.Now().Add(within); !Stopped(pid); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// Stopped reports whether every thread of process pid is stopped by a
// signal (state T in /proc/<pid>/task/<tid>/stat).
func Stopped(pid int) bool {
	dir := fmt.Sprintf("/proc/%d/task", pid)
	tasks, err := os.ReadDir(dir)
	if err != nil || len(tasks) == 0 {
		return false
	}
	for _, task := range tasks {
		b, err := os.ReadFile(filepath.Join(dir, task.Name(), "stat"))
		if err != nil {
			return false
		}
		// The state follows the command name, which is in parentheses
		// and may itself hold any character.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) || b[i+2] != 'T' {
			return false
		}
	}
	return true
}
