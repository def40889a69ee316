package main

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	return "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
}

func get(url string) (int, string) {
	resp, err := http.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// metricValue reads one sample from a Prometheus text exposition.
func metricValue(body, sample string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`)
	m := re.FindStringSubmatch(body)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// TestMetricsAndReadiness runs relay start with the process runner and
// METRICS_ADDR, publishes a known sequence, checks exact counter values on
// /metrics, and that /readyz turns unready when Redis stops.
func TestMetricsAndReadiness(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := buildRelay(t)
	apps, err := filepath.Abs("../../examples/apps")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	addr := freeAddr(t)
	streamName := "events"
	cmd := exec.Command(bin, "start", "--runner", "process")
	cmd.Env = append(os.Environ(), "REDIS_URI="+srv.Addr, "REDIS_STREAM="+streamName, "REDIS_GROUP=relay",
		"RELAY_APPS="+apps, "RELAY_CONSUMER=metrics", "METRICS_ADDR="+addr,
		"LOG_LEVEL=error") // handler output is forwarded at every log level (docs/observability.md#logs)
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("output:\n%s", out)
		}
	})
	base := "http://" + addr
	testutil.WaitFor(t, 30*time.Second, "ready", func() bool { code, _ := get(base + "/readyz"); return code == 200 })

	src := redisstream.New(rc, streamName, "relay", "publisher")
	ctx := context.Background()
	for _, ev := range []string{
		`{"event_name":"INSERT","table_name":"users","new_image":{"id":1}}`, // users/events.created succeeds
		`{"event_name":"INSERT","table_name":"users","new_image":{"id":2}}`, // again
		`{"event_name":"INSERT","table_name":"invoices"}`,                   // billing/invoices.charge fails, retries: 0
		`{"event_name":"INSERT","table_name":"nothing"}`,                    // unmatched
		`not json`, // malformed
	} {
		if _, err := src.Publish(ctx, map[string]string{"event": ev}); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string]float64{
		`relay_events_received_total`:  5,
		`relay_events_matched_total`:   3,
		`relay_events_unmatched_total`: 1,
		`relay_events_malformed_total`: 1,
		`relay_invocations_total{app="users",handler="events.created",outcome="success"}`:    2,
		`relay_invocations_total{app="billing",handler="invoices.charge",outcome="failure"}`: 1,
		`relay_dlq_entries_total{app="billing",handler="invoices.charge"}`:                   1,
		`relay_dlq_entries_total{app="-",handler="-"}`:                                       1,
		`relay_invocation_duration_seconds_count{app="users",handler="events.created"}`:      2,
		`relay_missing_payload_total`:                                                        0,
		`relay_in_flight_invocations`:                                                        0,
		`relay_concurrency_waits_total`:                                                      0,
	}
	testutil.WaitFor(t, 30*time.Second, "counters", func() bool {
		_, body := get(base + "/metrics")
		for sample, v := range want {
			if metricValue(body, sample) != v {
				return false
			}
		}
		return true
	})
	if !strings.Contains(out.String(), "[users/events.created] welcome user") {
		t.Error("handler output was not forwarded at LOG_LEVEL=error")
	}
	if code, body := get(base + "/healthz"); code != 200 {
		t.Errorf("/healthz = %d %s", code, body)
	}

	srv.Kill()
	testutil.WaitFor(t, 30*time.Second, "unready without Redis", func() bool {
		code, body := get(base + "/readyz")
		return code == 503 && strings.Contains(body, "redis")
	})
	if code, _ := get(base + "/healthz"); code != 200 {
		t.Error("/healthz failed while the process is alive")
	}
}
