package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime"
)

// Ping checks that containerd answers and that the Runner's namespace can be
// listed. Its error wraps runtime.ErrUnavailable (relay.Pinger).
func (r *Runner) Ping(ctx context.Context) error {
	if _, err := r.client.Version(ctx); err != nil {
		return fmt.Errorf("containerd: ping: %w: %w", runtime.ErrUnavailable, err)
	}
	ctx = namespaces.WithNamespace(ctx, r.namespace)
	if _, err := r.client.ContainerService().List(ctx, hostFilter(r.hostID)); err != nil {
		return fmt.Errorf("containerd: ping namespace %s: %w: %w", r.namespace, runtime.ErrUnavailable, err)
	}
	return nil
}

// Sweep removes every container (with its task) and snapshot in the
// namespace labelled relay.host=<this host id> that does not belong to an
// invocation this Runner is running now: leftovers of a process that
// crashed mid-invocation, and containers whose removal failed while
// containerd was unavailable (an orphan would otherwise keep running past
// its timeout). It also removes those of any other host id whose presence
// label (LabelPresencePrefix) is older than the orphan timeout: a crashed
// worker that was replaced under another id, the shims of the namespace
// whose container is gone, and the secrets staged under TMPDIR for
// containers that are gone (docs/apps.md "Secrets"), and the copies of the
// exec helper and bootstraps that earlier Relay versions left in the state
// directory. And it
// records which dependency images this Runner's apps use and removes those
// no Runner used for the WithDepsRetention period (docs/runtimes.md
// "Dependencies").
// Call it at startup and then periodically. It is idempotent and returns
// the joined errors of the removals that failed.
func (r *Runner) Sweep(ctx context.Context) error {
	ctx = namespaces.WithNamespace(ctx, r.namespace)
	r.announce(ctx)
	err := r.sweepHost(ctx, r.hostID)
	if gerr := r.sweepGoneHosts(ctx); gerr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep gone workers: %w", classify(gerr)))
	}
	if serr := r.sweepShims(ctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep shims: %w", serr))
	}
	if serr := r.sweepSecrets(ctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep staged secrets: %w", serr))
	}
	if cerr := r.sweepCopies(ctx); cerr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep copies of earlier versions: %w", cerr))
	}
	if derr := r.maintainDeps(ctx); derr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: dependency images: %w", derr))
	}
	return err
}

// sweepHost removes the containers and snapshots labelled relay.host=host,
// except this Runner's live ones, task-less containers younger than the
// task-creation grace and, under this Runner's own host id, those of
// another live process (relay.owner).
func (r *Runner) sweepHost(ctx context.Context, host string) error {
	filter := hostFilter(host)
	conts, err := r.client.Containers(ctx, filter)
	if err != nil {
		return fmt.Errorf("containerd: sweep: list containers: %w", classify(err))
	}
	// Only under its own host id: others' pids may be in another pid
	// namespace (another pod), where they mean nothing here.
	spare := func(labels map[string]string) bool {
		return host == r.hostID && r.ownedByAnotherLiveRunner(ctx, labels[LabelOwner])
	}
	var errs []error
	for _, c := range conts {
		if r.isLive(c.ID()) {
			continue
		}
		// The listing's metadata: no call to containerd.
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err == nil && (spare(info.Labels) || r.mayGetTask(ctx, c, info.CreatedAt)) {
			continue
		}
		r.logger.LogAttrs(ctx, slog.LevelWarn, "removing leftover container", slog.String("container_id", c.ID()), slog.String("host_id", host))
		if err := r.removeLeftover(ctx, c.ID(), true); err != nil {
			errs = append(errs, err)
		}
	}
	// Snapshots whose container was never created, or is gone.
	sn := r.client.SnapshotService(r.snapshotter)
	var keys []string
	err = sn.Walk(ctx, func(_ context.Context, info snapshots.Info) error {
		if !spare(info.Labels) {
			keys = append(keys, info.Name)
		}
		return nil
	}, filter)
	if err != nil {
		errs = append(errs, fmt.Errorf("list snapshots: %w", err))
	}
	for _, k := range keys {
		if r.isLive(k) {
			continue
		}
		if err := sn.Remove(ctx, k); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove snapshot %s: %w", k, err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("containerd: sweep: %w", err)
	}
	return nil
}

