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

// TestOverBudgetPart: the warning blames the part that grows without
// bound, else the largest projected part, else the memory that is not
// Relay's.
func TestOverBudgetPart(t *testing.T) {
	for _, c := range []struct {
		name string
		m    stats.Memory
		want string
	}{
		{"unbounded stream", stats.Memory{Projected: -1, Stream: stats.Part{Projected: -1}}, partStream},
		{"unbounded dead letters", stats.Memory{Projected: -1, DLQ: stats.Part{Projected: -1}}, partDLQ},
		{"retained state largest", stats.Memory{Used: 100, Projected: 900,
			Stream: stats.Part{Projected: 300}, Invocations: stats.Part{Projected: 500}}, partInvocations},
		{"stream largest", stats.Memory{Used: 100, Projected: 900,
			Stream: stats.Part{Projected: 600}, Invocations: stats.Part{Projected: 200}}, partStream},
		{"other keys largest", stats.Memory{Used: 100, Projected: 900,
			Other: stats.Part{Bytes: 50, Projected: 700}}, partOther},
		{"not Relay's", stats.Memory{Used: 1000, Projected: 1100,
			Stream: stats.Part{Bytes: 10, Projected: 50}}, partNotRelay},
		// Redis full, producers refused, so the rate and the stream's
		// projection fell to 0: the stream takes the most now.
		{"over budget now only", stats.Memory{Used: 3000, Max: 3000, Projected: 1500,
			Stream: stats.Part{Bytes: 2000, Projected: 0}, Invocations: stats.Part{Bytes: 100, Projected: 200}}, partStream},
	} {
		if got := overBudgetPart(c.m); got != c.want {
			t.Errorf("%s: blamed %q, want %q", c.name, got, c.want)
		}
	}
}

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
