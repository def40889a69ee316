// Package oneshot runs attempts in one-shot containers, a fresh container
// and snapshot for each, and does what does not depend on the attempt
// while no one waits: containers prepared ahead of demand, their tasks
// created ahead with the exec helper, and removal in the background
// (docs/runtimes.md "One-shot containers").
package oneshot

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/typeurl/v2"

	"github.com/relaydev/relay/internal/repeats"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/exechelper"
	"github.com/relaydev/relay/runtime/containerd/internal/secrets"
)

// One-shot containers off the critical path (docs/runtimes.md "One-shot
// containers"). Each attempt still gets its own fresh container and rootfs
// snapshot, but the parts of their life that do not depend on the attempt
// happen while no one waits:
//
//   - prepared containers: for each app that ran, up to
//     WithPreparedContainers containers (snapshot and container object,
//     no task) are created ahead of demand with the app's current Spec.
//     A Run takes one, writes the attempt's own OCI spec into it (its
//     environment differs per attempt) and creates the task. A prepared
//     container serves one attempt and is then removed like any other.
//     They carry the labels of every container plus LabelPrepared, are
//     marked live so that Sweep spares them while the Runner runs (and
//     removes them after a crash), and are removed when the app's Spec or
//     image changes (its generation), after IdleTimeout (or the
//     shorter warm idle timeout) without a Run of the app, and at Close;
//   - tasks created ahead: with the exec helper (WithExecHelper) a
//     prepared container also has its task, created and not started
//     (package exechelper); the attempt keeps the container's spec and
//     passes its environment on stdin;
//   - background removal: once the handler exited and its output is
//     drained, the task, container and snapshot are deleted in the
//     background; Close waits for those removals.

// IdleTimeout is how long an app's prepared containers outlive its last
// Run, unless Config.IdleTimeout is shorter: a quiet worker holds no
// containers for long.
const IdleTimeout = 10 * time.Second

// preparedRetryDelay is how long after a container of an app could not be
// prepared (a full disk, containerd refusing) no other is: attempts then
// create their containers, and a failure repeated attempt after attempt
// is not logged at each.
const preparedRetryDelay = 10 * time.Second

// LabelPrepared is "true" on a container prepared ahead of demand that no
// attempt has taken yet; its relay.handler label is empty until then.
const LabelPrepared = "relay.prepared"

// Config is what a Runner needs; Helper may be nil.
type Config struct {
	Host *core.Host
	// Prepare resolves a Spec into what its containers need, pulling the
	// image and building its dependencies.
	Prepare        func(context.Context, runtime.Spec) (core.Prepared, error)
	Secrets        *secrets.Stager
	Stdout, Stderr *runtime.Output
	// Helper creates the tasks of prepared containers; nil: they get
	// their task from the attempt taking them.
	Helper *exechelper.Helper
	// Prepared is how many containers are kept ready per app; 0: none
	// (WithPreparedContainers).
	Prepared int
	// IdleTimeout is how long prepared containers outlive their app's
	// last Run, at most the package's IdleTimeout.
	IdleTimeout time.Duration
}

// Runner runs attempts in one-shot containers and holds its prepared
// containers and background removals. It is safe for concurrent use.
type Runner struct {
	host           *core.Host
	prepare        func(context.Context, runtime.Spec) (core.Prepared, error)
	secrets        *secrets.Stager
	stdout, stderr *runtime.Output
	helper         *exechelper.Helper

	max         int // per app; 0: none
	idleTimeout time.Duration
	// failures keeps a failure to prepare containers that hits every app
	// alike (a full disk) to one line per cause per repeats.Window.
	failures *repeats.Log

	mu     sync.Mutex
	closed bool
	apps   map[string]*preparedApp
	bg     sync.WaitGroup // creations and removals in the background
}

// New returns the Runner of cfg; it creates nothing before its first Run.
func New(cfg Config) *Runner {
	return &Runner{host: cfg.Host, prepare: cfg.Prepare, secrets: cfg.Secrets, stdout: cfg.Stdout, stderr: cfg.Stderr,
		helper: cfg.Helper, max: cfg.Prepared, failures: repeats.New(), idleTimeout: min(IdleTimeout, cfg.IdleTimeout),
		apps: map[string]*preparedApp{}}
}

