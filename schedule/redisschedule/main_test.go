package redisschedule

import (
	"context"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/cron"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func mustZone(t testing.TB, name string) *time.Location { return testutil.Zone(t, name) }

func mustTime(t testing.TB, s string) time.Time { return testutil.Time(t, s) }

// nightly is the schedule of package schedule's envelope tests.
func nightly(t testing.TB) schedule.Spec {
	return schedule.Spec{App: "billing", Name: "nightly", Handler: "invoice.run", Cron: cron.MustParse("30 2 * * *", mustZone(t, "America/New_York"))}
}

// entry is one stream entry as the tests read it.
type entry struct {
	ID     string
	Fields map[string]string
}

// entries returns every entry of stream (XRANGE - +).
func entries(t *testing.T, c rueidis.Client, stream string) []entry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rs, err := c.Do(ctx, c.B().Xrange().Key(stream).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatalf("XRANGE %s: %v", stream, err)
	}
	out := make([]entry, 0, len(rs))
	for _, r := range rs {
		out = append(out, entry{ID: r.ID, Fields: r.FieldValues})
	}
	return out
}

// scheduledAts decodes each entry's envelope and returns its scheduled_at.
func scheduledAts(t *testing.T, es []entry) []string {
	t.Helper()
	out := make([]string, 0, len(es))
	for _, e := range es {
		env, err := schedule.DecodeEnvelope([]byte(e.Fields["event"]))
		if err != nil {
			t.Fatalf("entry %s: %v", e.ID, err)
		}
		out = append(out, env.ScheduledAt)
	}
	return out
}

// checkDedupTTL asserts that key exists with a TTL of about DedupTTL.
func checkDedupTTL(t *testing.T, c rueidis.Client, key string) {
	t.Helper()
	pttl, err := c.Do(context.Background(), c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	if max := DedupTTL.Milliseconds(); pttl > max || pttl < max-(30*time.Second).Milliseconds() {
		t.Errorf("PTTL %s = %dms, want within 30s below %dms (7 days)", key, pttl, max)
	}
}

// keysFor is the dedup key of spec's occurrence at at in stream.
func keysFor(stream string, spec schedule.Spec, at time.Time) string {
	return keys.ScheduleOccurrence(stream, spec.App, spec.Name, at)
}
