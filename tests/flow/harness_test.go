package flow_test

import (
	"context"
	"encoding/json"
	"fmt"
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

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

// cluster is one test's stream, its consumer group and the worker
// processes that consume it.
type cluster struct {
	t      *testing.T
	rc     rueidis.Client
	stream string
	src    *redisstream.Source // the publisher's
	env    []string
	logDir string

	mu     sync.Mutex
	procs  map[string]*proc
	starts int
	// deaths maps the pid of each worker the test killed to the time
	// (Redis clock, µs) by which it was dead.
	deaths  map[int]int64
	crashes []string
}

// proc is one worker process.
type proc struct {
	name     string
	cmd      *exec.Cmd
	log      string
	done     chan struct{}
	stopping bool // set (under cluster.mu) before the test signals it
}

// newCluster makes a stream with the test's consumer group on the shared
// Redis, and an apps root holding templates (app name to template.yaml);
// its workers will run with tm. Every worker still running is killed when
// the test ends, and one that exited by itself fails the test.
func newCluster(t *testing.T, templates map[string]string, tm timings) *cluster {
	t.Helper()
	addr := redistest.Addr(t)
	rc := redistest.Connect(t, addr)
	streamName := redistest.Name(t, "flow")
	root := t.TempDir()
	for name, tmpl := range templates {
		if err := os.MkdirAll(filepath.Join(root, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name, app.TemplateFile), []byte(tmpl), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := redisstream.New(rc, streamName, flowGroup, "publisher")
	if err := src.EnsureGroup(context.Background()); err != nil {
		t.Fatal(err)
	}
	tmJSON, err := json.Marshal(tm)
	if err != nil {
		t.Fatal(err)
	}
	logDir := t.TempDir()
	if root := os.Getenv("FLOW_LOG_DIR"); root != "" {
		logDir = filepath.Join(root, t.Name())
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Logf("worker logs in %s", logDir)
	}
	c := &cluster{
		t: t, rc: rc, stream: streamName, src: src, logDir: logDir,
		env:   []string{envRedis + "=" + addr, envStream + "=" + streamName, envApps + "=" + root, envTimings + "=" + string(tmJSON)},
		procs: map[string]*proc{}, deaths: map[int]int64{},
	}
	t.Cleanup(func() {
		c.mu.Lock()
		var names []string
		for n := range c.procs {
			names = append(names, n)
		}
		c.mu.Unlock()
		for _, n := range names {
			c.signal(n, syscall.SIGKILL)
		}
		c.checkCrashes()
	})
	return c
}

// startWorkers starts the worker processes names and waits until each one's
// engine runs.
func (c *cluster) startWorkers(names ...string) {
	c.t.Helper()
	for _, n := range names {
		c.start(n)
	}
	c.waitStarted(names...)
}

// start starts worker process name, consuming under that name, without
// waiting for it.
func (c *cluster) start(name string) {
	c.t.Helper()
	c.mu.Lock()
	c.starts++
	logPath := filepath.Join(c.logDir, fmt.Sprintf("%s.%d.log", name, c.starts))
	c.mu.Unlock()
	f, err := os.Create(logPath)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.v")
	cmd.Env = append(append(os.Environ(), c.env...), envWorker+"="+name)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		c.mu.Lock()
		if !p.stopping {
			c.crashes = append(c.crashes, fmt.Sprintf("worker %s exited by itself (%v); end of %s:\n%s", name, err, logPath, tail(logPath, 30)))
			if c.procs[name] == p {
				delete(c.procs, name)
			}
		}
		c.mu.Unlock()
		close(p.done)
	}()
	c.mu.Lock()
	c.procs[name] = p
	c.mu.Unlock()
}

// waitStarted waits until the engine of each worker of names runs (its
// log says so).
func (c *cluster) waitStarted(names ...string) {
	c.t.Helper()
	testutil.WaitFor(c.t, time.Minute, "workers "+strings.Join(names, ", ")+" started", func() bool {
		for _, n := range names {
			if !c.started(n) {
				return false
			}
		}
		return true
	})
}

// started reports whether worker name's engine runs (its log says so).
func (c *cluster) started(name string) bool {
	c.mu.Lock()
	p := c.procs[name]
	c.mu.Unlock()
	if p == nil {
		return false
	}
	b, _ := os.ReadFile(p.log)
	return strings.Contains(string(b), `msg="engine started"`)
}

// pid returns the pid of worker name, 0 when it does not run.
func (c *cluster) pid(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.procs[name]; p != nil {
		return p.cmd.Process.Pid
	}
	return 0
}

// nameOf returns the name of the running worker of pid, "" when none.
func (c *cluster) nameOf(pid int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	for n, p := range c.procs {
		if p.cmd.Process.Pid == pid {
			return n
		}
	}
	return ""
}

// kill kills worker name with SIGKILL, waits for it to exit and records
// by when (Redis clock) its pid was dead. It returns that time.
func (c *cluster) kill(name string) time.Time {
	pid := c.pid(name)
	c.signal(name, syscall.SIGKILL)
	at := c.now()
	c.mu.Lock()
	c.deaths[pid] = at.UnixMicro()
	c.mu.Unlock()
	return at
}

// killed reports whether the test killed the worker of pid, and by when
// it was dead (Unix µs, Redis clock).
func (c *cluster) killed(pid int) (int64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	at, ok := c.deaths[pid]
	return at, ok
}

// kills is how many workers the test killed.
func (c *cluster) kills() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.deaths)
}

