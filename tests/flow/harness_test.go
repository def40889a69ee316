package flow_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/internal/workerproc"
	"github.com/relaydev/relay/stream/redisstream"
)

// cluster is one test's stream, its consumer group and the worker
// processes that consume it.
type cluster struct {
	t      *testing.T
	rc     rueidis.Client
	stream string
	src    *redisstream.Source // the publisher's
	procs  *workerproc.Set

	mu sync.Mutex
	// deaths maps the pid of each worker the test killed to the time
	// (Redis clock, µs) by which it was dead.
	deaths map[int]int64
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
	root := testutil.AppsRoot(t, templates)
	src := redisstream.New(rc, streamName, flowGroup, "publisher")
	if err := src.EnsureGroup(context.Background()); err != nil {
		t.Fatal(err)
	}
	tmJSON, err := json.Marshal(tm)
	if err != nil {
		t.Fatal(err)
	}
	procs := workerproc.New(t, workerproc.Config{
		ConsumerVar: envWorker, LogDirVar: "FLOW_LOG_DIR",
		Env: []string{envRedis + "=" + addr, envStream + "=" + streamName, envApps + "=" + root, envTimings + "=" + string(tmJSON)},
	})
	return &cluster{t: t, rc: rc, stream: streamName, src: src, procs: procs, deaths: map[int]int64{}}
}

// startWorkers starts the worker processes names and waits until each one's
// engine runs.
func (c *cluster) startWorkers(names ...string) {
	c.t.Helper()
	for _, n := range names {
		c.start(n)
	}
	c.procs.WaitStarted(names...)
}

// start starts worker process name, consuming under that name, without
// waiting for it.
func (c *cluster) start(name string) {
	c.t.Helper()
	c.procs.Start(name)
}

// started reports whether worker name's engine runs (its log says so).
func (c *cluster) started(name string) bool { return c.procs.Started(name) }

// nameOf returns the name of the running worker of pid, "" when none.
func (c *cluster) nameOf(pid int) string { return c.procs.NameOf(pid) }

// kill kills worker name with SIGKILL, waits for it to exit and records
// by when (Redis clock) its pid was dead. It returns that time.
func (c *cluster) kill(name string) time.Time {
	pid := c.procs.Pid(name)
	c.procs.Signal(name, syscall.SIGKILL)
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

// checkCrashes fails the test for every worker that exited on its own.
func (c *cluster) checkCrashes() { c.procs.CheckCrashes() }

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

// entryMS is the time in stream entry id, Unix ms.
func entryMS(t *testing.T, id string) int64 {
	t.Helper()
	ms, _, ok := strings.Cut(id, "-")
	if !ok {
		t.Fatalf("stream id %q", id)
	}
	return mustInt(t, ms)
}
