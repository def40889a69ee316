package worker_test

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// TestWorkerStreamRetention: with a 3s retention, 2,000 events acknowledged
// by the worker's group and a second group that read them all but holds
// the last 5 pending, the worker trims the stream down to those 5 (plus at
// most the approximate trim's slack), and they stay readable with their
// bodies. The relay_stream_trimmed_total counter says how many went.
func TestWorkerStreamRetention(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.StreamRetention = 3 * time.Second
	h.cfg.RetentionInterval = 100 * time.Millisecond
	rc := h.cfg.Redis
	name := h.streams[0]
	ctx := t.Context()
	// The second group exists before any entry, from id 0.
	other := redisstream.New(rc, name, "audit", "a1")
	if err := other.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	const n = 2000
	cmds := make(rueidis.Commands, 0, n)
	for range n {
		cmds = append(cmds, rc.B().Xadd().Key(name).Id("*").FieldValue().FieldValue("event", `{"event_name":"INSERT"}`).Build())
	}
	for _, r := range rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	// The other group reads everything and acknowledges all but the last 5.
	var read []stream.Message
	for len(read) < n {
		msgs, err := other.Read(ctx, 500)
		if err != nil {
			t.Fatal(err)
		}
		read = append(read, msgs...)
	}
	held := read[n-5:]
	var ackIDs []string
	for _, m := range read[:n-5] {
		ackIDs = append(ackIDs, m.ID)
	}
	if err := other.Ack(ctx, ackIDs...); err != nil {
		t.Fatal(err)
	}
	_, stop := h.run()
	testutil.WaitFor(t, 60*time.Second, "the worker to run every event", func() bool { return h.calls.Count("users/events.created") >= n })
	// Approximate trimming removes whole stream nodes (100 entries by
	// default) before the exact pass on the boundary node.
	testutil.WaitFor(t, 30*time.Second, "the stream trimmed to the held entries", func() bool {
		l, err := rc.Do(ctx, rc.B().Xlen().Key(name).Build()).AsInt64()
		return err == nil && l <= 5+100
	})
	for _, m := range held {
		rs, err := rc.Do(ctx, rc.B().Xrange().Key(name).Start(m.ID).End(m.ID).Build()).AsXRange()
		if err != nil || len(rs) != 1 || rs[0].FieldValues["event"] == "" {
			t.Errorf("held entry %s after the trim: %+v, %v; want it with its body", m.ID, rs, err)
		}
	}
	if got := h.counter("relay_stream_trimmed_total"); got < n-5-100 {
		t.Errorf("relay_stream_trimmed_total = %v, want about %d", got, n-5)
	}
	_ = stop()
}

// TestWorkerStuckGroupIsLogged: a consumer group that holds retention back
// for longer than the retention is named in a warning with its floor.
func TestWorkerStuckGroupIsLogged(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.StreamRetention = 500 * time.Millisecond
	h.cfg.RetentionInterval = 50 * time.Millisecond
	rc := h.cfg.Redis
	stuck := redisstream.New(rc, h.streams[0], "stuck", "s1")
	if err := stuck.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := stuck.Publish(t.Context(), map[string]string{"event": `{"event_name":"INSERT"}`}); err != nil {
		t.Fatal(err)
	}
	_, stop := h.run()
	testutil.WaitFor(t, 20*time.Second, "the stuck-group warning", func() bool {
		return strings.Contains(h.logs.String(), "a consumer group holds stream retention back") &&
			strings.Contains(h.logs.String(), "group=stuck")
	})
	_ = stop()
}

