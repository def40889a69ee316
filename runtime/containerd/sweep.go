package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/presence"
	"github.com/relaydev/relay/runtime/containerd/internal/statedir"
)

// Ping checks that containerd answers and that the Runner's namespace can be
// listed. Its error wraps runtime.ErrUnavailable (relay.Pinger).
func (r *Runner) Ping(ctx context.Context) error {
	h := r.host
	if _, err := h.Client.Version(ctx); err != nil {
		return fmt.Errorf("containerd: ping: %w: %w", runtime.ErrUnavailable, err)
	}
	ctx = namespaces.WithNamespace(ctx, h.Namespace)
	if _, err := h.Client.ContainerService().List(ctx, hostFilter(h.HostID)); err != nil {
		return fmt.Errorf("containerd: ping namespace %s: %w: %w", h.Namespace, runtime.ErrUnavailable, err)
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
	h := r.host
	ctx = namespaces.WithNamespace(ctx, h.Namespace)
	r.presence.Announce(ctx)
	err := r.sweepHost(ctx, h.HostID)
	if gerr := r.sweepGoneHosts(ctx); gerr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep gone workers: %w", core.Classify(gerr)))
	}
	if serr := h.Shims.Sweep(ctx, h.TaskGrace, h.IsLive); serr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep shims: %w", serr))
	}
	if serr := r.secrets.Sweep(ctx); serr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep staged secrets: %w", serr))
	}
	if cerr := statedir.Sweep(ctx, h, r.stateDir); cerr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: sweep copies of earlier versions: %w", cerr))
	}
	if derr := r.deps.Maintain(ctx); derr != nil {
		err = errors.Join(err, fmt.Errorf("containerd: dependency images: %w", derr))
	}
	return err
}

// sweepHost removes the containers and snapshots labelled relay.host=host,
// except this Runner's live ones, task-less containers younger than the
// task-creation grace and, under this Runner's own host id, those of
// another live process (relay.owner).
func (r *Runner) sweepHost(ctx context.Context, host string) error {
	h := r.host
	filter := hostFilter(host)
	conts, err := h.Client.Containers(ctx, filter)
	if err != nil {
		return fmt.Errorf("containerd: sweep: list containers: %w", core.Classify(err))
	}
	// Only under its own host id: others' pids may be in another pid
	// namespace (another pod), where they mean nothing here.
	spare := func(labels map[string]string) bool {
		return host == h.HostID && r.presence.OwnedByAnotherLiveRunner(ctx, labels[LabelOwner])
	}
	var errs []error
	for _, c := range conts {
		if h.IsLive(c.ID()) {
			continue
		}
		// The listing's metadata: no call to containerd.
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err == nil && (spare(info.Labels) || r.mayGetTask(ctx, c, info.CreatedAt)) {
			continue
		}
		h.Logger.LogAttrs(ctx, slog.LevelWarn, "removing leftover container", slog.String("container_id", c.ID()), slog.String("host_id", host))
		if err := h.RemoveLeftover(ctx, c.ID(), true); err != nil {
			errs = append(errs, err)
		}
	}
	// Snapshots whose container was never created, or is gone.
	sn := h.Client.SnapshotService(h.Snapshotter)
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
		if h.IsLive(k) {
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

// mayGetTask reports whether c has no task yet but is younger than the
// task-creation grace (WithTaskCreationGrace): its task may still be being
// created.
func (r *Runner) mayGetTask(ctx context.Context, c client.Container, created time.Time) bool {
	if time.Since(created) >= r.host.TaskGrace {
		return false
	}
	_, err := c.Task(ctx, nil)
	return errdefs.IsNotFound(err)
}

// sweepGoneHosts removes the containers and snapshots of every other host
// whose presence label is older than the orphan timeout, then the label.
// Hosts without a label (a Relay from before presence labels, another
// tool) are left alone.
func (r *Runner) sweepGoneHosts(ctx context.Context) error {
	h, orphan := r.host, r.presence.OrphanTimeout()
	if !r.presence.HealthyFor(orphan / 2) {
		return nil
	}
	labels, err := h.Client.NamespaceService().Labels(ctx, h.Namespace)
	if err != nil {
		return err
	}
	var errs []error
	for k, v := range labels {
		host, ok := strings.CutPrefix(k, LabelPresencePrefix)
		if !ok || host == h.HostID {
			continue
		}
		at, _, ok := presence.Parse(v)
		if !ok {
			continue // not ours to interpret
		}
		age := time.Since(at)
		if age < orphan {
			continue
		}
		h.Logger.LogAttrs(ctx, slog.LevelWarn, "removing the containers of a worker gone without cleaning up",
			slog.String("host_id", host), slog.Duration("last_seen_ago", age.Truncate(time.Second)))
		if err := r.sweepHost(ctx, host); err != nil {
			errs = append(errs, err)
			continue
		}
		// A host that comes back writes its label again at its next refresh.
		if err := h.Client.NamespaceService().SetLabel(ctx, h.Namespace, k, ""); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
