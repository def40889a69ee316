package containerd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/internal/repeats"
	"github.com/relaydev/relay/runtime"
)

// Runner runs invocations in containerd (relay.Runner). Create it with New.
type Runner struct {
	client         *client.Client
	address        string // containerd's socket, which names shim sockets; "" when unknown
	namespace      string
	snapshotter    string
	hostID         string
	stdout, stderr *runtime.Output
	defaultImages  map[string]string
	logger         *slog.Logger
	cleanupTimeout time.Duration
	taskGrace      time.Duration
	orphanTimeout  time.Duration
	presence       presence

	pull                 bool
	pullTimeout          time.Duration
	pullRetryInterval    time.Duration
	pullProgressInterval time.Duration
	pulls                pulls

	bootstraps bootstrapFiles
	secretsDir string
	deps       depsBuilder
	images     imageFacts

	mu   sync.Mutex
	live map[string]struct{} // containers of invocations in flight and warm ones, which Sweep spares

	shimWork sync.WaitGroup // background stops of busy shims (endShim)
	fifos    fifoReaders    // readers of FIFOs dead clients left (fifo.go)
	// fifoDenied logs once that a shim's FIFOs may not be read (endShim).
	fifoDenied sync.Once
	// shimsAlone holds when each shim sweepShims found without a
	// container was first seen so, by PID; owned by sweepShims.
	shimsAlone struct {
		sync.Mutex
		since map[int]time.Time
	}

	warm    warmPools
	oneShot oneShots
	// helper is the installed copy of the exec helper (WithExecHelper);
	// without one prepared containers have no task.
	helper execHelper
}

// New returns a Runner using c, a ready client; the Runner never closes it.
// New does not contact containerd and writes no file; call Ping to check
// containerd and Sweep at startup to remove leftovers of a previous run on
// this host.
func New(c *client.Client, opts ...Option) (*Runner, error) {
	if c == nil {
		return nil, errors.New("containerd: New: nil client")
	}
	o, err := newOptions(opts)
	if err != nil {
		return nil, err
	}
	r := &Runner{
		client:         c,
		address:        clientAddress(c),
		namespace:      o.namespace,
		snapshotter:    o.snapshotter,
		hostID:         o.hostID,
		defaultImages:  o.defaultImages,
		logger:         o.logger,
		cleanupTimeout: o.cleanupTimeout,
		taskGrace:      o.taskCreationGrace,
		orphanTimeout:  o.orphanTimeout,
		presence:       presence{stop: make(chan struct{}), owner: ownerPrefix() + "-" + randomHex(6)},

		pull:                 o.pull,
		pullTimeout:          o.pullTimeout,
		pullRetryInterval:    o.pullRetryInterval,
		pullProgressInterval: o.pullProgressInterval,
		pulls:                pulls{inflight: map[string]*pullCall{}, failed: map[string]pullFailure{}, reported: map[string]pullReport{}},

		bootstraps: bootstrapFiles{stateDir: o.stateDir, verified: map[string]bool{}},
		secretsDir: o.secretsDir,
		deps:       newDepsBuilder(o),
		live:       map[string]struct{}{},
		warm: warmPools{
			maxInvocations: o.warmMaxInvocations,
			idleTimeout:    o.warmIdleTimeout,
			maxContainers:  o.warmMaxContainers,
			apps:           map[string]*warmApp{},
			all:            map[*warmContainer]struct{}{},
		},
		oneShot: oneShots{max: o.preparedContainers, failures: repeats.New(), idleTimeout: min(preparedIdleTimeout, o.warmIdleTimeout),
			apps: map[string]*preparedApp{}},
	}
	r.stdout, r.stderr = runtime.SharedOutputs(o.stdout, o.stderr)
	if o.execHelper != "" && o.preparedContainers > 0 {
		path, data, err := installExecHelper(o.execHelper, o.stateDir)
		if err != nil {
			r.logger.Warn("the exec helper cannot be used: prepared one-shot containers get their task on demand",
				slog.String("path", o.execHelper), slog.Any("error", err))
		}
		r.helper = execHelper{path: path, data: data}
	}
	liveRunners.Store(r.presence.owner, struct{}{})
	return r, nil
}

