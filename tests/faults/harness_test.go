package faults_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// worker is one running worker process.
type worker struct {
	name     string
	cmd      *exec.Cmd
	log      string
	done     chan struct{}
	stopping bool // set (under soak.mu) before the soak signals it
}

// soak runs worker processes and counts the faults it injects.
type soak struct {
	t      *testing.T
	env    []string
	logDir string
	// workerEnv, when set, adds to the environment of worker name.
	workerEnv func(name string) []string

	// faultMu serialises faults: a kill, a restart or a deletion of
	// pending entries happens while no other is under way.
	faultMu sync.Mutex

	mu                 sync.Mutex
	alive              map[string]*worker
	kills              int // SIGKILL
	killsMidHandler    int // SIGKILL while the victim had a handler container running
	graceful           int // SIGTERM, before the soak's final stop
	restarts           int // workers started again after a kill or stop
	redisRestarts      int
	containerdRestarts int
	starts             int
	crashes            []string // workers that exited without being told to
}

// newSoak returns a soak whose workers get env. Their logs go to a
// temporary directory, or to FAULTS_LOG_DIR/<test name> when that is set,
// where they are kept for a look after the run.
func newSoak(t *testing.T, env ...string) *soak {
	dir := t.TempDir()
	if root := os.Getenv("FAULTS_LOG_DIR"); root != "" {
		dir = filepath.Join(root, t.Name())
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Logf("worker logs in %s", dir)
	}
	s := &soak{t: t, env: env, logDir: dir, alive: map[string]*worker{}}
	// Also when the test fails early: a crash is often why.
	t.Cleanup(s.checkCrashes)
	return s
}

// waitStarted waits until every live worker's engine runs (its log says
// so), so that the first fault does not hit a process still connecting.
func (s *soak) waitStarted() {
	s.t.Helper()
	testutil.WaitFor(s.t, time.Minute, "every worker started", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, w := range s.alive {
			b, _ := os.ReadFile(w.log)
			if !strings.Contains(string(b), `msg="engine started"`) {
				return false
			}
		}
		return true
	})
}

func (s *soak) start(name string) { s.startAs(name, name) }

// startWorkers starts the worker processes names, each consuming under its
// own name, and waits until every one runs; they are killed when the test
// ends, whatever became of them.
func (s *soak) startWorkers(names ...string) {
	for _, n := range names {
		s.start(n)
	}
	s.t.Cleanup(func() {
		for _, n := range names {
			s.signal(n, syscall.SIGKILL, false)
		}
	})
	s.waitStarted()
}

// startAs starts the worker process known as name, consuming as consumer.
// Its output goes to a log file, shown when it exits on its own.
func (s *soak) startAs(name, consumer string) {
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
	cmd.Env = append(append(os.Environ(), s.env...), envWorker+"="+consumer)
	if s.workerEnv != nil {
		cmd.Env = append(cmd.Env, s.workerEnv(name)...)
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	w := &worker{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		s.mu.Lock()
		if !w.stopping {
			s.crashes = append(s.crashes, fmt.Sprintf("worker %s exited by itself (%v); end of %s:\n%s", name, err, logPath, tail(logPath, 30)))
			if s.alive[name] == w {
				delete(s.alive, name)
			}
		}
		s.mu.Unlock()
		close(w.done)
	}()
	s.mu.Lock()
	s.alive[name] = w
	s.mu.Unlock()
}

// restart stops worker name with sig and starts it again.
func (s *soak) restart(name string, sig syscall.Signal) {
	s.kill(name, sig)
	s.mu.Lock()
	s.restarts++
	s.mu.Unlock()
	s.start(name)
}

// kill signals worker name and waits for it to exit; it is counted as a
// fault.
func (s *soak) kill(name string, sig syscall.Signal) { s.signal(name, sig, true) }

func (s *soak) signal(name string, sig syscall.Signal, fault bool) {
	s.mu.Lock()
	w := s.alive[name]
	delete(s.alive, name)
	switch {
	case w == nil || !fault:
	case sig == syscall.SIGKILL:
		s.kills++
	default:
		s.graceful++
	}
	if w != nil {
		w.stopping = true
	}
	s.mu.Unlock()
	if w == nil {
		return
	}
	_ = w.cmd.Process.Signal(sig)
	<-w.done
}

// stopAll stops every worker gracefully, at the end of a soak, and waits
// for them.
func (s *soak) stopAll() {
	s.mu.Lock()
	var names []string
	for n := range s.alive {
		names = append(names, n)
	}
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range names {
		wg.Go(func() { s.signal(n, syscall.SIGTERM, false) })
	}
	wg.Wait()
}

// logLinesOf logs the lines of every worker's log that name id (a
// container left behind, say), to show what the workers did with it.
func (s *soak) logLinesOf(id string) {
	logs, _ := filepath.Glob(filepath.Join(s.logDir, "*.log"))
	for _, path := range logs {
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) {
				s.t.Logf("%s: %s", filepath.Base(path), line)
			}
		}
	}
}

// countLogLines counts the lines of every worker's log that contain text.
func (s *soak) countLogLines(text string) int {
	n := 0
	logs, _ := filepath.Glob(filepath.Join(s.logDir, "*.log"))
	for _, path := range logs {
		b, _ := os.ReadFile(path)
		n += strings.Count(string(b), text)
	}
	return n
}

// checkCrashes fails the test for every worker that exited on its own
// since the last check.
func (s *soak) checkCrashes() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.crashes {
		s.t.Error(c)
	}
	s.crashes = nil
}

// fault runs f while no other fault is under way.
func (s *soak) fault(f func()) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f()
}