// Ready returns how many prepared containers of app are ready to be taken.
func (r *Runner) Ready(app string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if a := r.apps[app]; a != nil {
		return len(a.ready)
	}
	return 0
}

// preparedApp holds the prepared containers of one app generation.
type preparedApp struct {
	key     string // core.SpecKey of the Spec and image reference
	ready   []preparedContainer
	filling int // creations under way
	timer   *time.Timer
	failed  time.Time // when a creation last failed
}

type preparedContainer struct {
	id     string
	cont   client.Container
	rootfs []mount.Mount    // its snapshot's mounts
	pre    *exechelper.Task // its task, with the exec helper; nil without
}

// newContainer returns a container for req, tracked live: a prepared one
// given req's spec, with its snapshot's mounts for core.Host.NewTask, or a
// new one (rootfs nil). secrets, when not nil, are req's staged secrets, which its
// spec mounts. A prepared container whose task exists already (pre not
// nil) keeps its spec: req's secrets are copied into its secrets
// directory, and its environment comes with the header
// (exechelper.Task.Start).
// On error nothing is left and the id is no longer tracked, or, when ctx
// was cancelled, the removal of what is left is under way.
func (r *Runner) newContainer(ctx context.Context, req runtime.Request, p core.Prepared, secrets *secrets.Staged) (_ client.Container, id string, rootfs []mount.Mount, pre *exechelper.Task, _ error) {
	key := core.SpecKey(req.Spec, p.Ref)
	// The containers prepared for later attempts have none of this
	// attempt's mounts.
	template := p
	if secrets != nil {
		// p's mounts are shared with the runs of the same app: copy.
		p.Mounts = append(slices.Clip(p.Mounts), secrets.Mount())
	}
	if pc, ok := r.takePrepared(ctx, req.App, key, req.Spec, template); ok {
		var err error
		switch {
		case pc.pre == nil:
			err = r.assign(ctx, pc, req, p)
		case len(req.Spec.Secrets) > 0 && pc.pre.Secrets == nil:
			err = errors.New("no secrets directory")
		case len(req.Spec.Secrets) > 0:
			err = r.secrets.Refresh(pc.pre.Secrets, req.Spec.Secrets)
		}
		if err == nil {
			return pc.cont, pc.id, pc.rootfs, pc.pre, nil
		}
		// containerd lost it or refused the spec: remove it and create a
		// container the usual way, which reports what is wrong.
		r.host.Logger.LogAttrs(ctx, slog.LevelWarn, "a prepared container could not be used; creating one",
			slog.String("app", req.App), slog.String("container_id", pc.id), slog.Any("error", err))
		r.discardPrepared(ctx, req.App, pc)
	}
	id = core.ContainerID(req.App, req.Handler)
	labels := r.host.Labels(req.App, req.Handler)
	cont, err := r.createContainer(ctx, id, labels, p, p.Spec(req))
	if err != nil {
		if ctx.Err() != nil {
			r.removeCancelled(ctx, req, id)
		} else {
			r.removeUntracked(ctx, req, id)
		}
		return nil, "", nil, nil, core.Classify(fmt.Errorf("create container %s: %w", id, err))
	}
	return cont, id, nil, nil, nil
}

// createContainer creates container id with its snapshot, tracked live
// from before its creation (the caller untracks it).
func (r *Runner) createContainer(ctx context.Context, id string, labels map[string]string, p core.Prepared, spec []oci.SpecOpts) (client.Container, error) {
	r.host.Track(id, true)
	newOpts := []client.NewContainerOpts{
		client.WithImage(p.Img),
		client.WithSnapshotter(r.host.Snapshotter),
		client.WithNewSnapshot(id, p.Img, snapshots.WithLabels(labels)),
		client.WithContainerLabels(labels),
		client.WithNewSpec(spec...),
	}
	cont, err := r.host.Client.NewContainer(ctx, id, newOpts...)
	if errdefs.IsAlreadyExists(err) {
		// A leftover with our id (practically never, ids are random):
		// remove it and try once more.
		r.host.Logger.LogAttrs(ctx, slog.LevelWarn, "removing leftover container", slog.String("container_id", id))
		if rerr := r.host.Remove(ctx, id); rerr != nil {
			return nil, fmt.Errorf("%w (removing the leftover: %w)", err, rerr)
		}
		cont, err = r.host.Client.NewContainer(ctx, id, newOpts...)
	}
	return cont, err
}