// Namespace returns the containerd namespace the Runner works in.
func (r *Runner) Namespace() string { return r.namespace }

// HostID returns the value of the relay.host label on what the Runner creates.
func (r *Runner) HostID() string { return r.hostID }

// Run runs one attempt in a new container and waits for it (relay.Runner).
//
// Outcomes: nil when the handler exits 0; *runtime.ExitError with the exit
// code when it exits non-zero, with TimedOut when req.Timeout expired and the
// container was killed (SIGKILL), with OOMKilled and MemoryLimit when the
// kernel killed it at the container's memory limit (code 137; the
// container's memory cgroup counted the kill), with code 127 or 126 when
// the command cannot be executed (for runtime apps, 127 also when the
// handler's module or function does not exist: runtime.ExitHandlerNotFound).
// An image that is neither in the namespace nor pullable, an app directory
// that does not exist, a bootstrap that cannot be written to the state
// directory and an unreachable containerd are errors wrapping
// runtime.ErrUnavailable; other
// containerd failures are plain errors. An absent image is pulled first
// (WithPull), which Run waits for. When ctx is cancelled (shutdown) the
// container is killed and Run returns an error wrapping ctx.Err(). The
// container, task and snapshot are removed once the handler exited: in the
// background when it exited and its output is complete, which Close waits
// for, before Run returns otherwise. The container may have been prepared
// ahead of demand (WithPreparedContainers), with its task when the Runner
// has the exec helper (WithExecHelper), never for another attempt
// (docs/runtimes.md "One-shot containers").
// req.Timeout and Result.Duration count from the start of the handler
// process, not including container setup (about 150 ms) nor a pull.
//
// When req.Spec.Warm is set (a language runtime is then required, or Run
// fails with an error wrapping runtime.ErrUnavailable) the attempt runs in a
// warm container of the app instead, started if none is free and kept for
// later attempts (docs/runtimes.md "Warm containers"): the outcomes are the
// same, except that a handler failure leaves the container serving, and
// req.Timeout and Result.Duration count from the request's delivery to the
// container. The processes the invocation started are killed before Run
// returns. A timeout, a cancellation, the death of the bootstrap or its
// failure to confirm that no process of the invocation is left removes
// that container before Run returns.
func (r *Runner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	name := req.App + "/" + req.Handler
	r.announce(ctx)
	run := r.run
	if req.Spec.Warm {
		run = r.runWarm
	}
	res, err := run(namespaces.WithNamespace(ctx, r.namespace), req)
	if err == nil {
		return res, nil
	}
	if _, ok := errors.AsType[*runtime.ExitError](err); ok {
		return res, err
	}
	if ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		// Shutdown interrupted a containerd call: report the cancellation.
		return res, fmt.Errorf("run %s: %w (%v)", name, ctx.Err(), err)
	}
	return res, fmt.Errorf("run %s: %w", name, err)
}

// prepared is what a container of one Spec needs, resolved and checked.
type prepared struct {
	ref     string
	img     client.Image
	imgSpec ocispec.Image
	appDir  string   // absolute
	argv    []string // nil: the image's entrypoint
	mounts  []specs.Mount
	// specOpts adjust the spec after specOpts (the dependencies' paths).
	specOpts []oci.SpecOpts
}

// spec returns the OCI spec options of a container running req.
func (p prepared) spec(req runtime.Request) []oci.SpecOpts {
	return append(specOpts(req, p.imgSpec, p.appDir, p.argv, p.mounts), p.specOpts...)
}

