package oneshot

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/repeats"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// TestPrepareFailuresByCause: a full disk fails the creation of prepared
// containers for every app at once, each error naming a temporary
// directory of its own; that is logged at WARN once per cause and
// repeats.Window, the repeats at DEBUG and counted on the next WARN line
// (docs/operations.md#logs). Another cause has a line of its own.
func TestPrepareFailuresByCause(t *testing.T) {
	logs := &testutil.Buffer{}
	host := &core.Host{Config: core.Config{Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}}
	r := New(Config{Host: host})
	full := func(dir string) error {
		return &os.PathError{Op: "mkdir", Path: "/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/" + dir, Err: syscall.ENOSPC}
	}
	t0 := time.Now()
	r.prepareFailed(t.Context(), "shop", "shop-1", errors.New("create snapshot: "+full("new-412345678").Error()), t0)
	r.prepareFailed(t.Context(), "shop", "shop-2", errors.New("create snapshot: "+full("new-98765").Error()), t0)
	r.prepareFailed(t.Context(), "billing", "billing-1", full("new-1234"), t0.Add(time.Millisecond))
	r.prepareFailed(t.Context(), "shop", "shop-3", errors.New("create task: connection refused"), t0.Add(2*time.Millisecond))
	r.prepareFailed(t.Context(), "shop", "shop-4", full("new-7"), t0.Add(repeats.Window))
	var levels []string
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if strings.Contains(line, "preparing a container failed") {
			level, _, _ := strings.Cut(strings.TrimPrefix(line[strings.Index(line, "level="):], "level="), " ")
			if strings.Contains(line, "repeated=2") {
				level += " repeated=2"
			}
			levels = append(levels, level)
		}
	}
	want := []string{"WARN", "DEBUG", "DEBUG", "WARN", "WARN repeated=2"}
	if strings.Join(levels, ",") != strings.Join(want, ",") {
		t.Errorf("levels %v, want %v:\n%s", levels, want, logs)
	}
}
