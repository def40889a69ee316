// Package faults_test checks Relay's delivery promise under faults: several
// worker processes consume one stream while they are killed with SIGKILL
// and restarted at random, and a ledger check afterwards compares Redis
// with what events.md guarantees.
package faults_test

import (
	"context"
	"encoding/json"
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

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

func TestMain(m *testing.M) { redistest.Main(m) }

const soakApp = `
image: unused
concurrency: 8
events:
  - {handler: ok.run, pattern: {kind: [ok]}, timeout: 1s}
  - {handler: flaky.run, pattern: {kind: [flaky]}, timeout: 1s, retries: 3}
  - {handler: bad.run, pattern: {kind: [bad]}, timeout: 1s, retries: 2}
`

// Worker-process settings, passed through the environment.
const (
	envWorker = "FAULTS_WORKER"
	envRedis  = "FAULTS_REDIS"
	envStream = "FAULTS_STREAM"
	envApps   = "FAULTS_APPS"
)

func workerOptions() []relay.Option {
	return []relay.Option{
		relay.WithMinPendingIdle(500 * time.Millisecond),
		relay.WithReclaimInterval(100 * time.Millisecond),
		relay.WithHeartbeatInterval(100 * time.Millisecond),
		relay.WithBackoff(50 * time.Millisecond),
		relay.WithLeaseGrace(300 * time.Millisecond),
		relay.WithConcurrencyWait(time.Second),
		relay.WithShutdownTimeout(time.Second),
	}
}

// TestWorkerProcess is not a test: the soak runs the test binary again with
// FAULTS_WORKER set to a consumer name, making this a worker process.
// Handlers record every run in Redis, so runs are counted across kills.
func TestWorkerProcess(t *testing.T) {
	consumer := os.Getenv(envWorker)
	if consumer == "" {
		t.Skip("worker process only")
	}
	rc := redistest.Connect(t, os.Getenv(envRedis))
	streamName := os.Getenv(envStream)
	apps, err := relay.LoadApps(os.Getenv(envApps))
	if err != nil {
		t.Fatal(err)
	}
	record := func(ctx context.Context, req runtime.Request) error {
		// A short random pause widens the window for a kill mid-handler.
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		// The ledger, not the handler, is under test: ride out a Redis
		// restart rather than fail the attempt.
		var err error
		for range 40 {
			if err = rc.Do(ctx, rc.B().Hincrby().Key(streamName+":runs").Field(req.MessageID+"/"+req.Handler).Increment(1).Build()).Error(); err == nil {
				return nil
			}
			time.Sleep(20 * time.Millisecond)
		}
		return err
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"soak/ok.run": record,
		"soak/flaky.run": func(ctx context.Context, req runtime.Request) error {
			if err := record(ctx, req); err != nil {
				return err
			}
			var ev struct{ Fail int }
			if err := json.Unmarshal(req.Event, &ev); err != nil {
				return err
			}
			if req.Attempt <= ev.Fail {
				return fmt.Errorf("planned failure %d of %d", req.Attempt, ev.Fail)
			}
			return nil
		},
		"soak/bad.run": func(ctx context.Context, req runtime.Request) error {
			if err := record(ctx, req); err != nil {
				return err
			}
			return fmt.Errorf("always fails")
		},
	})
	e, err := relay.New(apps, relay.Components{
		Source: stream.New(rc, streamName, "soak", consumer, stream.WithBlock(100*time.Millisecond)),
		State:  invocation.New(rc), Runner: runner, DLQ: dlq.NewWriter(rc, streamName),
		Stream: streamName, Group: "soak", Consumer: consumer,
	}, workerOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Run(context.Background()) // until killed
}

// worker is one running worker process.
type worker struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

type soak struct {
	t        *testing.T
	env      []string
	mu       sync.Mutex
	alive    map[string]*worker
	kills    int
	graceful int
	restarts int
	starts   int
}

func (s *soak) start(name string) { s.startAs(name, name) }

// startAs starts the worker process known as name, consuming as consumer.
func (s *soak) startAs(name, consumer string) {
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$")
	cmd.Env = append(append(os.Environ(), s.env...), envWorker+"="+consumer)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	w := &worker{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(w.done) }()
	s.mu.Lock()
	s.alive[name] = w
	s.starts++
	s.mu.Unlock()
}

func (s *soak) kill(name string, sig syscall.Signal) {
	s.mu.Lock()
	w := s.alive[name]
	delete(s.alive, name)
	switch {
	case w == nil:
	case sig == syscall.SIGKILL:
		s.kills++
	default:
		s.graceful++
	}
	s.mu.Unlock()
	if w == nil {
		return
	}
	_ = w.cmd.Process.Signal(sig)
	<-w.done
}

func soakEvents(def int) int {
	if v, err := strconv.Atoi(os.Getenv("RELAY_SOAK_EVENTS")); err == nil && v > 0 {
		return v
	}
	return def
}

func TestSoakWithRandomKills(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	runSoak(t, redistest.Addr(t), soakEvents(10000), func(s *soak, names []string) {
		// Mostly SIGKILL; every fourth stop is graceful (SIGTERM), which
		// must lose nothing either.
		victim := names[rand.IntN(len(names))]
		sig := syscall.SIGKILL
		if rand.IntN(4) == 0 {
			sig = syscall.SIGTERM
		}
		s.kill(victim, sig)
		s.start(victim)
	})
}

// TestSoakWithRedisRestarts restarts a private Redis (AOF, fsync always)
// under the workers: nothing may be lost or acked early, and the workers
// must carry on by themselves.
func TestSoakWithRedisRestarts(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	srv := redistest.Start(t, redistest.Options{AppendOnly: true})
	runSoak(t, srv.Addr, soakEvents(10000)/3, func(s *soak, _ []string) {
		srv.Kill()
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		time.Sleep(200 * time.Millisecond)
		srv.Restart(t)
		time.Sleep(time.Second)
	})
}

// runSoak runs three worker processes against addr, publishes events while
// fault runs again and again, then checks the ledger.
func runSoak(t *testing.T, addr string, events int, fault func(s *soak, names []string)) {
	rc := redistest.Connect(t, addr)
	streamName := redistest.Name(t, "soak")
	appsRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(appsRoot, "soak"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(appsRoot, "soak", relay.TemplateFile), []byte(soakApp), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	src := stream.New(rc, streamName, "soak", "publisher")
	if err := src.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	s := &soak{t: t, alive: map[string]*worker{},
		env: []string{envRedis + "=" + addr, envStream + "=" + streamName, envApps + "=" + appsRoot}}
	names := []string{"w1", "w2", "w3"}
	for _, n := range names {
		s.start(n)
	}
	// A misconfigured deployment: a second process with w1's consumer name.
	s.startAs("w1-twin", "w1")
	t.Cleanup(func() { s.kill("w1-twin", syscall.SIGKILL) })
	t.Cleanup(func() {
		for _, n := range names {
			s.kill(n, syscall.SIGKILL)
		}
	})

	// The ledger of what was published.
	kinds := map[string]string{} // message id -> kind
	fails := map[string]int{}    // flaky message id -> planned failures
	stopKills := make(chan struct{})
	killerDone := make(chan struct{})
	go func() {
		defer close(killerDone)
		for {
			select {
			case <-stopKills:
				return
			case <-time.After(time.Duration(300+rand.IntN(400)) * time.Millisecond):
			}
			fault(s, names)
		}
	}()
	for i := range events {
		kind := "ok"
		fail := 0
		switch r := rand.IntN(10); {
		case r < 2:
			kind, fail = "flaky", 1+rand.IntN(3)
		case r < 3:
			kind = "bad"
		}
		var id string
		err := retry(func() (err error) {
			id, err = src.Publish(ctx, map[string]string{"event": fmt.Sprintf(`{"kind":%q,"fail":%d,"n":%d}`, kind, fail, i)})
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		kinds[id] = kind
		fails[id] = fail
		if i%50 == 0 {
			time.Sleep(20 * time.Millisecond) // spread the load over the kills
		}
	}
	// Keep killing a little longer, then let the survivors drain.
	time.Sleep(2 * time.Second)
	close(stopKills)
	<-killerDone
	testutil.WaitFor(t, 3*time.Minute, "every entry acknowledged", func() bool {
		n, _, err := src.Pending(ctx)
		if err != nil || n != 0 {
			return false
		}
		info, err := rc.Do(ctx, rc.B().XinfoGroups().Key(streamName).Build()).ToArray()
		if err != nil || len(info) != 1 {
			return false
		}
		m, _ := info[0].AsMap()
		last := m["last-delivered-id"]
		l, _ := last.ToString()
		var newest string
		for id := range kinds {
			if stream.CompareID(id, newest) > 0 {
				newest = id
			}
		}
		return stream.CompareID(l, newest) >= 0
	})
	for _, n := range names {
		s.kill(n, syscall.SIGTERM)
	}

	// Ledger check.
	var runs map[string]int64
	err := retry(func() (err error) {
		runs, err = rc.Do(ctx, rc.B().Hgetall().Key(streamName+":runs").Build()).AsIntMap()
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := dlq.NewStore(rc, streamName).List(ctx, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	dlqByID := map[string][]dlq.Entry{}
	for _, e := range entries {
		dlqByID[e.OriginalID] = append(dlqByID[e.OriginalID], e)
	}
	state := invocation.New(rc)
	var minRuns, totalRuns int64
	var bad, problems, leaked, duplicates, exhaustedByKills int
	report := func(format string, args ...any) {
		problems++
		if problems <= 20 {
			t.Errorf(format, args...)
		}
	}
	for id, kind := range kinds {
		field := kind + ".run"
		n := runs[id+"/"+field]
		totalRuns += n
		st, err := state.Get(ctx, invocation.Key{Stream: streamName, Group: "soak", MessageID: id})
		if err != nil {
			t.Fatal(err)
		}
		v := st["soak/"+field]
		switch kind {
		case "ok", "flaky":
			// A flaky attempt killed before it recorded its run still counts
			// when its lease expires, so only one run is certain.
			minRuns++
			if n < 1 {
				report("%s (%s): never ran", id, kind)
			}
			switch {
			case v == "ok" && len(dlqByID[id]) == 0:
			case kind == "flaky" && strings.HasPrefix(v, "exhausted:4:") && strings.HasSuffix(v, ":dlq") && len(dlqByID[id]) >= 1:
				// A kill during an attempt uses it up (its lease expires);
				// with every attempt spent that way or planned to fail, the
				// invocation is rightly exhausted.
				exhaustedByKills++
			default:
				report("%s (%s): state %q with %d DLQ entries, want ok and none", id, kind, v, len(dlqByID[id]))
			}
		case "bad":
			bad++
			minRuns++
			es := dlqByID[id]
			if len(es) == 0 {
				report("%s (bad): no DLQ entry", id)
				continue
			}
			// A kill between the DLQ write and its marker makes the next
			// delivery write the entry again (docs/delivery.md): at least
			// once, like everything else.
			duplicates += len(es) - 1
			for _, e := range es {
				if e.HandlerAttempts != 3 || e.App != "soak" || e.Handler != "bad.run" {
					report("%s (bad): DLQ entry %+v, want soak/bad.run after 3 attempts", id, e)
				}
			}
			if !strings.HasSuffix(v, ":dlq") {
				report("%s (bad): state %q, want exhausted with its DLQ marker", id, v)
			}
		}
		if st["__terminal"] == "" {
			// A kill between XACK and retain leaks the hash (events.md);
			// it must then never expire early, so it has no TTL.
			leaked++
			ttl, err := rc.Do(ctx, rc.B().Pttl().Key(keys.Invocation(streamName, "soak", id)).Build()).AsInt64()
			if err != nil || ttl != -1 {
				report("%s: unretained state has TTL %dms (%v), want none", id, ttl, err)
			}
		}
	}
	// Each duplicate entry, leaked state or kill-exhausted invocation needs
	// a fault at one particular moment: a worker kill, or a Redis restart
	// cutting off a write that had executed (at most one per worker), so
	// more of them than that is a bug.
	if faults := s.kills + s.restarts*len(names); duplicates > faults || leaked > faults || exhaustedByKills > faults {
		report("%d duplicate DLQ entries, %d leaked states and %d kill-exhausted invocations from only %d kills and %d Redis restarts",
			duplicates, leaked, exhaustedByKills, s.kills, s.restarts)
	}
	t.Logf("soak: %d events (%d always failing), %d worker kills, %d graceful stops, %d Redis restarts, %d starts (one duplicate consumer name); %d handler runs recorded for %d invocations (%d beyond one each: retries and the at-least-once cost); %d DLQ entries (%d duplicates: a fault between the DLQ write and its marker); %d flaky invocations exhausted because kills used up attempts; %d states leaked by a kill between ack and retention",
		len(kinds), bad, s.kills, s.graceful, s.restarts, s.starts, totalRuns, minRuns, totalRuns-minRuns, len(entries), duplicates, exhaustedByKills, leaked)
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