// prepare resolves spec's image and command, checks its app directory and
// writes the bootstrap a language runtime needs.
func (r *Runner) prepare(ctx context.Context, spec runtime.Spec) (prepared, error) {
	ref, argv, boot, err := r.resolve(spec)
	if err != nil {
		return prepared{}, err
	}
	appDir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return prepared{}, err
	}
	fi, err := os.Stat(appDir)
	if err != nil || !fi.IsDir() {
		return prepared{}, fmt.Errorf("app directory %q is not a directory: %w", appDir, runtime.ErrUnavailable)
	}
	// The handler runs as HandlerUID, which sees /app through the "other"
	// permission bits; without them every attempt would fail inside.
	if fi.Mode().Perm()&0o005 != 0o005 {
		return prepared{}, fmt.Errorf("app directory %q (mode %s) is not readable by the handler user (uid %d): run chmod -R o+rX %s: %w",
			appDir, fi.Mode().Perm(), HandlerUID, appDir, runtime.ErrUnavailable)
	}
	img, err := r.image(ctx, ref)
	if err != nil {
		return prepared{}, err
	}
	var extraOpts []oci.SpecOpts
	if spec.Deps != nil && spec.Runtime != "" {
		// The app's dependencies: the runtime image plus their layer.
		built, err := r.ensureDeps(ctx, spec, ref, img, filepath.Base(appDir))
		if err != nil {
			return prepared{}, err
		}
		img = built.image
		extraOpts = append(extraOpts, depsEnv(spec))
	}
	imgSpec, err := r.images.spec(ctx, img)
	if err != nil {
		return prepared{}, classify(fmt.Errorf("image %s: %w", ref, err))
	}
	var mounts []specs.Mount
	if boot != nil {
		m, err := r.bootstraps.mount(*boot)
		if err != nil {
			return prepared{}, err
		}
		argv, mounts = boot.Command(m.Destination), []specs.Mount{m}
	}
	return prepared{ref: ref, img: img, imgSpec: imgSpec, appDir: appDir, argv: argv, mounts: mounts, specOpts: extraOpts}, nil
}

func (r *Runner) run(ctx context.Context, req runtime.Request) (_ runtime.Result, runErr error) {
	p, err := r.prepare(ctx, req.Spec)
	if err != nil {
		return runtime.Result{}, err
	}
	// Read now, so that a rotated secret is used from this invocation on;
	// removed when the run returns (deferred first, runs last).
	secrets, err := r.stageSecrets(req.Spec.Secrets)
	if err != nil {
		return runtime.Result{}, err
	}
	defer secrets.remove()
	cont, id, rootfs, pre, err := r.newContainer(ctx, req, p, secrets)
	if err != nil {
		return runtime.Result{}, err
	}
	if pre != nil {
		// After the task's deletion below (deferred later, runs first).
		defer pre.release()
	}
	prefix := runtime.Prefix(req.App, req.Handler)
	a := &oneShotRun{r: r, req: req, id: id, cont: cont, pre: pre,
		stdout: r.stdout.LineWriter(prefix), stderr: r.stderr.LineWriter(prefix)}
	defer func() { a.end(ctx, runErr) }()
	statusC, err := a.begin(ctx, p, rootfs)
	if err != nil {
		return runtime.Result{}, err
	}
	started := time.Now()
	status, ended, err := a.await(ctx, statusC)
	if err != nil {
		return runtime.Result{}, err
	}
	a.exited = true
	res := runtime.Result{Duration: time.Since(started)}
	code, _, err := status.Result()
	switch {
	case ended == endCancelled:
		return res, ctx.Err()
	case err != nil:
		return res, a.unknown(fmt.Errorf("wait task %s: %w", id, err))
	case ended == endTimedOut:
		return res, &runtime.ExitError{Code: int(code), TimedOut: true, Timeout: req.Timeout}
	case code != 0:
		return res, r.exitError(ctx, req, id, a.task, int(code), 0)
	}
	return res, nil
}

