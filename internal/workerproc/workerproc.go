// Package workerproc runs worker processes for end-to-end tests and
// watches them. A worker is the test binary run again with
// -test.run=^TestWorkerProcess$ and a consumer name in the environment, so
// that a suite's workers are real processes sharing one Redis, which a
// test can SIGKILL, SIGSTOP or stop gracefully mid-run as production would.
// The suites under tests/ (flow, faults) supervise their workers through
// it, so that starting, logging, crash capture and stopping behave alike
// in both; each keeps its own bookkeeping (faults counted, deaths timed)
// around a Set.
//
// The suite's side is a Set; the worker's side is a TestWorkerProcess
// that calls Worker first.
package workerproc

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
)

// startedLine is what a worker logs once its engine runs.
const startedLine = `msg="engine started"`

// tailLines is how much of a crashed worker's log its report shows.
const tailLines = 30

// Config is what a suite's workers share.
type Config struct {
	// ConsumerVar is the environment variable that carries a worker's
	// consumer name to it (Worker reads it); it is set only in workers.
	ConsumerVar string
	// LogDirVar, when that variable is set, keeps the workers' logs in
	// <its value>/<test name> for a look after the run, instead of in a
	// temporary directory.
	LogDirVar string
	// Env is added to every worker's environment, after the test's own.
	Env []string
}

// Set is one test's worker processes, by name. Each start writes a log
// file of its own; a worker that exits without being signalled through
// the Set is a crash, reported with the end of its log by CheckCrashes.
// When the test ends, every worker still running is killed (SIGKILL) and
// the crashes are checked. Its methods are safe for concurrent use.
type Set struct {
	t      testing.TB
	cfg    Config
	logDir string

	mu      sync.Mutex
	procs   map[string]*Proc
	starts  int
	crashes []string
}

// Proc is one start of a worker process.
type Proc struct {
	Name string
	Cmd  *exec.Cmd
	Log  string // its stdout and stderr

	done     chan struct{} // closed once it exited
	stopping bool          // set (under Set.mu) before the Set signals it
}

// Pid is the process id of p.
func (p *Proc) Pid() int { return p.Cmd.Process.Pid }

// New returns the Set of test t, with no worker running yet.
func New(t testing.TB, cfg Config) *Set {
	t.Helper()
	dir := t.TempDir()
	if root := os.Getenv(cfg.LogDirVar); cfg.LogDirVar != "" && root != "" {
		dir = filepath.Join(root, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Logf("worker logs in %s", dir)
	}
	s := &Set{t: t, cfg: cfg, logDir: dir, procs: map[string]*Proc{}}
	// Also when the test fails early: a crash is often why.
	t.Cleanup(func() {
		s.SignalAll(syscall.SIGKILL)
		s.CheckCrashes()
	})
	return s
}

// Start starts worker name, consuming under that name, without waiting
// for it.
func (s *Set) Start(name string) { s.StartAs(name, name) }

// StartAs starts the worker known to the Set as name, consuming as
// consumer (two workers may share one, as in a misconfigured deployment,
// and a restarted one may take a new one, as a new pod would), with env
// added to its environment, without waiting for it. A worker already
// running under name is forgotten, not stopped.
func (s *Set) StartAs(name, consumer string, env ...string) {
	s.t.Helper()
	s.mu.Lock()
	s.starts++
	logPath := filepath.Join(s.logDir, fmt.Sprintf("%s.%d.log", name, s.starts))
	s.mu.Unlock()
	f, err := os.Create(logPath)
	if err != nil {
		s.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.v")
	cmd.Env = append(append(append(os.Environ(), s.cfg.Env...), s.cfg.ConsumerVar+"="+consumer), env...)
	cmd.Stdout, cmd.Stderr = f, f
	// A worker does not outlive the test binary, however that ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	p := &Proc{Name: name, Cmd: cmd, Log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		if !p.stopping {
			s.crashes = append(s.crashes, fmt.Sprintf("worker %s exited by itself (%v); end of %s:\n%s", name, err, logPath, tail(logPath, tailLines)))
			if s.procs[name] == p {
				delete(s.procs, name)
			}
		}
		s.mu.Unlock()
		close(p.done)
	}()
	s.mu.Lock()
	s.procs[name] = p
	s.mu.Unlock()
}