// faultEvery runs f as a fault every "every" plus up to jitter, until the
// returned stop, which waits for the fault under way to end.
func (s *soak) faultEvery(every, jitter time.Duration, f func()) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-quit:
				return
			case <-time.After(every + rand.N(jitter)):
			}
			s.fault(f)
		}
	}()
	return func() { close(quit); <-done }
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// ghostReadScript publishes one event and reads up to ARGV[4] new entries
// as the consumer ARGV[3] of group ARGV[2], in one step, so the reader is
// sure to get at least the entry just added even while workers block on
// the stream. It stands in for a worker that took entries and died before
// handling them.
//
// KEYS[1] stream; ARGV[1] event JSON. Returns {published id, read ids...}.
var ghostReadScript = rueidis.NewLuaScript(`
local id = redis.call('XADD', KEYS[1], '*', 'event', ARGV[1])
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[2], ARGV[3], 'COUNT', ARGV[4], 'STREAMS', KEYS[1], '>')
local ids = {id}
for _, e in ipairs(reply[1][2]) do
  table.insert(ids, e[1])
end
return ids
`)

// deleteWhilePending makes one entry pending for a consumer that never
// handles it and deletes it from the stream (XDEL), as an operator racing
// the workers would. A second entry the ghost read, if any, is left pending
// for the workers to reclaim and handle. It publishes event and returns its
// id and the deleted id. Kills are paused (the caller holds faultMu) until
// the workers' reclaim found the deletion and the engines' counter of it
// reached Redis, so that no count is lost with a killed process.
func deleteWhilePending(t *testing.T, rc rueidis.Client, streamName, event string, deletedSoFar int) (published, deleted string) {
	ctx := context.Background()
	var ids []string
	err := retry(func() (err error) {
		ids, err = ghostReadScript.Exec(ctx, rc, []string{streamName}, []string{event, soakGroup, "ghost", "2"}).AsStrSlice()
		return err
	})
	if err != nil || len(ids) < 2 {
		t.Fatalf("ghost read of %s: %v %v", streamName, ids, err)
	}
	published, deleted = ids[0], ids[1]
	// Let it sit in the PEL for a moment: deleted while pending, not at once.
	time.Sleep(100 * time.Millisecond)
	err = retry(func() error { return rc.Do(ctx, rc.B().Xdel().Key(streamName).Id(deleted).Build()).Error() })
	if err != nil {
		t.Fatal(err)
	}
	want := deletedSoFar + 1
	deadline := time.Now().Add(30 * time.Second)
	for {
		reported, _ := rc.Do(ctx, rc.B().Sismember().Key(ledgerKey(streamName, keyMissing)).Member(deleted).Build()).AsBool()
		if reported && missingMetricSum(ctx, rc, streamName) >= want {
			return published, deleted
		}
		if time.Now().After(deadline) {
			t.Errorf("deleted pending entry %s: after 30s reported by a reclaim: %v, missing_payload_total %d, want %d",
				deleted, reported, missingMetricSum(ctx, rc, streamName), want)
			return published, deleted
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// missingMetricSum adds up relay_missing_payload_total of every worker
// process that ever ran.
func missingMetricSum(ctx context.Context, rc rueidis.Client, streamName string) int {
	m, _ := rc.Do(ctx, rc.B().Hgetall().Key(ledgerKey(streamName, keyMissingMetric)).Build()).AsStrMap()
	sum := 0.0
	for _, v := range m {
		f, _ := strconv.ParseFloat(v, 64)
		sum += f
	}
	return int(sum)
}

// waitQuiet waits until every entry up to newest was delivered and
// acknowledged.
func waitQuiet(t *testing.T, rc rueidis.Client, src *redisstream.Source, newest string, timeout time.Duration) {
	ctx := context.Background()
	testutil.WaitFor(t, timeout, "every entry acknowledged", func() bool {
		n, _, err := src.Pending(ctx)
		if err != nil || n != 0 {
			return false
		}
		info, err := rc.Do(ctx, rc.B().XinfoGroups().Key(src.Stream()).Build()).ToArray()
		if err != nil || len(info) != 1 {
			return false
		}
		m, _ := info[0].AsMap()
		last := m["last-delivered-id"]
		l, _ := last.ToString()
		return stream.CompareID(l, newest) >= 0
	})
}

// publish appends event to the stream and returns its id. A retry after an
// error first looks for the event among the newest entries: a Redis restart
// can cut off the reply of an XADD that was applied, and publishing again
// would add an entry the ledger does not know. Events must be unique.
func publish(t *testing.T, rc rueidis.Client, src *redisstream.Source, event string) string {
	t.Helper()
	// rueidis retries a read on a broken connection for as long as its
	// context lasts: bounded, so that a Redis that never comes back fails
	// the soak instead of hanging it.
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	var id string
	tries := 0
	err := retry(func() (err error) {
		if tries++; tries > 1 {
			recent, err := rc.Do(ctx, rc.B().Xrevrange().Key(src.Stream()).End("+").Start("-").Count(100).Build()).AsXRange()
			if err != nil {
				return err
			}
			for _, e := range recent {
				if e.FieldValues["event"] == event {
					id = e.ID
					return nil
				}
			}
		}
		id, err = src.Publish(ctx, map[string]string{"event": event})
		return err
	})
	if err != nil {
		t.Fatalf("publish %s: %v", event, err)
	}
	return id
}

// retry runs op until it succeeds or 30s pass: the publisher and the ledger
// reader ride out a Redis restart too.
func retry(op func() error) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := op()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(50 * time.Millisecond)
	}
}
