package cluster_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/schedule/cron"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/internal/topology"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/redisschedule"
)

// The cluster suite's app: ok.run succeeds, bad.run fails at once and is
// dead-lettered (retries: 0, so no backoff is waited out). Every run
// appends "<handler> <message id> <attempt> <event>" to the ledger file.
const clusterApp = `
image: unused
command: ["/bin/sh", "/app/handler.sh"]
concurrency: 4
env:
  LEDGER: %s
events:
  - {handler: ok.run, pattern: {kind: [ok]}, timeout: 10s}
  - {handler: bad.run, pattern: {kind: [bad]}, timeout: 10s, retries: 0}
`

const clusterHandler = `event=$(cat)
printf '%s %s %s %s\n' "$RELAY_HANDLER" "$RELAY_MESSAGE_ID" "$RELAY_ATTEMPT" "$event" >>"$LEDGER"
if [ "$RELAY_HANDLER" = bad.run ]; then
	echo "planned failure" >&2
	exit 3
fi
`

// clusterEvent is what the suite publishes.
type clusterEvent struct {
	Kind   string `json:"kind"`
	Stream string `json:"stream"`
	N      int    `json:"n"`
}

// TestClusterEndToEnd runs two relay start processes, each consuming four
// hash-tagged streams spread over the three masters of a cluster started
// by scripts/cluster.sh, and checks that:
//   - every event ran its handler and every message was acknowledged;
//   - each failing event has its DLQ entry in its own stream's DLQ, and no
//     DLQ holds another stream's entries;
//   - every key Relay wrote (invocation hashes, DLQ, stats) sits on the
//     master owning its stream's slot, in that very slot;
//   - /readyz and /metrics cover every stream;
//   - SIGTERM stops both workers with exit 0.
func TestClusterEndToEnd(t *testing.T) {
	c := topology.NewCluster(t)
	bin := buildRelay(t)
	ctx := context.Background()
	rc := topology.Connect(t, c.ClientOption())

	owner := slotOwners(t, rc)
	streams := pickStreams(t, rc, owner, 4)
	const group = "relay"

	ledger := filepath.Join(t.TempDir(), "ledger")
	apps := writeApp(t, "shop", fmt.Sprintf(clusterApp, ledger), map[string]string{"handler.sh": clusterHandler})
	metricsAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(testutil.FreePort(t)))

	type worker struct {
		cmd    *exec.Cmd
		stderr *testutil.Buffer
		done   chan error
	}
	var workers []*worker
	for i, name := range []string{"w1", "w2"} {
		cmd := exec.Command(bin, "start", "--runner", "process")
		cmd.Env = append(os.Environ(),
			"REDIS_URI=redis://"+strings.Join(c.Seeds, ","), "REDIS_CLUSTER=true",
			"REDIS_STREAM="+strings.Join(streams, ","), "REDIS_GROUP="+group,
			"RELAY_CONSUMER="+name, "RELAY_APPS="+apps, "RELAY_STATE_DIR="+t.TempDir(),
			"MAX_CONCURRENCY=8", "LOG_LEVEL=info")
		if i == 0 {
			cmd.Env = append(cmd.Env, "METRICS_ADDR="+metricsAddr)
		}
		w := &worker{cmd: cmd, stderr: &testutil.Buffer{}, done: make(chan error, 1)}
		cmd.Stdout, cmd.Stderr = io.Discard, w.stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { w.done <- cmd.Wait() }()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			if t.Failed() {
				t.Logf("%s stderr:\n%s", name, w.stderr)
			}
		})
		workers = append(workers, w)
	}
	for _, w := range workers {
		testutil.WaitFor(t, time.Minute, "every stream's engine started", func() bool {
			return strings.Count(w.stderr.String(), "engine started") == len(streams)
		})
	}

	// Publish through the cluster client: each stream's entries go to the
	// master that owns its slot.
	const perStream = 40
	kinds := map[string]string{}        // stream/message id -> kind
	last := map[string]string{}         // stream -> newest id
	ids := map[string]map[string]bool{} // stream -> its message ids
	for _, s := range streams {
		ids[s] = map[string]bool{}
		for n := range perStream {
			ev := clusterEvent{Kind: "ok", Stream: s, N: n}
			if n%8 == 3 {
				ev.Kind = "bad"
			}
			body, _ := json.Marshal(ev)
			id, err := rc.Do(ctx, rc.B().Xadd().Key(s).Id("*").FieldValue().FieldValue("event", string(body)).Build()).ToString()
			if err != nil {
				t.Fatal(err)
			}
			kinds[s+"/"+id], last[s], ids[s][id] = ev.Kind, id, true
		}
	}
	for _, s := range streams {
		testutil.WaitFor(t, 2*time.Minute, "every message of "+s+" acknowledged", func() bool {
			return redistest.Settled(ctx, rc, s, group, last[s])
		})
	}

	// Readiness and metrics cover every stream.
	body := httpGet(t, "http://"+metricsAddr+"/readyz")
	if strings.TrimSpace(body) != "ready" {
		t.Errorf("/readyz = %q", body)
	}
	metrics := httpGet(t, "http://"+metricsAddr+"/metrics")
	for _, s := range streams {
		if !strings.Contains(metrics, `relay_events_received_total{stream="`+s+`"}`) {
			t.Errorf("/metrics has no relay_events_received_total for stream %s", s)
		}
	}

	for _, w := range workers {
		if err := w.cmd.Process.Signal(syscall.SIGTERM); err != nil {
			t.Fatal(err)
		}
	}
	for i, w := range workers {
		select {
		case err := <-w.done:
			if err != nil {
				t.Errorf("worker %d exited with %v after SIGTERM, want 0", i+1, err)
			}
		case <-time.After(time.Minute):
			t.Fatalf("worker %d did not stop after SIGTERM", i+1)
		}
	}

	// Ledger: every event ran its handler at least once.
	runs := readLedger(t, ledger)
	var duplicates int
	for key, kind := range kinds {
		n := runs[key]
		switch {
		case n == 0:
			t.Errorf("%s (%s) never ran", key, kind)
		case n > 1:
			duplicates += n - 1
		}
	}
	if extra := len(runs) - len(kinds); extra != 0 {
		t.Errorf("%d ledger entries for messages that were never published", extra)
	}

	// Each stream's DLQ holds exactly its own failures.
	for _, s := range streams {
		entries, err := redisdlq.NewStore(rc, s).List(ctx, dlq.Filter{})
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{}
		for _, e := range entries {
			if e.OriginalStream != s || !ids[s][e.OriginalID] || e.App != "shop" || e.Handler != "bad.run" || e.HandlerAttempts != 1 {
				t.Errorf("DLQ of %s holds %+v", s, e)
			}
			got[e.OriginalID] = true
		}
		for id := range ids[s] {
			if kinds[s+"/"+id] == "bad" && !got[id] {
				t.Errorf("%s/%s failed but has no entry in %s", s, id, keys.DLQ(s))
			}
		}
	}

	checkKeyPlacement(t, rc, owner, streams, group, kinds)
	t.Logf("cluster: %d events over %d streams (%v), 2 workers; %d duplicate runs", len(kinds), len(streams), streams, duplicates)
}