// hostFilter selects objects labelled relay.host=host.
func hostFilter(host string) string {
	return "labels." + strconv.Quote(LabelHost) + "==" + strconv.Quote(host)
}

// remove deletes container id with its task (killed first) and snapshot,
// and the snapshot id alone when there is no container; it ends a shim
// left running for id first (endShim), in the background if that shim is
// busy. Missing objects are not errors. It runs detached from ctx's
// cancellation.
func (r *Runner) remove(ctx context.Context, id string) error {
	return r.removeLeftover(ctx, id, false)
}

// removeLeftover is remove, except that with keepIfBusy a container whose
// shim is busy stays, for a later call to finish: a sweeping process that
// dies meanwhile leaves the container, which the next sweep finds, rather
// than a shim no one can find. A container whose shim could not be ended
// stays too, busy or not, for the same reason.
func (r *Runner) removeLeftover(ctx context.Context, id string, keepIfBusy bool) error {
	ctx, cancel := r.detached(ctx)
	defer cancel()
	var errs []error
	c, err := r.client.LoadContainer(ctx, id)
	switch {
	case err == nil:
		shimLeft := false // whether a shim of id may be left without its task
		if task, err := c.Task(ctx, nil); err == nil {
			if err := deleteTask(ctx, c, task, client.WithProcessKill); err != nil {
				errs = append(errs, fmt.Errorf("delete task %s: %w", id, err))
			} else {
				// containerd asked the task's shim to exit: give it a
				// moment before taking it for one that will not.
				shimLeft = !r.shimExits(ctx, id, shimExitWait)
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
			busy, err := r.endShim(ctx, id, !keepIfBusy)
			if err != nil {
				// The container stays for a later sweep to retry: once it
				// is gone, no sweep would find the shim again.
				errs = append(errs, err)
				return errors.Join(errs...)
			}
			if busy && keepIfBusy {
				r.logger.LogAttrs(ctx, slog.LevelInfo, "leaving a leftover container to a later sweep: its containerd shim is still busy",
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
	if err := r.client.SnapshotService(r.snapshotter).Remove(ctx, id); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("remove snapshot %s: %w", id, err))
	}
	if keepIfBusy && len(errs) == 0 {
		// A sweep's leftover may come from a dead client, which left its
		// FIFOs behind too; readers endShim kept open for a busy shim
		// are no longer needed.
		r.fifos.close(id)
		if err := removeLeftFIFOs(fifoDir, id); err != nil {
			errs = append(errs, fmt.Errorf("remove the FIFOs of %s: %w", id, err))
		}
	}
	return errors.Join(errs...)
}

// mayGetTask reports whether c has no task yet but is younger than the
// task-creation grace (WithTaskCreationGrace): its task may still be being
// created.
func (r *Runner) mayGetTask(ctx context.Context, c client.Container, created time.Time) bool {
	if time.Since(created) >= r.taskGrace {
		return false
	}
	_, err := c.Task(ctx, nil)
	return errdefs.IsNotFound(err)
}

// deleteTask deletes c's task and treats an error as success when the task
// is gone afterwards. Two processes with the same host id (a Sweep and the
// Runner whose warm container it removes) can delete one task at once, and
// containerd 1.6 then answers the loser with "ttrpc: closed" because the
// shim exited mid-call. A task still present after an error gets one more
// Delete.
func deleteTask(ctx context.Context, c client.Container, task client.Task, opts ...client.ProcessDeleteOpts) error {
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
