package relay

import (
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// TestDefaultBackoffSchedule pins the retry schedule of
// docs/delivery.md#attempts-retries-backoff: 1m, 2m, 5m, then 10m for every
// later failure. The values are literals, not DefaultBackoff, so a change
// to the default fails here.
func TestDefaultBackoffSchedule(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	want := []time.Duration{time.Minute, 2 * time.Minute, 5 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute, 10 * time.Minute}
	for i, w := range want {
		failed := i + 1
		if got := invocation.Backoff(cfg.Backoff, failed); got != w {
			t.Errorf("backoff after failed attempt %d = %s, want %s", failed, got, w)
		}
	}
	// The cap holds for rules with many retries.
	if got := invocation.Backoff(cfg.Backoff, 100); got != 10*time.Minute {
		t.Errorf("backoff after failed attempt 100 = %s, want the 10m cap", got)
	}
}

// TestConfigDefaults pins the defaults docs/delivery.md states: recovery
// reclaims messages idle beyond 1m, every 30s, heartbeats at a third of
// that; 8 concurrent invocations; a 48h retention.
func TestConfigDefaults(t *testing.T) {
	cfg, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MinPendingIdle != time.Minute || cfg.ReclaimInterval != 30*time.Second || cfg.HeartbeatInterval != 20*time.Second {
		t.Errorf("MinPendingIdle %s, ReclaimInterval %s, HeartbeatInterval %s; want 1m, 30s, 20s",
			cfg.MinPendingIdle, cfg.ReclaimInterval, cfg.HeartbeatInterval)
	}
	if cfg.MaxConcurrency != 8 || cfg.Limiter == nil || cfg.Limiter.Max() != 8 || cfg.Retention != 48*time.Hour {
		t.Errorf("MaxConcurrency %d, Retention %s; want 8, 48h", cfg.MaxConcurrency, cfg.Retention)
	}
	// DeleteOnAck is the stores' retention 0; another negative one is refused.
	if cfg, err := (Config{Retention: DeleteOnAck}).withDefaults(); err != nil || cfg.Retention != 0 {
		t.Errorf("Retention DeleteOnAck: %s, %v; want 0 (delete)", cfg.Retention, err)
	}
	if _, err := (Config{Retention: -time.Second}).withDefaults(); err == nil {
		t.Error("Retention -1s accepted, want an error")
	}
	// TTLs are in milliseconds: a retention under 1ms would make every
	// settlement and dead-letter write fail at run time, with handlers
	// run again and again, so it is refused up front.
	for _, d := range []time.Duration{time.Nanosecond, 500 * time.Microsecond} {
		if _, err := (Config{Retention: d}).withDefaults(); err == nil || !strings.Contains(err.Error(), "Config.Retention") {
			t.Errorf("Retention %s: %v, want an error naming Config.Retention", d, err)
		}
	}
	if cfg, err := (Config{Retention: time.Millisecond}).withDefaults(); err != nil || cfg.Retention != time.Millisecond {
		t.Errorf("Retention 1ms: %s, %v; want it kept", cfg.Retention, err)
	}
	// A short MinPendingIdle shortens the derived intervals.
	cfg, err = Config{MinPendingIdle: 300 * time.Millisecond}.withDefaults()
	if err != nil || cfg.ReclaimInterval != 150*time.Millisecond || cfg.HeartbeatInterval != 100*time.Millisecond {
		t.Errorf("derived intervals %s, %s (%v); want 150ms, 100ms", cfg.ReclaimInterval, cfg.HeartbeatInterval, err)
	}
	// A shared Limiter sets the default bound.
	l, _ := NewLimiter(3)
	if cfg, _ := (Config{Limiter: l}).withDefaults(); cfg.MaxConcurrency != 3 {
		t.Errorf("MaxConcurrency with a Limiter of 3 = %d", cfg.MaxConcurrency)
	}
}

// TestConfigErrorsNameTheField: every invalid setting is reported, by name.
func TestConfigErrorsNameTheField(t *testing.T) {
	_, err := Config{MaxConcurrency: -1, MinPendingIdle: -time.Second, Backoff: []time.Duration{time.Second, 0}}.withDefaults()
	for _, want := range []string{"Config.MaxConcurrency", "Config.MinPendingIdle", "Config.Backoff[1]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not name %s", err, want)
		}
	}
	if _, err := (Config{MinPendingIdle: time.Second, HeartbeatInterval: time.Second}).withDefaults(); err == nil ||
		!strings.Contains(err.Error(), "HeartbeatInterval") {
		t.Errorf("a heartbeat as long as MinPendingIdle: %v", err)
	}
	if _, err := (Config{SettleLinger: 5 * time.Second}).withDefaults(); err == nil ||
		!strings.Contains(err.Error(), "Config.SettleLinger: 5s must be under half of WriteTimeout 10s") {
		t.Errorf("a linger of half the write timeout: %v", err)
	}
	if cfg, err := (Config{SettleLinger: time.Second}).withDefaults(); err != nil || cfg.SettleLinger != time.Second {
		t.Errorf("a linger of 1s: %v, %v", cfg.SettleLinger, err)
	}
	// A bound over the shared Limiter's: messages read for it would wait
	// for slots that never come.
	l, _ := NewLimiter(4)
	if _, err := (Config{MaxConcurrency: 8, Limiter: l}).withDefaults(); err == nil ||
		!strings.Contains(err.Error(), "Config.MaxConcurrency: 8 is over Limiter.Max() 4") {
		t.Errorf("MaxConcurrency 8 with a Limiter of 4: %v", err)
	}
	if cfg, err := (Config{MaxConcurrency: 2, Limiter: l}).withDefaults(); err != nil || cfg.MaxConcurrency != 2 {
		t.Errorf("MaxConcurrency 2 with a Limiter of 4: %v, %v", cfg.MaxConcurrency, err)
	}
	// Only WriteTimeout was set: the error names it, not the defaulted
	// SettleLinger the caller never touched.
	if _, err := (Config{WriteTimeout: 3 * time.Millisecond}).withDefaults(); err == nil ||
		!strings.Contains(err.Error(), "Config.WriteTimeout: 3ms must be over twice SettleLinger 2ms (the default") {
		t.Errorf("a write timeout under twice the default linger: %v", err)
	}
}