func (c *cluster) signal(name string, sig syscall.Signal) {
	c.mu.Lock()
	p := c.procs[name]
	delete(c.procs, name)
	if p != nil {
		p.stopping = true
	}
	c.mu.Unlock()
	if p == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	<-p.done
}

// checkCrashes fails the test for every worker that exited on its own.
func (c *cluster) checkCrashes() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, s := range c.crashes {
		c.t.Error(s)
	}
	c.crashes = nil
}

// now is the Redis server's clock, which the probe's records and the
// state store's leases use.
func (c *cluster) now() time.Time {
	c.t.Helper()
	ts, err := c.rc.Do(context.Background(), c.rc.B().Time().Build()).AsStrSlice()
	if err != nil || len(ts) != 2 {
		c.t.Fatalf("TIME: %v %v", ts, err)
	}
	s, _ := strconv.ParseInt(ts[0], 10, 64)
	us, _ := strconv.ParseInt(ts[1], 10, 64)
	return time.Unix(s, us*1000)
}

// publish appends event, marshalled to JSON, to the stream and returns its
// id. Safe for concurrent use.
func (c *cluster) publish(event any) string {
	b, err := json.Marshal(event)
	if err != nil {
		panic(err)
	}
	id, err := c.src.Publish(context.Background(), map[string]string{"event": string(b)})
	if err != nil {
		panic(fmt.Sprintf("publish: %v", err))
	}
	return id
}

// waitSettled waits until every entry up to last was delivered and
// acknowledged: nothing is pending in the group.
func (c *cluster) waitSettled(last string, timeout time.Duration) {
	c.t.Helper()
	testutil.WaitFor(c.t, timeout, "every entry up to "+last+" acknowledged", func() bool {
		return redistest.Settled(context.Background(), c.rc, c.stream, flowGroup, last)
	})
}

// state returns the value of invocation field ("<app>/<handler>") of
// message id, "" when there is none.
func (c *cluster) state(id, field string) string {
	c.t.Helper()
	v, err := c.rc.Do(context.Background(), c.rc.B().Hget().Key(keys.Invocation(c.stream, flowGroup, id)).Field(field).Build()).ToString()
	if err != nil && !rueidis.IsRedisNil(err) {
		c.t.Fatal(err)
	}
	return v
}

// dlqEntry is one entry of the stream's dead-letter stream, its wire
// fields (docs/delivery.md#dead-letter-queue).
type dlqEntry struct {
	id     string
	fields map[string]string
}

// dlq reads the stream's dead-letter entries.
func (c *cluster) dlq() []dlqEntry {
	c.t.Helper()
	es, err := c.rc.Do(context.Background(), c.rc.B().Xrange().Key(keys.DLQ(c.stream)).Start("-").End("+").Build()).AsXRange()
	if err != nil && !rueidis.IsRedisNil(err) {
		c.t.Fatal(err)
	}
	out := make([]dlqEntry, 0, len(es))
	for _, e := range es {
		out = append(out, dlqEntry{id: e.ID, fields: e.FieldValues})
	}
	return out
}

// wantNoDLQ fails the test for every dead-letter entry of the stream.
func (c *cluster) wantNoDLQ() {
	c.t.Helper()
	for _, e := range c.dlq() {
		c.t.Errorf("dead-letter entry %s: %s/%s of %s, reason %q", e.id, e.fields["app"], e.fields["handler"], e.fields["original_id"], e.fields["reason"])
	}
}

// slotsHeld is how many slots of the rule of field hold limit key key now
// (ZCARD of the slots key, keys.Limit).
func (c *cluster) slotsHeld(field, key string) int64 {
	c.t.Helper()
	n, err := c.rc.Do(context.Background(), c.rc.B().Zcard().Key(keys.Limit(c.stream, flowGroup, "slots", field, key)).Build()).AsInt64()
	if err != nil {
		c.t.Fatal(err)
	}
	return n
}

// runs reads the probe's runs of appName.
func (c *cluster) runs(appName string) []run {
	c.t.Helper()
	return runs(c.t, c.rc, c.stream, appName)
}

// endOrDeath is the end of r, or for a run that never ended the time by
// which its worker was killed; a run that never ended in a worker that was
// not killed fails the test.
func (c *cluster) endOrDeath(r run) int64 {
	if r.ended() {
		return r.end
	}
	if at, ok := c.killed(r.pid); ok {
		return at
	}
	c.t.Errorf("run of %s attempt %d in pid %d never ended, and its worker was not killed", r.id, r.attempt, r.pid)
	return r.start
}

func tail(path string, lines int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	all := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(all[max(0, len(all)-lines):], "\n")
}

// entryMS is the time in stream entry id, Unix ms.
func entryMS(t *testing.T, id string) int64 {
	t.Helper()
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		t.Fatalf("stream id %q", id)
	}
	return mustInt(t, ms)
}