// oneShotRun is one attempt in a one-shot container (Runner.run): its
// container, its task once created, and the writers of its output.
type oneShotRun struct {
	r              *Runner
	req            runtime.Request
	id             string
	cont           client.Container
	pre            *preTask // the task created ahead, or nil
	stdout, stderr *runtime.LineWriter

	task   client.Task
	exited bool // the task's exit status was received
	// waitCtx bounds the waits for the exit status; cancelWait, at the
	// end of the attempt, ends them.
	waitCtx    context.Context
	cancelWait func()
	relabelled chan struct{} // closed once a prepared container is relabelled
}

// unknown marks err as leaving the attempt's outcome unknown: from Start
// on the handler may be running, so losing track of it is not "never ran".
func (a *oneShotRun) unknown(err error) error {
	return fmt.Errorf("%w: %w", runtime.ErrOutcomeUnknown, err)
}

// begin creates the attempt's task (or takes the one created ahead),
// waits for its exit and starts it; it returns where the exit status
// arrives.
func (a *oneShotRun) begin(ctx context.Context, p prepared, rootfs []mount.Mount) (<-chan client.ExitStatus, error) {
	var env []string // the attempt's environment, for a task created ahead
	var err error
	if a.pre == nil {
		ioCreator := cio.NewCreator(cio.WithStreams(bytes.NewReader(a.req.Event), a.stdout, a.stderr))
		if a.task, err = a.r.newTask(ctx, a.cont, rootfs, ioCreator); err != nil {
			if ee := execError(err); ee != nil {
				return nil, ee
			}
			return nil, classify(fmt.Errorf("create task %s: %w", a.id, err))
		}
	} else {
		a.task = a.pre.task
		if env, err = a.r.attemptEnv(ctx, a.id, a.req, p); err != nil {
			return nil, fmt.Errorf("environment of %s: %w", a.id, err)
		}
	}
	// Wait before Start so that the exit cannot be missed. Its context is
	// detached: after a timeout or cancellation we still wait for the exit
	// caused by the kill.
	a.waitCtx, a.cancelWait = context.WithCancel(context.WithoutCancel(ctx))
	statusC, err := a.task.Wait(a.waitCtx)
	if err != nil {
		return nil, classify(fmt.Errorf("wait task %s: %w", a.id, err))
	}
	start := a.task.Start
	if a.pre != nil {
		a.relabel(ctx)
		start = func(ctx context.Context) error { return a.pre.start(ctx, env, a.req.Event, a.stdout, a.stderr) }
	}
	if err := start(ctx); err != nil {
		if ee := execError(err); ee != nil {
			return nil, ee
		}
		if errdefs.IsUnavailable(err) {
			// The connection broke during Start: the process may have been
			// launched. Fail closed rather than run it again uncharged.
			return nil, a.unknown(fmt.Errorf("start task %s: %w", a.id, err))
		}
		return nil, classify(fmt.Errorf("start task %s: %w", a.id, err))
	}
	return statusC, nil
}

// relabel labels a prepared container as the attempt's, beside the start
// and before Run returns (end waits for it): the container is no longer a
// prepared one. Only its listing depends on it.
func (a *oneShotRun) relabel(ctx context.Context) {
	a.relabelled = make(chan struct{})
	go func() {
		defer close(a.relabelled)
		dctx, cancel := a.r.detached(ctx)
		defer cancel()
		if err := a.r.relabel(dctx, a.id, a.req); err != nil {
			a.r.logger.LogAttrs(dctx, slog.LevelWarn, "labelling a prepared container failed",
				slog.String("app", a.req.App), slog.String("container_id", a.id), slog.Any("error", err))
		}
	}()
}

// How an attempt's wait for its handler ended.
type ending int

const (
	endExited    ending = iota // the handler exited by itself
	endTimedOut                // the rule's timeout expired and the handler was killed
	endCancelled               // ctx was cancelled and the handler was killed
)

