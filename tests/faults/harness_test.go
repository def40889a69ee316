package faults_test

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/internal/workerproc"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// soak runs worker processes and counts the faults it injects.
type soak struct {
	t     *testing.T
	procs *workerproc.Set
	// workerEnv, when set, adds to the environment of worker name.
	workerEnv func(name string) []string

	// faultMu serialises faults: a kill, a restart or a deletion of
	// pending entries happens while no other is under way.
	faultMu sync.Mutex

	mu                 sync.Mutex
	kills              int // SIGKILL
	killsMidHandler    int // SIGKILL while the victim had a handler container running
	graceful           int // SIGTERM, before the soak's final stop
	restarts           int // workers started again after a kill or stop
	redisRestarts      int
	containerdRestarts int
}

// newSoak returns a soak whose workers get env. Their logs go to a
// temporary directory, or to FAULTS_LOG_DIR/<test name> when that is set,
// where they are kept for a look after the run. Workers still running
// when the test ends are killed, and one that exited by itself fails the
// test, also when it fails early: a crash is often why.
func newSoak(t *testing.T, env ...string) *soak {
	procs := workerproc.New(t, workerproc.Config{ConsumerVar: envWorker, LogDirVar: "FAULTS_LOG_DIR", Env: env})
	return &soak{t: t, procs: procs}
}

// waitStarted waits until every live worker's engine runs (its log says
// so), so that the first fault does not hit a process still connecting.
func (s *soak) waitStarted() {
	s.t.Helper()
	s.procs.WaitStarted()
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
	var env []string
	if s.workerEnv != nil {
		env = s.workerEnv(name)
	}
	s.procs.StartAs(name, consumer, env...)
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

// signal signals worker name and waits for it to exit; a fault, when it
// ran, is counted as a kill (SIGKILL) or a graceful stop.
func (s *soak) signal(name string, sig syscall.Signal, fault bool) {
	if !s.procs.Signal(name, sig) || !fault {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if sig == syscall.SIGKILL {
		s.kills++
	} else {
		s.graceful++
	}
}

// stopAll stops every worker gracefully, at the end of a soak, and waits
// for them.
func (s *soak) stopAll() { s.procs.SignalAll(syscall.SIGTERM) }

// logLinesOf logs the lines of every worker's log that name id (a
// container left behind, say), to show what the workers did with it.
func (s *soak) logLinesOf(id string) {
	for _, path := range s.procs.Logs() {
		b, _ := os.ReadFile(path)
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, id) {
				s.t.Logf("%s: %s", filepath.Base(path), line)
			}
		}
	}
}

// countLogLines counts the lines of every worker's log that contain text.
func (s *soak) countLogLines(text string) int { return s.procs.Count(text) }

// checkCrashes fails the test for every worker that exited on its own
// since the last check.
func (s *soak) checkCrashes() { s.procs.CheckCrashes() }

// fault runs f while no other fault is under way.
func (s *soak) fault(f func()) {
	s.faultMu.Lock()
	defer s.faultMu.Unlock()
	f()
}

// faultEvery runs f as a fault every "every" plus up to jitter, until the
// returned stop, which waits for the fault under way to end.
func (s *soak) faultEvery(every, jitter time.Duration, f func()) (stop func()) {
	return testutil.Every(every, jitter, func() { s.fault(f) })
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
