package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime/containerd/internal/shim"
)

// Remove deletes container id with its task (killed first) and snapshot,
// and the snapshot id alone when there is no container; it ends a shim
// left running for id first (shim.Reaper.End), in the background if that
// shim is busy. Missing objects are not errors. It runs detached from
// ctx's cancellation.
func (h *Host) Remove(ctx context.Context, id string) error {
	return h.RemoveLeftover(ctx, id, false)
}

// RemoveLeftover is Remove, except that with keepIfBusy a container whose
// shim is busy stays, for a later call to finish: a sweeping process that
// dies meanwhile leaves the container, which the next sweep finds, rather
// than a shim no one can find. A container whose shim could not be ended
// stays too, busy or not, for the same reason.
func (h *Host) RemoveLeftover(ctx context.Context, id string, keepIfBusy bool) error {
	ctx, cancel := h.Detached(ctx)
	defer cancel()
	var errs []error
	c, err := h.Client.LoadContainer(ctx, id)
	switch {
	case err == nil:
		shimLeft := false // whether a shim of id may be left without its task
		if task, err := c.Task(ctx, nil); err == nil {
			if err := DeleteTask(ctx, c, task, client.WithProcessKill); err != nil {
				errs = append(errs, fmt.Errorf("delete task %s: %w", id, err))
			} else {
				// containerd asked the task's shim to exit: give it a
				// moment before taking it for one that will not.
				shimLeft = !h.Shims.Exits(ctx, id, shim.ExitWait)
			}
		} else if errdefs.IsNotFound(err) {
			shimLeft = true
		} else {
			errs = append(errs, fmt.Errorf("load task %s: %w", id, err))
		}
		if shimLeft {
			// A shim that containerd failed to stop (a creation of the
			// task that did not complete, a shim that did not exit when
			// asked) goes too. Before the container, so that a sweep
			// interrupted here finds the container again and retries.
			busy, err := h.Shims.End(ctx, id, !keepIfBusy)
			if err != nil {
				// The container stays for a later sweep to retry: once it
				// is gone, no sweep would find the shim again.
				errs = append(errs, err)
				return errors.Join(errs...)
			}
			if busy && keepIfBusy {
				h.Logger.LogAttrs(ctx, slog.LevelInfo, "leaving a leftover container to a later sweep: its containerd shim is still busy",
					slog.String("container_id", id))
				return errors.Join(errs...)
			}
		}
		if err := c.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container %s: %w", id, err))
		}
	case !errdefs.IsNotFound(err):
		errs = append(errs, fmt.Errorf("load container %s: %w", id, err))
	}
	if err := h.Client.SnapshotService(h.Snapshotter).Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("remove snapshot %s: %w", id, err))
	}
	if keepIfBusy && len(errs) == 0 {
		// A sweep's leftover may come from a dead client, which left its
		// FIFOs behind too; readers End kept open for a busy shim are no
		// longer needed.
		if err := h.Shims.ReleaseFIFOs(id); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// DeleteTask deletes c's task and treats an error as success when the task
// is gone afterwards. Two processes with the same host id (a Sweep and the
// Runner whose warm container it removes) can delete one task at once, and
// containerd 1.6 then answers the loser with "ttrpc: closed" because the
// shim exited mid-call. A task still present after an error gets one more
// Delete.
func DeleteTask(ctx context.Context, c client.Container, task client.Task, opts ...client.ProcessDeleteOpts) error {
	var err error
	for range 2 {
		if _, err = task.Delete(ctx, opts...); err == nil || errdefs.IsNotFound(err) {
			return nil
		}
		_, terr := c.Task(ctx, nil)
		if errdefs.IsNotFound(terr) {
			return nil
		}
	}
	return err
}