// await waits for the started handler's exit, the rule's timeout or ctx,
// and returns the exit status and how the wait ended. A handler still
// running at the timeout or cancellation is killed, and the status is the
// one of the kill. Errors leave the outcome unknown.
func (a *oneShotRun) await(ctx context.Context, statusC <-chan client.ExitStatus) (client.ExitStatus, ending, error) {
	// The shim holds stdin open until told otherwise: without this the
	// handler never sees EOF after the event (docs/apps.md "The handler
	// contract").
	if err := a.task.CloseIO(ctx, client.WithStdinCloser); err != nil {
		// Harmless if the handler already exited; anything else is not.
		select {
		case status := <-statusC:
			replay := make(chan client.ExitStatus, 1)
			replay <- status
			statusC = replay
		case <-time.After(time.Second):
			return client.ExitStatus{}, endExited, a.unknown(fmt.Errorf("close stdin of %s: %w", a.id, err))
		}
	}
	var timeout <-chan time.Time
	if a.req.Timeout > 0 {
		t := time.NewTimer(a.req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	status, ended, statusC, err := a.rewait(ctx, statusC, timeout)
	if err != nil || ended == endExited {
		return status, ended, err
	}
	// The timer or ctx fired, which says nothing of the handler when the
	// worker was stopped past the timeout (SIGSTOP, a stalled VM) or its
	// exit's report is on its way: containerd's task state decides, and a
	// handler that exited by itself is reported with its own exit
	// (docs/delivery.md "Leases").
	if st, ok := a.exitedStatus(ctx); ok {
		return st, endExited, nil
	}
	if statusC == nil {
		// Lost and not waited for again: the kill waits for the exit on
		// statusC.
		if sc, err := a.task.Wait(a.waitCtx); err == nil {
			statusC = sc
		}
	}
	if status, err = a.r.kill(ctx, a.task, statusC); err != nil {
		return status, ended, a.unknown(fmt.Errorf("kill task %s: %w", a.id, err))
	}
	if code, _, err := status.Result(); err == nil && code != sigkillExit {
		// It exited by itself between the look and the kill.
		return status, endExited, nil
	}
	return status, ended, nil
}

// rewait waits for the handler's exit as awaitExit does and, when
// containerd went away mid-wait (a restart), waits again: the shim keeps
// the task and, once it exits, its exit status, and the restarted daemon
// finds them again, so the outcome is not lost. It returns the status
// channel to wait on after a kill, nil when none is pending.
func (a *oneShotRun) rewait(ctx context.Context, statusC <-chan client.ExitStatus, timeout <-chan time.Time) (client.ExitStatus, ending, <-chan client.ExitStatus, error) {
	status, ended := awaitExit(ctx, statusC, timeout)
	for lost := time.Now(); ended == endExited && daemonLost(status.Error()); {
		statusC = nil // it delivered the lost wait's status
		if time.Since(lost) > rewaitLimit {
			break
		}
		select {
		case <-time.After(rewaitInterval):
		case <-timeout:
			return status, endTimedOut, nil, nil
		case <-ctx.Done():
			return status, endCancelled, nil, nil
		}
		sc, err := a.task.Wait(a.waitCtx)
		if err != nil {
			if !daemonLost(err) {
				return status, ended, nil, a.unknown(fmt.Errorf("wait task %s again after containerd came back: %w", a.id, err))
			}
			continue
		}
		statusC = sc
		status, ended = awaitExit(ctx, statusC, timeout)
	}
	return status, ended, statusC, nil
}

// exitedStatus returns the exit status containerd holds for the attempt's
// task when it has stopped; ok is false while it runs or when containerd
// cannot tell.
func (a *oneShotRun) exitedStatus(ctx context.Context) (_ client.ExitStatus, ok bool) {
	dctx, cancel := a.r.detached(ctx)
	defer cancel()
	st, err := a.task.Status(dctx)
	if err != nil || st.Status != client.Stopped {
		return client.ExitStatus{}, false
	}
	return *client.NewExitStatus(st.ExitStatus, st.ExitTime, nil), true
}

// end runs when the attempt returns, with its error: it deletes the task
// (draining its output), flushes partial lines, deletes the container and
// its snapshot; never with ctx, which may be cancelled. Delete cancels the
// task's IO, closing the pipes with whatever a slow output destination
// has not taken yet: the copy finishes first. The container's processes
// are gone with its init, so the pipes reach EOF.
func (a *oneShotRun) end(ctx context.Context, runErr error) {
	if a.relabelled != nil {
		<-a.relabelled
	}
	if a.cancelWait != nil {
		a.cancelWait()
	}
	r, task := a.r, a.task
	// finishOutput flushes partial lines once the output is complete.
	finishOutput := func() {
		a.stdout.Close()
		a.stderr.Close()
		if ee, ok := errors.AsType[*runtime.ExitError](runErr); ok {
			ee.Stderr = a.stderr.LastLine()
		}
	}
	if task != nil && a.exited && drainOutput(task, outputDrainTimeout) {
		// The usual end: the rest is removal, which no one waits for
		// (docs/runtimes.md "One-shot containers"); it untracks the id.
		finishOutput()
		r.removeLater(ctx, a.req, a.id, a.cont, task)
		return
	}
	if task == nil && ctx.Err() != nil {
		// NewTask was cancelled, possibly after the shim created the task.
		finishOutput()
		r.removeCancelled(ctx, a.req, a.id)
		return
	}
	defer r.track(a.id, false)
	dctx, cancel := r.detached(ctx)
	defer cancel()
	var errs []error
	if task != nil {
		var delOpts []client.ProcessDeleteOpts
		if !a.exited {
			delOpts = append(delOpts, client.WithProcessKill)
		}
		if err := deleteTask(dctx, a.cont, task, delOpts...); err != nil {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
	}
	// Output is complete now: the task's deletion ended the copy.
	finishOutput()
	if task == nil {
		// NewTask failed, possibly after the shim created the task (ctx
		// cancelled mid-call): remove whatever task exists as well.
		if err := r.remove(ctx, a.id); err != nil {
			errs = append(errs, err)
		}
	} else if err := a.cont.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container: %w", err))
	}
	r.cleanup(ctx, a.req, a.id, errors.Join(errs...))
}

// awaitExit waits for the exit status on statusC, the rule's timeout or
// ctx. An exit already reported when the timeout or ctx is seen wins: a
// worker stopped (SIGSTOP, a stalled VM) past the timeout may find both
// ready when it resumes. When it does not, the caller asks containerd
// (oneShotRun.await).
func awaitExit(ctx context.Context, statusC <-chan client.ExitStatus, timeout <-chan time.Time) (client.ExitStatus, ending) {
	var status client.ExitStatus
	ended := endExited
	select {
	case status = <-statusC:
		return status, endExited
	case <-timeout:
		ended = endTimedOut
	case <-ctx.Done():
		ended = endCancelled
	}
	select {
	case status = <-statusC:
		return status, endExited
	default:
		return status, ended
	}
}

// resolve returns the image reference and command line for spec; argv is
// nil when the image's entrypoint runs. For a language runtime, boot is its
// bootstrap, which run mounts and whose command replaces argv.
func (r *Runner) resolve(spec runtime.Spec) (ref string, argv []string, boot *runtime.Bootstrap, err error) {
	ref = spec.Image
	if spec.Runtime == "" {
		if ref == "" {
			return "", nil, nil, fmt.Errorf("no image in template.yaml: %w", runtime.ErrUnavailable)
		}
		return ref, spec.Command, nil, nil
	}
	b, err := runtime.LookupBootstrap(spec.Runtime)
	if err != nil {
		return "", nil, nil, err
	}
	if ref == "" {
		ref = r.defaultImages[spec.Runtime]
	}
	if ref == "" {
		return "", nil, nil, fmt.Errorf("no image for runtime %q: set image in template.yaml or configure a default image: %w", spec.Runtime, runtime.ErrUnavailable)
	}
	return ref, nil, &b, nil
}

// rewaitInterval paces the new waits for a task's exit while containerd
// is unavailable, and rewaitLimit bounds them: a daemon away for longer
// leaves the outcome unknown.
const (
	rewaitInterval = 250 * time.Millisecond
	rewaitLimit    = 2 * time.Minute
)

// daemonLost reports an error of a call that lost its connection to
// containerd, which comes as a gRPC status from a wait under way.
func daemonLost(err error) bool {
	return err != nil && (errdefs.IsUnavailable(err) || errdefs.IsUnavailable(errgrpc.ToNative(err)))
}

// killWait bounds the wait for a killed task's exit status.
const killWait = 10 * time.Second

// kill sends SIGKILL to every process of task and waits for its exit.
func (r *Runner) kill(ctx context.Context, task client.Task, statusC <-chan client.ExitStatus) (client.ExitStatus, error) {
	dctx, cancel := r.detached(ctx)
	defer cancel()
	if err := task.Kill(dctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
		return client.ExitStatus{}, err
	}
	select {
	case st := <-statusC:
		return st, nil
	case <-time.After(killWait):
		return client.ExitStatus{}, fmt.Errorf("no exit %v after SIGKILL", killWait)
	}
}

// detached returns a context that survives ctx's cancellation, bounded by
// the cleanup timeout.
func (r *Runner) detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), r.cleanupTimeout)
}

