package core

import (
	"context"
	"fmt"
	"syscall"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
)

// Ending says how the wait of an attempt for its handler ended.
type Ending int

const (
	EndExited    Ending = iota // the handler exited by itself
	EndTimedOut                // the rule's timeout expired and the handler was killed
	EndCancelled               // ctx was cancelled and the handler was killed
)

// NewTask creates cont's task. For a prepared container, whose snapshot
// mounts rootfs are known, that is one containerd call to create it and one
// to load it, where the client's NewTask makes five (docs/runtimes.md
// "One-shot containers"); rootfs is nil for any other container.
func (h *Host) NewTask(ctx context.Context, cont client.Container, rootfs []mount.Mount, ioCreate cio.Creator) (_ client.Task, err error) {
	if rootfs == nil {
		return cont.NewTask(ctx, ioCreate)
	}
	i, err := ioCreate(cont.ID())
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			i.Cancel()
			i.Close()
		}
	}()
	cfg := i.Config()
	req := &tasks.CreateTaskRequest{ContainerID: cont.ID(), Stdin: cfg.Stdin, Stdout: cfg.Stdout, Stderr: cfg.Stderr}
	for _, m := range rootfs {
		req.Rootfs = append(req.Rootfs, &types.Mount{Type: m.Type, Source: m.Source, Target: m.Target, Options: m.Options})
	}
	if _, err := h.Client.TaskService().Create(ctx, req); err != nil {
		return nil, errgrpc.ToNative(err)
	}
	// The task's IO is the one just created, not a new attachment.
	return cont.Task(ctx, func(*cio.FIFOSet) (cio.IO, error) { return i, nil })
}

// KillWait bounds the wait for a killed task's exit status.
const KillWait = 10 * time.Second

// Kill sends SIGKILL to every process of task and waits, at most KillWait,
// for its exit status on statusC; detached from ctx's cancellation.
func (h *Host) Kill(ctx context.Context, task client.Task, statusC <-chan client.ExitStatus) (client.ExitStatus, error) {
	dctx, cancel := h.Detached(ctx)
	defer cancel()
	if err := task.Kill(dctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return client.ExitStatus{}, err
	}
	select {
	case st := <-statusC:
		return st, nil
	case <-time.After(KillWait):
		return client.ExitStatus{}, fmt.Errorf("no exit %v after SIGKILL", KillWait)
	}
}

// OutputDrainTimeout bounds the wait for a finished handler's output to
// reach its destination before the task is deleted.
const OutputDrainTimeout = 10 * time.Second

// WaitUntil calls wait (a WaitGroup's Wait) and reports whether it
// returned before ctx ended; when ctx ends first, wait goes on alone.
func WaitUntil(ctx context.Context, wait func()) bool {
	done := make(chan struct{})
	go func() {
		wait()
		close(done)
	}()
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// DrainOutput waits until task's output copy has finished, or d passed,
// and reports whether it finished.
func DrainOutput(task client.Task, d time.Duration) bool {
	io := task.IO()
	if io == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return WaitUntil(ctx, io.Wait)
}