// TestWorkerDLQRetention: dead-letter entries older than the retention are
// trimmed, newer ones kept.
func TestWorkerDLQRetention(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.DLQRetention = 2 * time.Second
	h.cfg.RetentionInterval = 100 * time.Millisecond
	rc := h.cfg.Redis
	name := h.streams[0]
	// Three entries written an hour ago (their ids carry the time).
	old := time.Now().Add(-time.Hour).UnixMilli()
	for i := range 3 {
		if err := rc.Do(t.Context(), rc.B().Xadd().Key(keys.DLQ(name)).Id(strconv.FormatInt(old+int64(i), 10)+"-0").
			FieldValue().FieldValue("app", "users").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	_, stop := h.run()
	testutil.WaitFor(t, 20*time.Second, "old dead letters trimmed", func() bool {
		l, err := rc.Do(t.Context(), rc.B().Xlen().Key(keys.DLQ(name)).Build()).AsInt64()
		return err == nil && l == 0
	})
	if got := h.counter("relay_dlq_trimmed_total"); got != 3 {
		t.Errorf("relay_dlq_trimmed_total = %v, want 3", got)
	}
	_ = stop()
}

// TestWorkerRemovesIdleConsumers: consumers left behind by workers that
// restarted under other names are removed once idle for ConsumerIdle with
// nothing pending; one that still holds an entry pending stays, and so
// does the entry.
func TestWorkerRemovesIdleConsumers(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.ConsumerIdle = 300 * time.Millisecond
	h.cfg.RetentionInterval = 50 * time.Millisecond
	// No handler runs: the harness's worker must not take the entry.
	rc := h.cfg.Redis
	name := h.streams[0]
	src := redisstream.New(rc, name, "workers", "old-pod-1")
	if err := src.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"old-pod-1", "old-pod-2"} {
		if err := rc.Do(t.Context(), rc.B().XgroupCreateconsumer().Key(name).Group("workers").Consumer(c).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	id, err := src.Publish(t.Context(), map[string]string{"event": `{"event_name":"OTHER"}`})
	if err != nil {
		t.Fatal(err)
	}
	// old-pod-1 holds the entry pending (a worker that died mid-message).
	if err := rc.Do(t.Context(), rc.B().Xreadgroup().Group("workers", "old-pod-1").Count(1).Streams().Key(name).Id(">").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.cfg.Engine.MinPendingIdle = time.Hour // nobody reclaims it during the test
	_, stop := h.run()
	defer stop()
	consumers := func() []string {
		rows, err := rc.Do(t.Context(), rc.B().XinfoConsumers().Key(name).Group("workers").Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rows {
			m, _ := r.AsStrMap()
			out = append(out, m["name"])
		}
		return out
	}
	testutil.WaitFor(t, 20*time.Second, "old-pod-2 removed", func() bool {
		return !slices.Contains(consumers(), "old-pod-2")
	})
	if got := consumers(); !slices.Contains(got, "old-pod-1") || !slices.Contains(got, "w1") {
		t.Errorf("consumers %v, want old-pod-1 (an entry pending) and w1 (the worker) kept", got)
	}
	// The worker's own schedule may have an occurrence in flight (its
	// minute tick): only old-pod-1's part of the PEL is checked.
	pel, err := rc.Do(t.Context(), rc.B().Xpending().Key(name).Group("workers").Start("-").End("+").Count(10).Consumer("old-pod-1").Build()).ToArray()
	if err != nil || len(pel) != 1 {
		t.Fatalf("PEL of old-pod-1 %v, %v; want the one entry %s", pel, err, id)
	}
	if got, _ := pel[0].ToArray(); len(got) == 0 {
		t.Fatalf("PEL row %v", pel[0])
	} else if pid, _ := got[0].ToString(); pid != id {
		t.Errorf("old-pod-1's pending entry is %s, want %s", pid, id)
	}
	if !strings.Contains(h.logs.String(), "removed idle consumers") {
		t.Error("the removal was not logged")
	}
}

// TestWorkerJanitorRetainsLeakedState: a hash left without a TTL after its
// message was acknowledged (a worker that died in the ack-to-retain
// window) gets its retention from the janitor, or is deleted when the
// Engines delete state with the ack; the hash of a message still pending
// is left alone.
func TestWorkerJanitorRetainsLeakedState(t *testing.T) {
	for _, tc := range []struct {
		name      string
		retention time.Duration
	}{{"retained", 0}, {"deleted", relay.DeleteOnAck}} {
		t.Run(tc.name, func(t *testing.T) { testJanitor(t, tc.retention) })
	}
}

func testJanitor(t *testing.T, retention time.Duration) {
	h := newWorkerHarness(t, "events")
	h.cfg.JanitorInterval = 50 * time.Millisecond
	h.cfg.Engine.Retention = retention
	rc := h.cfg.Redis
	ctx := t.Context()
	name := h.streams[0]
	src := redisstream.New(rc, name, "workers", "old-worker")
	if err := src.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	// Two messages delivered to a worker that is gone: one it acked, one
	// still pending, each with state and no TTL.
	leaked, err := src.Publish(ctx, map[string]string{"event": `{"other":1}`})
	if err != nil {
		t.Fatal(err)
	}
	pending, err := src.Publish(ctx, map[string]string{"event": `{"other":2}`})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := src.Ack(ctx, leaked); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{leaked, pending} {
		if err := rc.Do(ctx, rc.B().Hset().Key(keys.Invocation(name, "workers", id)).FieldValue().FieldValue("users/events.created", "ok").Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	// Long enough that the worker does not reclaim the pending one.
	h.cfg.Engine.MinPendingIdle = time.Hour
	h.cfg.Engine.ReclaimInterval = time.Hour
	h.cfg.Engine.HeartbeatInterval = time.Minute
	_, stop := h.run()
	ttl := func(id string) int64 {
		n, err := rc.Do(ctx, rc.B().Pttl().Key(keys.Invocation(name, "workers", id)).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if retention == relay.DeleteOnAck {
		testutil.WaitFor(t, 20*time.Second, "the leaked hash deleted", func() bool { return ttl(leaked) == -2 })
	} else {
		testutil.WaitFor(t, 20*time.Second, "the leaked hash retained", func() bool { return ttl(leaked) > 0 })
	}
	if n := ttl(pending); n != -1 {
		t.Errorf("the pending message's state has TTL %dms; live state must keep none", n)
	}
	if got := h.counter("relay_invocation_state_repaired_total"); got != 1 {
		t.Errorf("relay_invocation_state_repaired_total = %v, want 1", got)
	}
	_ = stop()
}

// TestWorkerWarnsWhenRedisMayEvict: a Redis whose maxmemory-policy may
// evict keys is named in a warning at start.
func TestWorkerWarnsWhenRedisMayEvict(t *testing.T) {
	h := newWorkerHarness(t, "events")
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	if err := rc.Do(t.Context(), rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "volatile-lru").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	h.cfg.Redis = rc
	_, stop := h.run()
	testutil.WaitFor(t, 10*time.Second, "the eviction warning", func() bool {
		return strings.Contains(h.logs.String(), "Redis may evict keys") && strings.Contains(h.logs.String(), "maxmemory_policy=volatile-lru")
	})
	// volatile-* evicts only keys with a TTL: never the stream.
	if !strings.Contains(h.logs.String(), `may_evict="retained invocation state and dedup keys (keys with a TTL)"`) {
		t.Errorf("the warning does not say what volatile-lru may evict:\n%s", h.logs.String())
	}
	_ = stop()
}

// TestWorkerWarnsWhenThePolicyChangesToEvict: a CONFIG SET after start to
// a policy that evicts is warned about at the next check, once; going back
// to noeviction is logged too.
func TestWorkerWarnsWhenThePolicyChangesToEvict(t *testing.T) {
	h := newWorkerHarness(t, "events")
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	h.cfg.Redis = rc
	h.cfg.PolicyCheckInterval = 20 * time.Millisecond
	_, stop := h.run()
	defer func() { _ = stop() }()
	setPolicy := func(p string) {
		if err := rc.Do(t.Context(), rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", p).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond) // a few checks under noeviction
	if strings.Contains(h.logs.String(), "Redis may evict keys") {
		t.Fatalf("warned under noeviction:\n%s", h.logs.String())
	}
	setPolicy("allkeys-lru")
	testutil.WaitFor(t, 10*time.Second, "the eviction warning after the change", func() bool {
		return strings.Contains(h.logs.String(), "maxmemory_policy=allkeys-lru")
	})
	setPolicy("noeviction")
	testutil.WaitFor(t, 10*time.Second, "the return to noeviction logged", func() bool {
		return strings.Contains(h.logs.String(), `msg="Redis no longer evicts keys (maxmemory-policy is noeviction)"`)
	})
	if n := strings.Count(h.logs.String(), "Redis may evict keys"); n != 1 {
		t.Errorf("warned %d times for one change, want once:\n%s", n, h.logs.String())
	}
}

// TestUnreadablePolicyNotedOnce: a Redis user that may not run INFO makes
// the policy unreadable at every check; that is said once, at start, not
// at every PolicyCheckInterval.
func TestUnreadablePolicyNotedOnce(t *testing.T) {
	h := newWorkerHarness(t, "events")
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	if err := admin.Do(t.Context(), admin.B().AclSetuser().Username("noinfo").Rule("on", "nopass", "~*", "&*", "+@all", "-info").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: "noinfo", DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	h.cfg.Redis = rc
	h.cfg.PolicyCheckInterval = 10 * time.Millisecond
	_, stop := h.run()
	defer func() { _ = stop() }()
	const line = "cannot read Redis's maxmemory-policy"
	testutil.WaitFor(t, 10*time.Second, "the policy noted unreadable", func() bool { return strings.Contains(h.logs.String(), line) })
	time.Sleep(200 * time.Millisecond) // many checks
	if n := strings.Count(h.logs.String(), line); n != 1 {
		t.Errorf("noted %d times, want once:\n%s", n, h.logs.String())
	}
}
