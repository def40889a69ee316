package worker

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
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
