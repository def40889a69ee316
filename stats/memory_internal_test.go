package stats

import (
	"strings"
	"testing"
	"time"
)

func TestProjection(t *testing.T) {
	m := Memory{
		Used:        10_000_000, // 1 MB of it not Relay's
		Stream:      Part{Bytes: 6_000_000, PerItem: 1000},
		DLQ:         Part{Bytes: 1_000_000, PerItem: 500},
		Invocations: Part{Bytes: 1_500_000, PerItem: 250},
		Other:       Part{Bytes: 500_000},
		Rate:        10, DLQRate: 0.01, MatchedShare: 0.5,
	}
	m.Project(Retentions{Stream: time.Hour, DLQ: 24 * time.Hour, Invocation: 2 * time.Hour})
	// 1 MB + 0.5 MB other + 10×3600×1000 + 0.01×86400×500 + 5×7200×250
	want := int64(1_000_000 + 500_000 + 36_000_000 + 432_000 + 9_000_000)
	if m.Projected != want || m.Unbounded != "" {
		t.Errorf("projected %d (%q), want %d", m.Projected, m.Unbounded, want)
	}
	if m.Stream.Projected != 36_000_000 || m.DLQ.Projected != 432_000 || m.Invocations.Projected != 9_000_000 || m.Other.Projected != 500_000 {
		t.Errorf("parts projected %d %d %d %d", m.Stream.Projected, m.DLQ.Projected, m.Invocations.Projected, m.Other.Projected)
	}
	m.Project(Retentions{Stream: time.Hour, DLQ: 24 * time.Hour}) // invocation state deleted at ack
	if want -= 9_000_000; m.Projected != want {
		t.Errorf("with invocation retention 0: projected %d, want %d", m.Projected, want)
	}
	// The state of 100 pending messages stays at any retention.
	m.Invocations.Live = 100
	m.Project(Retentions{Stream: time.Hour, DLQ: 24 * time.Hour})
	if want += 25_000; m.Projected != want || m.Invocations.Projected != 25_000 {
		t.Errorf("with 100 live hashes: projected %d (state %d), want %d (25000)", m.Projected, m.Invocations.Projected, want)
	}
	// Trimmed every minute, each stream peaks a minute past its retention,
	// just before a trim; the invocation state expires by itself.
	m.Project(Retentions{Stream: time.Hour, DLQ: 24 * time.Hour, TrimInterval: time.Minute})
	if m.Stream.Projected != 10*3660*1000 || m.DLQ.Projected != 432_300 || m.Invocations.Projected != 25_000 {
		t.Errorf("trimmed every minute: parts projected %d %d %d, want %d 432300 25000", m.Stream.Projected, m.DLQ.Projected, m.Invocations.Projected, 10*3660*1000)
	}
	m.Project(Retentions{Stream: time.Hour, DLQ: 0})
	if m.Projected != -1 || m.Unbounded == "" {
		t.Errorf("DLQ kept forever with dead letters arriving: projected %d (%q), want unbounded", m.Projected, m.Unbounded)
	}
}

// TestPressureOfMemoryInUseNow: a Redis already over the budget is under
// pressure whatever the projection says. At maxmemory producers cannot
// add entries, so the rate, and with it the projection, falls to nothing
// just when Redis is full: the check must not turn ok then.
func TestPressureOfMemoryInUseNow(t *testing.T) {
	full := Memory{Used: 3_100_000, Max: 3_000_000, Stream: Part{Bytes: 1_000_000, PerItem: 2000}, Projected: 2_100_000}
	if !full.Pressure(0.9) {
		t.Errorf("used %d of maxmemory %d with a projection of %d: no pressure, want some", full.Used, full.Max, full.Projected)
	}
	if v := full.Verdict(0.9); !strings.Contains(v, "OVER BUDGET") || !strings.Contains(v, "now") || !strings.Contains(v, "at maxmemory") {
		t.Errorf("verdict %q, want it over budget now, at maxmemory", v)
	}
	near := Memory{Used: 2_800_000, Max: 3_000_000, Projected: 1_000_000}
	if !near.Pressure(0.9) || strings.Contains(near.Verdict(0.9), "at maxmemory") {
		t.Errorf("used 93%% of maxmemory: pressure %v, verdict %q; want pressure, not at maxmemory yet", near.Pressure(0.9), near.Verdict(0.9))
	}
	fine := Memory{Used: 1_000_000, Max: 3_000_000, Projected: 2_000_000}
	if fine.Pressure(0.9) || strings.Contains(fine.Verdict(0.9), "OVER") {
		t.Errorf("used 33%%, projected 67%%: pressure %v, verdict %q; want none", fine.Pressure(0.9), fine.Verdict(0.9))
	}
	if none := (Memory{Used: 5_000_000, Projected: 5_000_000}); none.Pressure(0.9) {
		t.Error("pressure without maxmemory")
	}
}

// TestBlame: the warning blames the part that grows without
// bound, else the largest projected part, else the memory that is not
// Relay's.
func TestBlame(t *testing.T) {
	for _, c := range []struct {
		name string
		m    Memory
		want string
	}{
		{"unbounded stream", Memory{Projected: -1, Stream: Part{Projected: -1}}, PartStream},
		{"unbounded dead letters", Memory{Projected: -1, DLQ: Part{Projected: -1}}, PartDLQ},
		{"retained state largest", Memory{Used: 100, Projected: 900,
			Stream: Part{Projected: 300}, Invocations: Part{Projected: 500}}, PartInvocations},
		{"stream largest", Memory{Used: 100, Projected: 900,
			Stream: Part{Projected: 600}, Invocations: Part{Projected: 200}}, PartStream},
		{"other keys largest", Memory{Used: 100, Projected: 900,
			Other: Part{Bytes: 50, Projected: 700}}, PartOther},
		{"not Relay's", Memory{Used: 1000, Projected: 1100,
			Stream: Part{Bytes: 10, Projected: 50}}, PartNotRelay},
		// Redis full, producers refused, so the rate and the stream's
		// projection fell to 0: the stream takes the most now.
		{"over budget now only", Memory{Used: 3000, Max: 3000, Projected: 1500,
			Stream: Part{Bytes: 2000, Projected: 0}, Invocations: Part{Bytes: 100, Projected: 200}}, PartStream},
	} {
		if got, change := c.m.Blame(BudgetShare); got != c.want || change == "" {
			t.Errorf("%s: blamed %q (%q), want %q", c.name, got, change, c.want)
		}
	}
}