// checkKeyPlacement scans every master and checks that each key belongs to
// one of streams, lies in that stream's slot and on the master owning it,
// and that each stream has its DLQ, stats hash and one retained invocation
// hash per message there.
func checkKeyPlacement(t *testing.T, rc rueidis.Client, owner func(slot int64) string, streams []string, group string, kinds map[string]string) {
	t.Helper()
	ctx := context.Background()
	slotOf := func(key string) int64 {
		s, err := rc.Do(ctx, rc.B().ClusterKeyslot().Key(key).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	invocations := map[string]int{}
	found := map[string]bool{}
	for addr, node := range rc.Nodes() {
		var cursor uint64
		for {
			e, err := node.Do(ctx, node.B().Scan().Cursor(cursor).Count(1000).Build()).AsScanEntry()
			if err != nil {
				t.Fatalf("SCAN %s: %v", addr, err)
			}
			for _, k := range e.Elements {
				found[k] = true
				i := slices.IndexFunc(streams, func(s string) bool {
					tag, _ := keys.HashTag(s)
					return strings.Contains(k, "{"+tag+"}")
				})
				if i < 0 {
					t.Errorf("key %s on %s belongs to none of the streams", k, addr)
					continue
				}
				s := streams[i]
				if slotOf(k) != slotOf(s) || owner(slotOf(s)) != addr {
					t.Errorf("key %s is in slot %d on %s; its stream %s is in slot %d on %s", k, slotOf(k), addr, s, slotOf(s), owner(slotOf(s)))
				}
				if strings.HasPrefix(k, "relay:invocation:") {
					invocations[s]++
				}
			}
			cursor = e.Cursor
			if cursor == 0 {
				break
			}
		}
	}
	for _, s := range streams {
		for _, k := range []string{s, keys.DLQ(s), keys.Stats(s, group)} {
			if !found[k] {
				t.Errorf("key %s not found on any master", k)
			}
		}
		want := 0
		for key := range kinds {
			if strings.HasPrefix(key, s+"/") {
				want++
			}
		}
		if invocations[s] != want {
			t.Errorf("stream %s: %d invocation hashes, want one per message (%d)", s, invocations[s], want)
		}
	}
}

// slotOwners maps a hash slot to the address of the master serving it.
func slotOwners(t *testing.T, rc rueidis.Client) func(slot int64) string {
	t.Helper()
	ranges, err := rc.Do(context.Background(), rc.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	type span struct {
		lo, hi int64
		addr   string
	}
	var spans []span
	for _, r := range ranges {
		parts, err := r.ToArray()
		if err != nil || len(parts) < 3 {
			t.Fatalf("CLUSTER SLOTS entry %v: %v", r, err)
		}
		lo, _ := parts[0].AsInt64()
		hi, _ := parts[1].AsInt64()
		node, _ := parts[2].ToArray()
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		spans = append(spans, span{lo, hi, net.JoinHostPort(host, strconv.FormatInt(port, 10))})
	}
	return func(slot int64) string {
		for _, s := range spans {
			if slot >= s.lo && slot <= s.hi {
				return s.addr
			}
		}
		return ""
	}
}

// pickStreams returns n stream names of the form {cN}.events whose slots
// cover every master, so the suite spreads over the whole cluster.
func pickStreams(t *testing.T, rc rueidis.Client, owner func(int64) string, n int) []string {
	t.Helper()
	masters := map[string]bool{}
	for _, addr := range topologyMasters(t, rc) {
		masters[addr] = false
	}
	var streams []string
	for i := 0; len(streams) < n && i < 1000; i++ {
		s := fmt.Sprintf("{c%d}.events", i)
		slot, err := rc.Do(context.Background(), rc.B().ClusterKeyslot().Key(s).Build()).AsInt64()
		if err != nil {
			t.Fatal(err)
		}
		addr := owner(slot)
		covered := true
		for _, ok := range masters {
			covered = covered && ok
		}
		if !masters[addr] || covered {
			masters[addr] = true
			streams = append(streams, s)
		}
	}
	if len(streams) < n {
		t.Fatalf("could not pick %d streams over the masters %v", n, masters)
	}
	return streams
}

func topologyMasters(t *testing.T, rc rueidis.Client) []string {
	t.Helper()
	var addrs []string
	for addr := range rc.Nodes() {
		addrs = append(addrs, addr)
	}
	if len(addrs) != 3 {
		t.Fatalf("cluster nodes %v, want 3 masters", addrs)
	}
	return addrs
}

// readLedger counts the handler runs per "stream/message id".
func readLedger(t *testing.T, path string) map[string]int {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	runs := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		parts := strings.SplitN(sc.Text(), " ", 4)
		var ev clusterEvent
		if len(parts) != 4 || json.Unmarshal([]byte(parts[3]), &ev) != nil {
			t.Fatalf("bad ledger line %q", sc.Text())
		}
		if want := ev.Kind + ".run"; parts[0] != want {
			t.Errorf("ledger line %q: handler %s ran for a %s event", sc.Text(), parts[0], ev.Kind)
		}
		runs[ev.Stream+"/"+parts[1]]++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return runs
}

func httpGet(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK {
		t.Errorf("GET %s: %s: %s", url, resp.Status, b)
	}
	return string(b)
}

// TestClusterSchedulePublish runs the schedule publisher's script, which
// touches the dedup key and the stream at once, on the cluster: with a
// hash-tagged stream both keys share a slot and the occurrence is written
// once; with an untagged stream the script is refused as cross-slot, which
// is why relay start and relay validate reject such a stream.
func TestClusterSchedulePublish(t *testing.T) {
	c := topology.NewCluster(t)
	rc := topology.Connect(t, c.ClientOption())
	ctx := context.Background()
	spec := schedule.Spec{App: "billing", Name: "nightly", Handler: "reports.nightly", Cron: cron.MustParse("0 3 * * *", time.UTC)}
	at := time.Date(2026, 3, 8, 3, 0, 0, 0, time.UTC)

	pub, err := redisschedule.NewPublisher(rc, "{billing}.events")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []bool{true, false} {
		published, err := pub.Publish(ctx, spec, at)
		if err != nil || published != want {
			t.Fatalf("publish %d: %v, %v; want %v", i+1, published, err, want)
		}
	}
	if n, err := rc.Do(ctx, rc.B().Xlen().Key("{billing}.events").Build()).AsInt64(); err != nil || n != 1 {
		t.Errorf("XLEN = %d, %v; want 1 occurrence", n, err)
	}

	// rueidis's cluster client would refuse the cross-slot script by
	// panicking; NewPublisher refuses an untagged stream up front instead.
	if _, err := redisschedule.NewPublisher(rc, "billing.events"); err == nil || !strings.Contains(err.Error(), "no hash tag") {
		t.Errorf("NewPublisher on an untagged stream under Cluster = %v, want a refusal naming the hash tag", err)
	}
}
