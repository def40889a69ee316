package repeats_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/repeats"
)

// TestLogWindow: a line repeated within the window goes to DEBUG, the next
// one after it is at its level again and counts the repeats; another
// cause, and lines below WARN, are left alone.
func TestLogWindow(t *testing.T) {
	r := repeats.New()
	t0 := time.Unix(1_700_000_000, 0)
	check := func(at time.Duration, level slog.Level, cause string, wantLevel slog.Level, wantN int) {
		t.Helper()
		got, n := r.Level(level, "claim failed", cause, t0.Add(at))
		if got != wantLevel || n != wantN {
			t.Errorf("at %v, %v %q: level %v repeated %d, want %v %d", at, level, cause, got, n, wantLevel, wantN)
		}
	}
	check(0, slog.LevelError, "OOM", slog.LevelError, 0)
	check(time.Second, slog.LevelError, "OOM", slog.LevelDebug, 0)
	check(2*time.Second, slog.LevelError, "OOM", slog.LevelDebug, 0)
	check(3*time.Second, slog.LevelError, "READONLY", slog.LevelError, 0)
	check(4*time.Second, slog.LevelInfo, "OOM", slog.LevelInfo, 0)
	check(repeats.Window, slog.LevelError, "OOM", slog.LevelError, 2)
	check(repeats.Window+time.Second, slog.LevelError, "OOM", slog.LevelDebug, 0)

	var none *repeats.Log
	if got, n := none.Level(slog.LevelError, "m", "e", t0); got != slog.LevelError || n != 0 {
		t.Errorf("nil Log: %v %d, want the level unchanged", got, n)
	}
}

// TestLogBounded: past MaxKeys lines, those whose window has passed are
// forgotten.
func TestLogBounded(t *testing.T) {
	r := repeats.New()
	t0 := time.Unix(1_700_000_000, 0)
	for i := range repeats.MaxKeys {
		r.Level(slog.LevelWarn, "m", fmt.Sprint("cause ", i), t0)
	}
	r.Level(slog.LevelWarn, "m", "new", t0.Add(repeats.Window))
	if n := r.Len(); n != 1 {
		t.Errorf("%d lines remembered, want only the new one once the others' windows passed", n)
	}
}

// TestCause: errors that differ only in the ids, temporary names and
// other numbers of the container, file or message they met are one cause;
// every error of a full filesystem is the one cause "no space left on
// device", whether it wraps the errno or came through containerd's API as
// text naming a new temporary directory each time.
func TestCause(t *testing.T) {
	enospc := &os.PathError{Op: "mkdir", Path: "/var/lib/containerd/tmpmounts/containerd-mount2087421", Err: syscall.ENOSPC}
	same := [][]error{
		{
			errors.New(`create container shop-orders.record-8f3a2c1d9e0b4a77: write /var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db: no space left on device`),
			errors.New(`create task: rpc error: code = Unknown desc = failed to create shim task: mkdir /run/containerd/io.containerd.runtime.v2.task/relay/shop-x/rootfs/tmp-912345678: no space left on device`),
			fmt.Errorf("prepare container shop-orders.record-0b1c2d3e4f5a6b7c: %w", enospc),
			errors.New(`stage bootstrap: open /state/bootstrap/.tmp-3668785983: no space left on device`),
		},
		{
			errors.New(`open /state/x/.tmp-12345: permission denied`),
			errors.New(`open /state/x/.tmp-987654321: permission denied`),
		},
		{
			errors.New(`claim 1796198721265-0: OOM command not allowed`),
			errors.New(`claim 1796198721266-3: OOM command not allowed`),
		},
		{
			&os.PathError{Op: "open", Path: "/ro/a1", Err: syscall.EROFS},
			errors.New("write /mnt/b22: read-only file system"),
		},
	}
	for i, group := range same {
		want := repeats.Cause(group[0])
		for _, err := range group[1:] {
			if got := repeats.Cause(err); got != want {
				t.Errorf("group %d: Cause(%v) = %q, want %q as for %v", i, err, got, want, group[0])
			}
		}
		for j, other := range same {
			if j != i && repeats.Cause(other[0]) == want {
				t.Errorf("groups %d and %d are one cause %q", i, j, want)
			}
		}
	}
	if got := repeats.Cause(errors.New("dial tcp 127.0.0.1:6379: connect: connection refused")); got != "dial tcp 127.0.0.1:6379: connect: connection refused" {
		t.Errorf("Cause changed an error without ids or paths: %q", got)
	}
}
