package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	tasks "github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types"
	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	"github.com/containerd/typeurl/v2"

	"github.com/relaydev/relay/internal/repeats"
	"github.com/relaydev/relay/runtime"
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
//     image changes (its generation), after preparedIdleTimeout (or the
//     shorter warm idle timeout) without a Run of the app, and at Close;
//   - tasks created ahead: with the exec helper (WithExecHelper) a
//     prepared container also has its task, created and not started
//     (exechelper.go); the attempt keeps the container's spec and passes
//     its environment on stdin;
//   - background removal: once the handler exited and its output is
//     drained, the task, container and snapshot are deleted in the
//     background; Close waits for those removals.

// DefaultPreparedContainers is WithPreparedContainers's default.
const DefaultPreparedContainers = 2

// preparedIdleTimeout is how long an app's prepared containers outlive its
// last Run: a quiet worker holds no containers for long.
const preparedIdleTimeout = 10 * time.Second

// preparedRetryDelay is how long after a container of an app could not be
// prepared (a full disk, containerd refusing) no other is: attempts then
// create their containers, and a failure repeated attempt after attempt
// is not logged at each.
const preparedRetryDelay = 10 * time.Second

// LabelPrepared is "true" on a container prepared ahead of demand that no
// attempt has taken yet; its relay.handler label is empty until then.
const LabelPrepared = "relay.prepared"

// WithPreparedContainers sets how many one-shot containers (snapshot and
// container object) are kept ready per app, created in the background after
// the app's first Run, so that a Run skips their creation (docs/runtimes.md
// "One-shot containers"); they are removed 10 s after the app's last Run.
// n must be >= 0; 0 disables them, which suits a
// process that runs a few attempts and exits (relay app invoke).
// Default: DefaultPreparedContainers.
func WithPreparedContainers(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return errors.New("containerd: WithPreparedContainers: must be >= 0")
		}
		o.preparedContainers = n
		return nil
	}
}

