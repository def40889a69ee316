package worker_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
)

// TestWorkerWarnsWhenTheMemoryProjectionIsOverBudget: 600 events of 1 KB in
// the last minute with a 24h stream retention project about 1.7 GB, over
// 90% of a 64 MiB maxmemory: the worker warns once, naming the source
// stream and REDIS_STREAM_RETENTION, however many checks follow, and
// exports the projection and maxmemory as gauges. Raising maxmemory is
// logged as back under budget; lowering it again warns again.
func TestWorkerWarnsWhenTheMemoryProjectionIsOverBudget(t *testing.T) {
	h := newWorkerHarness(t, "events")
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	ctx := t.Context()
	setMax := func(n int64) {
		t.Helper()
		if err := rc.Do(ctx, rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", strconv.FormatInt(n, 10)).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	const limit = 64 << 20
	setMax(limit)
	h.cfg.Redis = rc
	h.cfg.StreamRetention = 24 * time.Hour
	h.cfg.MemoryCheckInterval = 20 * time.Millisecond
	body := `{"event_name":"OTHER","pad":"` + strings.Repeat("x", 1000) + `"}`
	cmds := make(rueidis.Commands, 0, 600)
	for range 600 {
		cmds = append(cmds, rc.B().Xadd().Key(h.streams[0]).Id("*").FieldValue().FieldValue("event", body).Build())
	}
	for _, r := range rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	_, stop := h.run()
	defer func() { _ = stop() }()
	const warning = "projected Redis memory is over 90% of maxmemory"
	testutil.WaitFor(t, 10*time.Second, "the over-budget warning", func() bool { return strings.Contains(h.logs.String(), warning) })
	logs := h.logs.String()
	if !strings.Contains(logs, `part="source stream"`) || !strings.Contains(logs, "lower REDIS_STREAM_RETENTION") {
		t.Errorf("the warning does not name the stream and its retention:\n%s", logs)
	}
	if p := h.gauge("relay_redis_memory_projected_bytes"); p < 0.9*limit {
		t.Errorf("relay_redis_memory_projected_bytes = %v, want over 90%% of %d", p, limit)
	}
	if m := h.gauge("relay_redis_maxmemory_bytes"); m != limit {
		t.Errorf("relay_redis_maxmemory_bytes = %v, want %d", m, limit)
	}
	// The memory in use beside them: relay health also fails when it is
	// over 90% of maxmemory, which the projection alone can miss.
	if u := h.gauge("relay_redis_used_memory_bytes"); u <= 0 || u > limit {
		t.Errorf("relay_redis_used_memory_bytes = %v, want Redis's used_memory, under %d", u, limit)
	}
	time.Sleep(200 * time.Millisecond) // many checks with the same verdict
	if n := strings.Count(h.logs.String(), warning); n != 1 {
		t.Fatalf("warned %d times for one verdict, want once:\n%s", n, h.logs.String())
	}
	setMax(1 << 40)
	testutil.WaitFor(t, 10*time.Second, "back under budget logged", func() bool {
		return strings.Contains(h.logs.String(), `msg="projected Redis memory is back under budget"`)
	})
	setMax(limit)
	testutil.WaitFor(t, 10*time.Second, "the warning again", func() bool { return strings.Count(h.logs.String(), warning) == 2 })
}