// assign writes req's OCI spec and handler label into prepared container
// pc, in one containerd call.
func (r *Runner) assign(ctx context.Context, pc preparedContainer, req runtime.Request, p core.Prepared) error {
	c := containers.Container{ID: pc.id, Labels: map[string]string{core.LabelHandler: req.Handler}}
	s, err := oci.GenerateSpec(ctx, r.host.Client, &c, p.Spec(req)...)
	if err != nil {
		return err
	}
	if c.Spec, err = typeurl.MarshalAny(s); err != nil {
		return err
	}
	_, err = r.host.Client.ContainerService().Update(ctx, c, "spec", "labels."+core.LabelHandler, "labels."+LabelPrepared)
	return err
}

// relabel gives a prepared container whose task exists req's handler
// label, in place of LabelPrepared; its spec stays.
func (r *Runner) relabel(ctx context.Context, id string, req runtime.Request) error {
	c := containers.Container{ID: id, Labels: map[string]string{core.LabelHandler: req.Handler}}
	_, err := r.host.Client.ContainerService().Update(ctx, c, "labels."+core.LabelHandler, "labels."+LabelPrepared)
	return err
}

// takePrepared takes a prepared container of app's generation key, if one
// is ready, and starts creating replacements up to the bound. A change of
// key drops the containers of the previous generation.
func (r *Runner) takePrepared(ctx context.Context, app, key string, spec runtime.Spec, p core.Prepared) (preparedContainer, bool) {
	if r.max == 0 {
		return preparedContainer{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return preparedContainer{}, false
	}
	a := r.apps[app]
	if a == nil || a.key != key {
		if a != nil {
			r.dropPrepared(ctx, app, a)
		}
		a = &preparedApp{key: key}
		r.apps[app] = a
		a.timer = time.AfterFunc(r.idleTimeout, func() { r.expirePrepared(app, a) })
	} else {
		a.timer.Reset(r.idleTimeout)
	}
	var pc preparedContainer
	ok := len(a.ready) > 0
	if ok {
		pc = a.ready[0]
		a.ready = a.ready[1:]
	}
	for len(a.ready)+a.filling < r.max && time.Since(a.failed) >= preparedRetryDelay {
		a.filling++
		r.bg.Add(1)
		go r.fillPrepared(ctx, app, a, spec, p)
	}
	return pc, ok
}

// fillPrepared creates one prepared container for a and adds it, or
// removes it when a was dropped meanwhile.
func (r *Runner) fillPrepared(ctx context.Context, app string, a *preparedApp, spec runtime.Spec, p core.Prepared) {
	defer r.bg.Done()
	ctx, cancel := r.host.Detached(ctx)
	defer cancel()
	id := core.ContainerID(app, "")
	labels := r.host.Labels(app, "")
	labels[LabelPrepared] = "true"
	template := runtime.Request{App: app, Spec: spec}
	specOpts := p.Spec(template)
	var staged *secrets.Staged
	var err error
	helper := r.helper.Copy(ctx)
	if helper != "" {
		// The attempt's secrets are copied into this directory, mounted
		// now: a bind mount shows files written later.
		if len(spec.Secrets) > 0 {
			staged, err = r.secrets.Empty()
		}
		specOpts = append(specOpts, exechelper.Spec(helper, staged))
	}
	var cont client.Container
	if err == nil {
		cont, err = r.createContainer(ctx, id, labels, p, specOpts)
	}
	var rootfs []mount.Mount
	if err == nil {
		rootfs, err = r.host.Client.SnapshotService(r.host.Snapshotter).Mounts(ctx, id)
	}
	var pre *exechelper.Task
	if err == nil && helper != "" {
		pre, err = exechelper.NewTask(ctx, r.host, cont, rootfs, staged)
	}
	pc := preparedContainer{id: id, cont: cont, rootfs: rootfs, pre: pre}
	r.mu.Lock()
	a.filling--
	keep := err == nil && !r.closed && r.apps[app] == a
	if err != nil {
		a.failed = time.Now()
	}
	if keep {
		a.ready = append(a.ready, pc)
	}
	r.mu.Unlock()
	if keep {
		return
	}
	if err != nil {
		r.prepareFailed(ctx, app, id, err, time.Now())
	}
	if pre == nil {
		staged.Remove()
	}
	r.discardPrepared(ctx, app, pc)
}

// prepareFailed logs that preparing container id of app failed: at WARN
// once per cause per repeats.Window, at DEBUG in between, as the Engine
// logs the attempts the same cause fails (docs/operations.md#logs). A full
// disk fails the creations of every app at once, each naming a container
// and temporary directory of its own.
func (r *Runner) prepareFailed(ctx context.Context, app, id string, err error, now time.Time) {
	level, n := r.failures.Level(slog.LevelWarn, "preparing a container failed", repeats.Cause(err), now)
	r.host.Logger.LogAttrs(ctx, level, "preparing a container failed", repeats.Attr([]slog.Attr{slog.String("app", app),
		slog.String("container_id", id), slog.Any("error", err)}, n)...)
}

// discardPrepared removes prepared container pc, never used: its task
// first, if it has one, then the container and snapshot; then stops
// tracking it.
func (r *Runner) discardPrepared(ctx context.Context, app string, pc preparedContainer) {
	if pc.pre != nil {
		dctx, cancel := r.host.Detached(ctx)
		if err := pc.pre.Discard(dctx, pc.cont); err != nil {
			r.host.LogCleanup(dctx, runtime.Request{App: app}, pc.id, fmt.Errorf("delete task: %w", err))
		}
		cancel()
	}
	r.removeUntracked(ctx, runtime.Request{App: app}, pc.id)
}

// dropPrepared removes the ready containers of a, app's, in the background;
// creations under way remove theirs when they see a gone. Under
// Runner.mu.
func (r *Runner) dropPrepared(ctx context.Context, app string, a *preparedApp) {
	a.timer.Stop()
	for _, pc := range a.ready {
		r.bg.Add(1)
		go func() {
			defer r.bg.Done()
			r.discardPrepared(ctx, app, pc)
		}()
	}
	a.ready = nil
}

// expirePrepared drops the prepared containers of an app that has not run
// for the idle timeout.
func (r *Runner) expirePrepared(app string, a *preparedApp) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.apps[app] != a {
		return
	}
	delete(r.apps, app)
	r.dropPrepared(r.host.Background(), app, a)
}

