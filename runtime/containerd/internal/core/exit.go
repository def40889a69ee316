package core

import (
	"context"
	"fmt"
	"log/slog"

	cgroup1 "github.com/containerd/cgroups/v3/cgroup1/stats"
	cgroup2 "github.com/containerd/cgroups/v3/cgroup2/stats"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/typeurl/v2"

	"github.com/relaydev/relay/runtime"
)

// SigkillExit is the exit status the shim reports for a process ended by
// SIGKILL (128+9), which is what the kernel's OOM killer sends.
const SigkillExit = 137

// oomKills returns how many processes of task's container the kernel has
// killed for reaching the container's memory limit: the oom_kill count of
// its memory cgroup (memory.oom_control on cgroup v1, Linux 4.13 or later;
// memory.events on cgroup v2), read through the shim while the task exists,
// exited or not. Each container has a cgroup of its own, so the count
// covers this container's life alone.
func oomKills(ctx context.Context, task client.Task) (uint64, error) {
	m, err := task.Metrics(ctx)
	if err != nil {
		return 0, fmt.Errorf("task metrics: %w", err)
	}
	v, err := typeurl.UnmarshalAny(m.Data)
	if err != nil {
		return 0, fmt.Errorf("task metrics: %w", err)
	}
	switch s := v.(type) {
	case *cgroup1.Metrics:
		return s.GetMemoryOomControl().GetOomKill(), nil
	case *cgroup2.Metrics:
		return s.GetMemoryEvents().GetOomKill(), nil
	}
	return 0, fmt.Errorf("task metrics: unknown type %T", v)
}

// ExitError describes a handler that exited with code, its container's
// task being task (exited, not yet deleted). A SIGKILL that the kernel's
// OOM killer sent (the cgroup counted more OOM kills than before) is
// reported as OOMKilled with spec's memory limit; before is the count at
// the start of the invocation. Any other code, or a SIGKILL the handler
// sent itself, is a plain exit.
func (h *Host) ExitError(ctx context.Context, req runtime.Request, id string, task client.Task, code int, before uint64) *runtime.ExitError {
	ee := &runtime.ExitError{Code: code}
	if code != SigkillExit {
		return ee
	}
	dctx, cancel := h.Detached(ctx)
	defer cancel()
	n, err := oomKills(dctx, task)
	if err != nil {
		// The exit stands as reported; only its cause is unknown.
		h.Logger.LogAttrs(ctx, slog.LevelWarn, "cannot tell whether the handler was killed for lack of memory",
			slog.String("app", req.App), slog.String("handler", req.Handler),
			slog.String("container_id", id), slog.Any("error", err))
		return ee
	}
	if n > before {
		ee.OOMKilled, ee.MemoryLimit = true, memoryLimit(req.Spec)
	}
	return ee
}
