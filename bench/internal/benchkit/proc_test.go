package benchkit

import (
	"testing"
	"time"
)

func TestPercentileNearestRank(t *testing.T) {
	ms := func(ns ...int) []time.Duration {
		out := make([]time.Duration, len(ns))
		for i, n := range ns {
			out[i] = time.Duration(n) * time.Millisecond
		}
		return out
	}
	hundred := make([]int, 100)
	for i := range hundred {
		hundred[i] = i + 1
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"one sample", ms(7), 0.99, 7 * time.Millisecond},
		{"median of four is the second", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"p50 of 1..100", ms(hundred...), 0.5, 50 * time.Millisecond},
		{"p99 of 1..100", ms(hundred...), 0.99, 99 * time.Millisecond},
		{"p90 of ten", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.9, 9 * time.Millisecond},
		{"max", ms(1, 2, 3), 1, 3 * time.Millisecond},
	} {
		if got := Percentile(tc.sorted, tc.p); got != tc.want {
			t.Errorf("%s: Percentile(p=%v) = %v, want %v", tc.name, tc.p, got, tc.want)
		}
	}
}

func TestSummarizeDoesNotReorderItsInput(t *testing.T) {
	in := []time.Duration{3, 1, 2}
	s := Summarize(in)
	if s.Min != 1 || s.Max != 3 || s.P50 != 2 || s.N != 3 || s.Mean != 2 {
		t.Errorf("Summarize = %+v", s)
	}
	if in[0] != 3 || in[1] != 1 {
		t.Errorf("input reordered: %v", in)
	}
}

func TestServerStatsArithmetic(t *testing.T) {
	before := ServerStats{Calls: map[string]int64{"xack": 10, "evalsha": 5, "info": 3, "xpending": 1}, CPU: time.Second,
		Time: map[string]time.Duration{"xack": 10, "evalsha": 50, "xpending": 1}}
	after := ServerStats{Calls: map[string]int64{"xack": 30, "evalsha": 65, "info": 9, "xpending": 8, "xinfo|groups": 7}, CPU: 3 * time.Second,
		Time: map[string]time.Duration{"xack": 30 * time.Microsecond, "evalsha": 50 + 600*time.Microsecond, "xpending": 1 + 7*time.Microsecond, "xinfo|groups": 7}}
	d := after.Sub(before).Without(SettledCommands, 7)
	want := map[string]int64{"xack": 20, "evalsha": 60}
	if len(d.Calls) != len(want) || d.Calls["xack"] != 20 || d.Calls["evalsha"] != 60 || d.CPU != 2*time.Second {
		t.Errorf("delta = %+v, want calls %v and 2s", d, want)
	}
	if got := d.PerEvent(20); got != "evalsha=3.00 xack=1.00" {
		t.Errorf("PerEvent = %q", got)
	}
	if got := d.TimePerEvent(20); got != "evalsha 30.0µs, xack 1.5µs" {
		t.Errorf("TimePerEvent = %q", got)
	}
}
