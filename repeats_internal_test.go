package relay

import (
	"errors"
	"log/slog"
	"testing"
	"time"
)

// TestRepeatsByCause: failures whose errors differ only in the ids of the
// container, temporary directory or message they met are one cause, and
// so is every failure of a full filesystem, logged once per window
// (docs/operations.md#logs).
func TestRepeatsByCause(t *testing.T) {
	r := newRepeats()
	t0 := time.Unix(1_700_000_000, 0)
	for i, c := range []struct {
		err  error
		want slog.Level
	}{
		{errors.New(`create container shop-orders.record-8f3a2c1d9e0b4a77: write /var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db: no space left on device`), slog.LevelWarn},
		{errors.New(`create container shop-orders.record-0b1c2d3e4f5a6b7c: write /var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db: no space left on device`), slog.LevelDebug},
		// containerd's root full: each creation names a new temporary
		// directory, of fewer than 10 digits as often as not.
		{errors.New(`create container shop-orders.record-1c2d3e4f5a6b7c8d: failed to create snapshot: mkdir /var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/new-412345678: no space left on device`), slog.LevelDebug},
		{errors.New(`create task: rpc error: code = Unknown desc = mount /var/lib/containerd/tmpmounts/containerd-mount98765: no space left on device`), slog.LevelDebug},
		{errors.New(`stage bootstrap: open /state/bootstrap/.tmp-3668785983: permission denied`), slog.LevelWarn},
		{errors.New(`stage bootstrap: open /state/bootstrap/.tmp-123456789: permission denied`), slog.LevelDebug},
		{errors.New(`claim 1796198721265-0: OOM command not allowed`), slog.LevelWarn},
		{errors.New(`claim 1796198721266-3: OOM command not allowed`), slog.LevelDebug},
	} {
		if got, _ := r.level(slog.LevelWarn, "not run", cause(c.err), t0); got != c.want {
			t.Errorf("error %d (%v): level %v, want %v", i, c.err, got, c.want)
		}
	}
	if cause(errors.New("connection refused")) != "connection refused" {
		t.Error("cause changed an error without ids")
	}
}