// TestConfigRefusesSubMillisecondDurations: a bare number is nanoseconds
// (MinPendingIdle: 2 meant as seconds). Such a MinPendingIdle derived a
// zero heartbeat and reclaim interval, and Run panicked in time.NewTicker;
// such a LeaseGrace gave every attempt back unrun.
func TestConfigRefusesSubMillisecondDurations(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{MinPendingIdle: 2}, "Config.MinPendingIdle: must be 0 (the default) or at least 1ms, got 2ns"},
		{Config{LeaseGrace: 30}, "Config.LeaseGrace: must be 0 (the default) or at least 1ms, got 30ns"},
		{Config{ReclaimInterval: 1}, "Config.ReclaimInterval: must be 0 (the default) or at least 1ms, got 1ns"},
		{Config{HeartbeatInterval: 1}, "Config.HeartbeatInterval: must be 0 (the default) or at least 1ms, got 1ns"},
	} {
		if _, err := c.cfg.withDefaults(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want an error saying %q", c.cfg, err, c.want)
		}
	}
	if cfg, err := (Config{MinPendingIdle: time.Millisecond, LeaseGrace: time.Millisecond}).withDefaults(); err != nil ||
		cfg.HeartbeatInterval <= 0 || cfg.ReclaimInterval <= 0 {
		t.Errorf("1ms: %v, heartbeat %s, reclaim %s", err, cfg.HeartbeatInterval, cfg.ReclaimInterval)
	}
}
