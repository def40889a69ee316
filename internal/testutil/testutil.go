// Package testutil holds small helpers shared by Relay's tests.
package testutil

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Buffer is a bytes.Buffer safe for concurrent writers, for capturing the
// output of a worker while a test reads it.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// WaitFor polls cond every 10ms until it holds, failing the test after
// timeout. Tests wait on observable state this way instead of sleeping.
func WaitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// AppsRoot writes templates (app name → template.yaml source) into a new
// temporary apps root and returns its path.
func AppsRoot(t testing.TB, templates map[string]string) string {
	t.Helper()
	root := t.TempDir()
	for name, src := range templates {
		dir := filepath.Join(root, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "template.yaml"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// Zone loads the time zone name, failing the test when the machine lacks
// it (install tzdata).
func Zone(t testing.TB, name string) *time.Location {
	t.Helper()
	loc, err := time.LoadLocation(name)
	if err != nil {
		t.Fatalf("load zone %s (install tzdata): %v", name, err)
	}
	return loc
}

// Time parses an RFC 3339 time, with or without fractional seconds, as UTC.
func Time(t testing.TB, s string) time.Time {
	t.Helper()
	at, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return at.UTC()
}

// RunCommand runs cmd with its stdout and stderr captured and returns them
// with its exit code; an error other than a non-zero exit fails the test.
func RunCommand(t testing.TB, cmd *exec.Cmd) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if ee, ok := errors.AsType[*exec.ExitError](err); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return out.String(), errOut.String(), code
}

// Every runs f every "every" plus a random part of jitter (> 0), one run at a
// time, until the returned stop, which waits for a run under way to end.
// Tests inject faults this way (kill a worker at random, say) while their
// load goes on.
func Every(every, jitter time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(every + rand.N(jitter)):
			}
			f()
		}
	}()
	return func() { close(quit); <-done }
}