func (r *Runner) track(id string, live bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if live {
		r.live[id] = struct{}{}
	} else {
		delete(r.live, id)
	}
}

func (r *Runner) isLive(id string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, ok := r.live[id]
	return ok
}

// cleanup logs a failed removal: it does not change the attempt's outcome,
// and Sweep removes the leftover at the next start. A prepared container
// that served no attempt has no handler, and its log line none either.
func (r *Runner) cleanup(ctx context.Context, req runtime.Request, id string, err error) {
	if err == nil {
		return
	}
	attrs := []slog.Attr{slog.String("app", req.App)}
	if req.Handler != "" {
		attrs = append(attrs, slog.String("handler", req.Handler))
	}
	attrs = append(attrs, slog.String("container_id", id), slog.Any("error", err))
	r.logger.LogAttrs(ctx, slog.LevelError, "container cleanup failed", attrs...)
}

// classify marks errors that mean containerd cannot be reached.
func classify(err error) error {
	if errdefs.IsUnavailable(err) {
		return fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
	}
	return err
}

// execError recognises runc's report that the handler's command cannot be
// executed and turns it into the exit code a shell would give: a broken
// command is the app's fault, which should use up attempts and reach the
// DLQ rather than stay pending forever. runc reports it only as text.
func execError(err error) *runtime.ExitError {
	msg := err.Error()
	if !strings.Contains(msg, "exec:") && !strings.Contains(msg, "exec ") {
		return nil
	}
	switch {
	case strings.Contains(msg, "no such file or directory"), strings.Contains(msg, "executable file not found"):
		return &runtime.ExitError{Code: 127, Err: err}
	case strings.Contains(msg, "permission denied"):
		return &runtime.ExitError{Code: 126, Err: err}
	}
	return nil
}

// outputDrainTimeout bounds the wait for a finished handler's output to
// reach its destination before the task is deleted.
const outputDrainTimeout = 10 * time.Second

// waitUntil calls wait (a WaitGroup's Wait) and reports whether it
// returned before ctx ended; when ctx ends first, wait goes on alone.
func waitUntil(ctx context.Context, wait func()) bool {
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

// drainOutput waits until task's output copy has finished, or d passed,
// and reports whether it finished.
func drainOutput(task client.Task, d time.Duration) bool {
	io := task.IO()
	if io == nil {
		return true
	}
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return waitUntil(ctx, io.Wait)
}
