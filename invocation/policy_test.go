package invocation

import (
	"testing"
	"time"
)

func TestBackoff(t *testing.T) {
	custom := []time.Duration{time.Second, 3 * time.Second}
	for _, tc := range []struct {
		schedule []time.Duration
		attempt  int
		want     time.Duration
	}{
		{DefaultBackoff, 1, time.Minute},
		{DefaultBackoff, 2, 2 * time.Minute},
		{DefaultBackoff, 3, 5 * time.Minute},
		{DefaultBackoff, 4, 10 * time.Minute},
		{DefaultBackoff, 5, 10 * time.Minute},
		{DefaultBackoff, 100, 10 * time.Minute},
		{DefaultBackoff, 0, time.Minute},
		{DefaultBackoff, -1, time.Minute},
		{custom, 1, time.Second},
		{custom, 2, 3 * time.Second},
		{custom, 3, 3 * time.Second},
		{nil, 1, 0},
		{[]time.Duration{}, 3, 0},
	} {
		if got := Backoff(tc.schedule, tc.attempt); got != tc.want {
			t.Errorf("Backoff(%v, %d) = %v, want %v", tc.schedule, tc.attempt, got, tc.want)
		}
	}
}

func TestDefaults(t *testing.T) {
	if DefaultRetries != 4 || DefaultRetention != 48*time.Hour {
		t.Errorf("DefaultRetries %d, DefaultRetention %v", DefaultRetries, DefaultRetention)
	}
	if len(DefaultBackoff) != DefaultRetries {
		t.Errorf("DefaultBackoff has %d steps, want one per retry (%d)", len(DefaultBackoff), DefaultRetries)
	}
}