// Signal sends sig to worker name and waits for it to exit; it reports
// whether the worker was running. Its exit is not a crash, whatever sig.
func (s *Set) Signal(name string, sig syscall.Signal) bool {
	s.mu.Lock()
	p := s.procs[name]
	delete(s.procs, name)
	if p != nil {
		p.stopping = true
	}
	s.mu.Unlock()
	if p == nil {
		return false
	}
	_ = p.Cmd.Process.Signal(sig)
	<-p.done
	return true
}

// SignalAll sends sig to every running worker at once and waits until
// they all exited: SIGTERM stops them gracefully, at the end of a run.
func (s *Set) SignalAll(sig syscall.Signal) {
	var wg sync.WaitGroup
	for _, n := range s.Names() {
		wg.Go(func() { s.Signal(n, sig) })
	}
	wg.Wait()
}

// Names returns the names of the running workers, in no order.
func (s *Set) Names() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Collect(maps.Keys(s.procs))
}

// Proc returns running worker name, nil when none runs under it.
func (s *Set) Proc(name string) *Proc {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.procs[name]
}

// Pid returns the pid of worker name, 0 when it does not run.
func (s *Set) Pid(name string) int {
	if p := s.Proc(name); p != nil {
		return p.Pid()
	}
	return 0
}

// NameOf returns the name of the running worker of pid, "" when none.
func (s *Set) NameOf(pid int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	for n, p := range s.procs {
		if p.Pid() == pid {
			return n
		}
	}
	return ""
}

// Started reports whether worker name runs and its engine does (its log
// says so).
func (s *Set) Started(name string) bool {
	p := s.Proc(name)
	return p != nil && logged(p.Log)
}

// WaitStarted waits, a minute at most, until the engine of each worker of
// names runs, or with no names of every running worker, so that a test's
// first fault does not hit a process still connecting. A named worker that
// crashed never counts as started; with no names it no longer counts.
func (s *Set) WaitStarted(names ...string) {
	s.t.Helper()
	if len(names) == 0 {
		testutil.WaitFor(s.t, time.Minute, "every worker started", func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, p := range s.procs {
				if !logged(p.Log) {
					return false
				}
			}
			return true
		})
		return
	}
	testutil.WaitFor(s.t, time.Minute, "workers "+strings.Join(names, ", ")+" started", func() bool {
		for _, n := range names {
			if !s.Started(n) {
				return false
			}
		}
		return true
	})
}

// CheckCrashes fails the test for every worker that exited on its own
// since the last check.
func (s *Set) CheckCrashes() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.crashes {
		s.t.Error(c)
	}
	s.crashes = nil
}

// Logs returns the paths of the log files of every start so far.
func (s *Set) Logs() []string {
	logs, _ := filepath.Glob(filepath.Join(s.logDir, "*.log"))
	return logs
}

// Count counts the occurrences of text in the logs of every start so far.
func (s *Set) Count(text string) int {
	n := 0
	for _, path := range s.Logs() {
		b, _ := os.ReadFile(path)
		n += strings.Count(string(b), text)
	}
	return n
}

// Worker is what TestWorkerProcess calls first. In a worker that a Set
// started with consumerVar as its Config.ConsumerVar, it returns the
// consumer name and a context that ends at SIGTERM, the graceful stop
// (SIGKILL needs none); in the suite's own run, where the variable is
// unset, it skips t.
func Worker(t testing.TB, consumerVar string) (consumer string, ctx context.Context) {
	consumer = os.Getenv(consumerVar)
	if consumer == "" {
		t.Skip("worker process only")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	t.Cleanup(stop)
	return consumer, ctx
}

// logged reports whether the log at path says the engine started.
func logged(path string) bool {
	b, _ := os.ReadFile(path)
	return strings.Contains(string(b), startedLine)
}

// tail returns the last lines of the file at path, or why it could not.
func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}
