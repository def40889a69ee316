package relay

import (
	"testing"
	"time"
)

// TestDefaultBackoffSchedule pins the engine's retry schedule to events.md
// "Delivery, retry, and ACK": 1m, 2m, 5m, then 10m for every later failure.
// The values are literals, not DefaultBackoff, so a change to the default
// fails here.
func TestDefaultBackoffSchedule(t *testing.T) {
	o, err := buildOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	e := &Engine{o: o}
	want := []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		failed := i + 1
		if got := e.backoff(failed); got != w {
			t.Errorf("backoff after failed attempt %d = %s, want %s", failed, got, w)
		}
	}
	// The cap holds for rules with many retries.
	if got := e.backoff(100); got != 10*time.Minute {
		t.Errorf("backoff after failed attempt 100 = %s, want the 10m cap", got)
	}
}

// TestDefaultMinPendingIdle pins events.md "Delivery, retry, and ACK":
// recovery reclaims messages idle beyond MinPendingIdle, default 1m.
func TestDefaultMinPendingIdle(t *testing.T) {
	o, err := buildOptions(nil)
	if err != nil {
		t.Fatal(err)
	}
	if o.minPendingIdle != time.Minute {
		t.Errorf("default MinPendingIdle = %s, want 1m", o.minPendingIdle)
	}
}