// removeUntracked removes container id of req, its snapshot and any task,
// then stops tracking it.
func (r *Runner) removeUntracked(ctx context.Context, req runtime.Request, id string) {
	defer r.host.Track(id, false)
	r.host.LogCleanup(ctx, req, id, r.host.Remove(ctx, id))
}

// removeLater deletes an attempt's exited task, its container and snapshot
// in the background, then stops tracking the container.
func (r *Runner) removeLater(ctx context.Context, req runtime.Request, id string, cont client.Container, task client.Task) {
	r.later(func() {
		defer r.host.Track(id, false)
		dctx, cancel := r.host.Detached(ctx)
		defer cancel()
		var errs []error
		if err := core.DeleteTask(dctx, cont, task); err != nil {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
		if err := cont.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
		r.host.LogCleanup(dctx, req, id, errors.Join(errs...))
	})
}

// removeCancelled removes, in the background, what a containerd call
// cancelled mid-way may have left of container id (the container, its
// snapshot, a task), then stops tracking it: a cancelled attempt returns
// without waiting for containerd, which may be the reason for the
// cancellation (stalled; docs/operations.md "Faults").
func (r *Runner) removeCancelled(ctx context.Context, req runtime.Request, id string) {
	r.later(func() { r.removeUntracked(ctx, req, id) })
}

// later runs f in the background; Close waits for it. Once Close has
// begun, f runs before later returns.
func (r *Runner) later(f func()) {
	r.mu.Lock()
	closed := r.closed
	if !closed {
		r.bg.Add(1)
	}
	r.mu.Unlock()
	if closed {
		f()
		return
	}
	go func() {
		defer r.bg.Done()
		f()
	}()
}

// Close removes the prepared containers and waits, until ctx is done, for
// the removals under way. Run still works after Close, without prepared
// containers, and removes its container before it returns.
func (r *Runner) Close(ctx context.Context) {
	r.mu.Lock()
	r.closed = true
	for app, a := range r.apps {
		r.dropPrepared(r.host.Background(), app, a)
	}
	clear(r.apps)
	r.mu.Unlock()
	core.WaitUntil(ctx, r.bg.Wait)
}