// oneShots holds a Runner's prepared containers and background removals.
type oneShots struct {
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

// preparedApp holds the prepared containers of one app generation.
type preparedApp struct {
	key     string // warmKey of the Spec and image reference
	ready   []preparedContainer
	filling int // creations under way
	timer   *time.Timer
	failed  time.Time // when a creation last failed
}

type preparedContainer struct {
	id     string
	cont   client.Container
	rootfs []mount.Mount // its snapshot's mounts
	pre    *preTask      // its task, with the exec helper; nil without
}

// newContainer returns a container for req, tracked live: a prepared one
// given req's spec, with its snapshot's mounts for newTask, or a new one
// (rootfs nil). secrets, when not nil, are req's staged secrets, which its
// spec mounts. A prepared container whose task exists already (pre not
// nil) keeps its spec: req's secrets are copied into its secrets
// directory, and its environment comes with the header (preTask.start).
// On error nothing is left and the id is no longer tracked, or, when ctx
// was cancelled, the removal of what is left is under way.
func (r *Runner) newContainer(ctx context.Context, req runtime.Request, p prepared, secrets *stagedSecrets) (_ client.Container, id string, rootfs []mount.Mount, pre *preTask, _ error) {
	key := warmKey(req.Spec, p.ref)
	// The containers prepared for later attempts have none of this
	// attempt's mounts.
	template := p
	if secrets != nil {
		// p's mounts are shared with the runs of the same app: copy.
		p.mounts = append(slices.Clip(p.mounts), secrets.mount())
	}
	if pc, ok := r.takePrepared(ctx, req.App, key, req.Spec, template); ok {
		var err error
		switch {
		case pc.pre == nil:
			err = r.assign(ctx, pc, req, p)
		case len(req.Spec.Secrets) > 0 && pc.pre.secrets == nil:
			err = errors.New("no secrets directory")
		case len(req.Spec.Secrets) > 0:
			err = r.refreshSecrets(pc.pre.secrets, req.Spec.Secrets)
		}
		if err == nil {
			return pc.cont, pc.id, pc.rootfs, pc.pre, nil
		}
		// containerd lost it or refused the spec: remove it and create a
		// container the usual way, which reports what is wrong.
		r.logger.LogAttrs(ctx, slog.LevelWarn, "a prepared container could not be used; creating one",
			slog.String("app", req.App), slog.String("container_id", pc.id), slog.Any("error", err))
		r.discardPrepared(ctx, req.App, pc)
	}
	id = containerID(req.App, req.Handler)
	labels := r.labels(req.App, req.Handler)
	cont, err := r.createContainer(ctx, id, labels, p, p.spec(req))
	if err != nil {
		if ctx.Err() != nil {
			r.removeCancelled(ctx, req, id)
		} else {
			r.removeUntracked(ctx, req, id)
		}
		return nil, "", nil, nil, classify(fmt.Errorf("create container %s: %w", id, err))
	}
	return cont, id, nil, nil, nil
}

func (r *Runner) labels(app, handler string) map[string]string {
	return map[string]string{LabelHost: r.hostID, LabelOwner: r.presence.owner, LabelApp: app, LabelHandler: handler}
}

// createContainer creates container id with its snapshot, tracked live
// from before its creation (the caller untracks it).
func (r *Runner) createContainer(ctx context.Context, id string, labels map[string]string, p prepared, spec []oci.SpecOpts) (client.Container, error) {
	r.track(id, true)
	newOpts := []client.NewContainerOpts{
		client.WithImage(p.img),
		client.WithSnapshotter(r.snapshotter),
		client.WithNewSnapshot(id, p.img, snapshots.WithLabels(labels)),
		client.WithContainerLabels(labels),
		client.WithNewSpec(spec...),
	}
	cont, err := r.client.NewContainer(ctx, id, newOpts...)
	if errdefs.IsAlreadyExists(err) {
		// A leftover with our id (practically never, ids are random):
		// remove it and try once more.
		r.logger.LogAttrs(ctx, slog.LevelWarn, "removing leftover container", slog.String("container_id", id))
		if rerr := r.remove(ctx, id); rerr != nil {
			return nil, fmt.Errorf("%w (removing the leftover: %w)", err, rerr)
		}
		cont, err = r.client.NewContainer(ctx, id, newOpts...)
	}
	return cont, err
}

// assign writes req's OCI spec and handler label into prepared container
// pc, in one containerd call.
func (r *Runner) assign(ctx context.Context, pc preparedContainer, req runtime.Request, p prepared) error {
	c := containers.Container{ID: pc.id, Labels: map[string]string{LabelHandler: req.Handler}}
	s, err := oci.GenerateSpec(ctx, r.client, &c, p.spec(req)...)
	if err != nil {
		return err
	}
	if c.Spec, err = typeurl.MarshalAny(s); err != nil {
		return err
	}
	_, err = r.client.ContainerService().Update(ctx, c, "spec", "labels."+LabelHandler, "labels."+LabelPrepared)
	return err
}

// relabel gives a prepared container whose task exists req's handler
// label, in place of LabelPrepared; its spec stays.
func (r *Runner) relabel(ctx context.Context, id string, req runtime.Request) error {
	c := containers.Container{ID: id, Labels: map[string]string{LabelHandler: req.Handler}}
	_, err := r.client.ContainerService().Update(ctx, c, "labels."+LabelHandler, "labels."+LabelPrepared)
	return err
}

// takePrepared takes a prepared container of app's generation key, if one
// is ready, and starts creating replacements up to the bound. A change of
// key drops the containers of the previous generation.
func (r *Runner) takePrepared(ctx context.Context, app, key string, spec runtime.Spec, p prepared) (preparedContainer, bool) {
	o := &r.oneShot
	if o.max == 0 {
		return preparedContainer{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return preparedContainer{}, false
	}
	a := o.apps[app]
	if a == nil || a.key != key {
		if a != nil {
			r.dropPrepared(ctx, app, a)
		}
		a = &preparedApp{key: key}
		o.apps[app] = a
		a.timer = time.AfterFunc(o.idleTimeout, func() { r.expirePrepared(app, a) })
	} else {
		a.timer.Reset(o.idleTimeout)
	}
	var pc preparedContainer
	ok := len(a.ready) > 0
	if ok {
		pc = a.ready[0]
		a.ready = a.ready[1:]
	}
	for len(a.ready)+a.filling < o.max && time.Since(a.failed) >= preparedRetryDelay {
		a.filling++
		o.bg.Add(1)
		go r.fillPrepared(ctx, app, a, spec, p)
	}
	return pc, ok
}

// fillPrepared creates one prepared container for a and adds it, or
// removes it when a was dropped meanwhile.
func (r *Runner) fillPrepared(ctx context.Context, app string, a *preparedApp, spec runtime.Spec, p prepared) {
	o := &r.oneShot
	defer o.bg.Done()
	ctx, cancel := r.detached(ctx)
	defer cancel()
	id := containerID(app, "")
	labels := r.labels(app, "")
	labels[LabelPrepared] = "true"
	template := runtime.Request{App: app, Spec: spec}
	specOpts := p.spec(template)
	var secrets *stagedSecrets
	var err error
	helper := r.helperCopy(ctx)
	if helper != "" {
		// The attempt's secrets are copied into this directory, mounted
		// now: a bind mount shows files written later.
		if len(spec.Secrets) > 0 {
			secrets, err = r.newSecretsDir()
		}
		specOpts = append(specOpts, r.helperSpec(helper, secrets))
	}
	var cont client.Container
	if err == nil {
		cont, err = r.createContainer(ctx, id, labels, p, specOpts)
	}
	var rootfs []mount.Mount
	if err == nil {
		rootfs, err = r.client.SnapshotService(r.snapshotter).Mounts(ctx, id)
	}
	var pre *preTask
	if err == nil && helper != "" {
		pre, err = r.newPreTask(ctx, cont, rootfs, secrets)
	}
	pc := preparedContainer{id: id, cont: cont, rootfs: rootfs, pre: pre}
	o.mu.Lock()
	a.filling--
	keep := err == nil && !o.closed && o.apps[app] == a
	if err != nil {
		a.failed = time.Now()
	}
	if keep {
		a.ready = append(a.ready, pc)
	}
	o.mu.Unlock()
	if keep {
		return
	}
	if err != nil {
		r.prepareFailed(ctx, app, id, err, time.Now())
	}
	if pre == nil {
		secrets.remove()
	}
	r.discardPrepared(ctx, app, pc)
}

// prepareFailed logs that preparing container id of app failed: at WARN
// once per cause per repeats.Window, at DEBUG in between, as the Engine
// logs the attempts the same cause fails (docs/operations.md#logs). A full
// disk fails the creations of every app at once, each naming a container
// and temporary directory of its own.
func (r *Runner) prepareFailed(ctx context.Context, app, id string, err error, now time.Time) {
	level, n := r.oneShot.failures.Level(slog.LevelWarn, "preparing a container failed", repeats.Cause(err), now)
	r.logger.LogAttrs(ctx, level, "preparing a container failed", repeats.Attr([]slog.Attr{slog.String("app", app),
		slog.String("container_id", id), slog.Any("error", err)}, n)...)
}

// discardPrepared removes prepared container pc, never used: its task
// first, if it has one, then the container and snapshot; then stops
// tracking it.
func (r *Runner) discardPrepared(ctx context.Context, app string, pc preparedContainer) {
	if pc.pre != nil {
		dctx, cancel := r.detached(ctx)
		if err := pc.pre.discard(dctx, pc.cont); err != nil {
			r.cleanup(dctx, runtime.Request{App: app}, pc.id, fmt.Errorf("delete task: %w", err))
		}
		cancel()
	}
	r.removeUntracked(ctx, runtime.Request{App: app}, pc.id)
}

// dropPrepared removes the ready containers of a, app's, in the background;
// creations under way remove theirs when they see a gone. Under
// oneShots.mu.
func (r *Runner) dropPrepared(ctx context.Context, app string, a *preparedApp) {
	a.timer.Stop()
	for _, pc := range a.ready {
		r.oneShot.bg.Add(1)
		go func() {
			defer r.oneShot.bg.Done()
			r.discardPrepared(ctx, app, pc)
		}()
	}
	a.ready = nil
}

// expirePrepared drops the prepared containers of an app that has not run
// for the idle timeout.
func (r *Runner) expirePrepared(app string, a *preparedApp) {
	o := &r.oneShot
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.apps[app] != a {
		return
	}
	delete(o.apps, app)
	r.dropPrepared(r.backgroundContext(), app, a)
}

// removeUntracked removes container id of req, its snapshot and any task,
// then stops tracking it.
func (r *Runner) removeUntracked(ctx context.Context, req runtime.Request, id string) {
	defer r.track(id, false)
	r.cleanup(ctx, req, id, r.remove(ctx, id))
}

// removeLater deletes an attempt's exited task, its container and snapshot
// in the background, then stops tracking the container.
func (r *Runner) removeLater(ctx context.Context, req runtime.Request, id string, cont client.Container, task client.Task) {
	r.later(func() {
		defer r.track(id, false)
		dctx, cancel := r.detached(ctx)
		defer cancel()
		var errs []error
		if err := deleteTask(dctx, cont, task); err != nil {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
		if err := cont.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
		r.cleanup(dctx, req, id, errors.Join(errs...))
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
	o := &r.oneShot
	o.mu.Lock()
	closed := o.closed
	if !closed {
		o.bg.Add(1)
	}
	o.mu.Unlock()
	if closed {
		f()
		return
	}
	go func() {
		defer o.bg.Done()
		f()
	}()
}

// closeOneShots removes the prepared containers and waits, until ctx is
// done, for the removals under way.
func (r *Runner) closeOneShots(ctx context.Context) {
	o := &r.oneShot
	o.mu.Lock()
	o.closed = true
	for app, a := range o.apps {
		r.dropPrepared(r.backgroundContext(), app, a)
	}
	clear(o.apps)
	o.mu.Unlock()
	waitUntil(ctx, o.bg.Wait)
}

// newTask creates cont's task. For a prepared container, whose snapshot
// mounts rootfs are known, that is one containerd call to create it and one
// to load it, where the client's NewTask makes five (docs/runtimes.md
// "One-shot containers"); rootfs is nil for any other container.
func (r *Runner) newTask(ctx context.Context, cont client.Container, rootfs []mount.Mount, ioCreate cio.Creator) (_ client.Task, err error) {
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
	if _, err := r.client.TaskService().Create(ctx, req); err != nil {
		return nil, errgrpc.ToNative(err)
	}
	// The task's IO is the one just created, not a new attachment.
	return cont.Task(ctx, func(*cio.FIFOSet) (cio.IO, error) { return i, nil })
}

// backgroundContext is the context of work no Run waits for.
func (r *Runner) backgroundContext() context.Context {
	return namespaces.WithNamespace(context.Background(), r.namespace)
}
