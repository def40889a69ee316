package worker

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stats"
)

// TestMemoryWatchSaysWhyItCannotMeasure: a Redis user without +memory (the
// ACL rules of docs/deployment.md before they listed it) cannot measure;
// the gauges then stay 0, which reads as "no maxmemory", so the worker
// warns once, naming the refusal, rather than at debug level only, and
// says at info when it measures again.
func TestMemoryWatchSaysWhyItCannotMeasure(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	admin := redistest.Connect(t, srv.Addr)
	ctx := t.Context()
	for _, cmd := range []rueidis.Completed{
		admin.B().AclSetuser().Username("nomemory").Rule("on", ">s3cret", "+@all", "-memory", "~*").Build(),
		admin.B().Xadd().Key("events").Id("*").FieldValue().FieldValue("event", "{}").Build(),
	} {
		if err := admin.Do(ctx, cmd).Error(); err != nil {
			t.Fatal(err)
		}
	}
	user, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, Username: "nomemory", Password: "s3cret", DisableCache: true})
	if err != nil {
		t.Fatal(err)
	}
	defer user.Close()
	var logs testutil.Buffer
	m := &memoryWatch{redis: user, stream: "events", group: "relay",
		log:       slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		projected: prometheus.NewGauge(prometheus.GaugeOpts{Name: "p"}), maxmemory: prometheus.NewGauge(prometheus.GaugeOpts{Name: "m"}),
		used: prometheus.NewGauge(prometheus.GaugeOpts{Name: "u"})}
	for range 3 {
		m.check(ctx)
	}
	const warning = `level=WARN msg="cannot measure Redis memory`
	if n := strings.Count(logs.String(), warning); n != 1 || !strings.Contains(logs.String(), "NOPERM") {
		t.Fatalf("3 failed measurements logged %d warnings, want 1 naming NOPERM:\n%s", n, logs.String())
	}
	m.redis = admin
	m.check(ctx)
	if !strings.Contains(logs.String(), `level=INFO msg="measures Redis memory again"`) {
		t.Errorf("no info line when the measurement works again:\n%s", logs.String())
	}
}

// TestMemoryWatchWarnsOnceNearTheLimit: a Redis whose projection hovers
// at 90% of maxmemory gets one warning, not one at each measurement that
// crosses the line; the worker says it is back under budget only once
// the projection is well under it.
func TestMemoryWatchWarnsOnceNearTheLimit(t *testing.T) {
	var logs testutil.Buffer
	m := &memoryWatch{log: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}
	at := func(projectedPct int64) stats.Memory {
		return stats.Memory{Used: 100, Max: 1000, Projected: projectedPct * 10, Stream: stats.Part{Bytes: 50, Projected: projectedPct*10 - 100}}
	}
	for _, pct := range []int64{95, 88, 92, 87, 91, 95} {
		m.judge(t.Context(), at(pct))
	}
	if n := strings.Count(logs.String(), "level=WARN"); n != 1 || strings.Contains(logs.String(), "back under budget") {
		t.Fatalf("a projection between 87%% and 95%% logged %d warnings (want 1) and no return under budget:\n%s", n, logs.String())
	}
	m.judge(t.Context(), at(80))
	if !strings.Contains(logs.String(), "back under budget") {
		t.Errorf("a projection of 80%% after the warning: no line saying it is back under budget:\n%s", logs.String())
	}
	m.judge(t.Context(), at(92))
	if n := strings.Count(logs.String(), "level=WARN"); n != 2 {
		t.Errorf("over budget again after being back under: %d warnings in all, want 2:\n%s", n, logs.String())
	}
}
