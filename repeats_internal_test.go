package relay

import (
	"errors"
	"log/slog"
	"testing"
	"time"
)

// TestRepeatsWindow: a line repeated within the window goes to DEBUG, the
// next one after it is at its level again and counts the repeats; another
// error, and lines below WARN, are left alone.
func TestRepeatsWindow(t *testing.T) {
	r := newRepeats()
	t0 := time.Unix(1_700_000_000, 0)
	check := func(at time.Duration, level slog.Level, err string, wantLevel slog.Level, wantN int) {
		t.Helper()
		got, n := r.level(level, "claim failed", err, t0.Add(at))
		if got != wantLevel || n != wantN {
			t.Errorf("at %v, %v %q: level %v repeated %d, want %v %d", at, level, err, got, n, wantLevel, wantN)
		}
	}
	check(0, slog.LevelError, "OOM", slog.LevelError, 0)
	check(time.Second, slog.LevelError, "OOM", slog.LevelDebug, 0)
	check(2*time.Second, slog.LevelError, "OOM", slog.LevelDebug, 0)
	check(3*time.Second, slog.LevelError, "READONLY", slog.LevelError, 0)
	check(4*time.Second, slog.LevelInfo, "OOM", slog.LevelInfo, 0)
	check(repeatWindow, slog.LevelError, "OOM", slog.LevelError, 2)
	check(repeatWindow+time.Second, slog.LevelError, "OOM", slog.LevelDebug, 0)

	var none *repeats
	if got, n := none.level(slog.LevelError, "m", "e", t0); got != slog.LevelError || n != 0 {
		t.Errorf("nil repeats: %v %d, want the level unchanged", got, n)
	}
}

// TestRepeatsBounded: past maxRepeatKeys lines, those whose window has
// passed are forgotten.
func TestRepeatsBounded(t *testing.T) {
	r := newRepeats()
	t0 := time.Unix(1_700_000_000, 0)
	for i := range maxRepeatKeys {
		r.level(slog.LevelWarn, "m", string(rune('a'+i%26))+time.Duration(i).String(), t0)
	}
	r.level(slog.LevelWarn, "m", "new", t0.Add(repeatWindow))
	if len(r.seen) != 1 {
		t.Errorf("%d lines remembered, want only the new one once the others' windows passed", len(r.seen))
	}
}

// TestRepeatsByCause: failures whose errors differ only in the ids of the
// container or message they met are one cause, logged once per window.
func TestRepeatsByCause(t *testing.T) {
	r := newRepeats()
	t0 := time.Unix(1_700_000_000, 0)
	errs := []error{
		errors.New(`create container shop-orders.record-8f3a2c1d9e0b4a77: write /var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db: no space left on device`),
		errors.New(`create container shop-orders.record-0b1c2d3e4f5a6b7c: write /var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db: no space left on device`),
		errors.New(`stage bootstrap: open /state/bootstrap/.tmp-3668785983: no space left on device`),
		errors.New(`stage bootstrap: open /state/bootstrap/.tmp-1234567890: no space left on device`),
		errors.New(`claim 1796198721265-0: OOM command not allowed`),
		errors.New(`claim 1796198721266-3: OOM command not allowed`),
	}
	for i, err := range errs {
		got, _ := r.level(slog.LevelWarn, "not run", cause(err), t0)
		if want := []slog.Level{slog.LevelWarn, slog.LevelDebug}[i%2]; got != want {
			t.Errorf("error %d (%v): level %v, want %v", i, err, got, want)
		}
	}
	if cause(errors.New("no space left on device")) != "no space left on device" {
		t.Error("cause changed an error without ids")
	}
}
