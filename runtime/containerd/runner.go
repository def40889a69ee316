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
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

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
		oneShot: oneShots{max: o.preparedContainers, idleTimeout: min(preparedIdleTimeout, o.warmIdleTimeout),
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
	removing := false // the background removal untracks id
	defer func() {
		if !removing {
			r.track(id, false)
		}
	}()

	prefix := runtime.Prefix(req.App, req.Handler)
	stdout, stderr := r.stdout.LineWriter(prefix), r.stderr.LineWriter(prefix)
	var task client.Task
	exited := false
	defer func() {
		// Always: delete the task (draining its output), flush partial
		// lines, delete the container and its snapshot; never with ctx,
		// which may be cancelled. Delete cancels the task's IO, closing
		// the pipes with whatever a slow output destination has not taken
		// yet: let the copy finish first. The container's processes are
		// gone with its init, so the pipes reach EOF.
		// finishOutput flushes partial lines once the output is complete.
		finishOutput := func() {
			stdout.Close()
			stderr.Close()
			if ee, ok := errors.AsType[*runtime.ExitError](runErr); ok {
				ee.Stderr = stderr.LastLine()
			}
		}
		if task != nil && exited && drainOutput(task, outputDrainTimeout) {
			// The usual end: the rest is removal, which no one waits for
			// (docs/runtimes.md "One-shot containers").
			finishOutput()
			removing = true
			r.removeLater(ctx, req, id, cont, task)
			return
		}
		dctx, cancel := r.detached(ctx)
		defer cancel()
		var errs []error
		if task != nil {
			var delOpts []client.ProcessDeleteOpts
			if !exited {
				delOpts = append(delOpts, client.WithProcessKill)
			}
			if err := deleteTask(dctx, cont, task, delOpts...); err != nil {
				errs = append(errs, fmt.Errorf("delete task: %w", err))
			}
		}
		// Output is complete now: the task's deletion ended the copy.
		finishOutput()
		if task == nil {
			// NewTask failed, possibly after the shim created the task (ctx
			// cancelled mid-call): remove whatever task exists as well.
			if err := r.remove(ctx, id); err != nil {
				errs = append(errs, err)
			}
		} else if err := cont.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
		r.cleanup(ctx, req, id, errors.Join(errs...))
	}()

	var env []string // the attempt's environment, for a task created ahead
	if pre == nil {
		ioCreator := cio.NewCreator(cio.WithStreams(bytes.NewReader(req.Event), stdout, stderr))
		task, err = r.newTask(ctx, cont, rootfs, ioCreator)
		if err != nil {
			if ee := execError(err); ee != nil {
				return runtime.Result{}, ee
			}
			return runtime.Result{}, classify(fmt.Errorf("create task %s: %w", id, err))
		}
	} else {
		task = pre.task
		if env, err = r.attemptEnv(ctx, id, req, p); err != nil {
			return runtime.Result{}, fmt.Errorf("environment of %s: %w", id, err)
		}
	}
	// Wait before Start so that the exit cannot be missed. Its context is
	// detached: after a timeout or cancellation we still wait for the exit
	// caused by the kill.
	waitCtx, cancelWait := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWait()
	statusC, err := task.Wait(waitCtx)
	if err != nil {
		return runtime.Result{}, classify(fmt.Errorf("wait task %s: %w", id, err))
	}
	// From Start on the handler may be running: if containerd loses track
	// of it now, its outcome is unknown, not "never ran".
	unknown := func(err error) error { return fmt.Errorf("%w: %w", runtime.ErrOutcomeUnknown, err) }
	if pre != nil {
		// Beside the start, and before Run returns: the container
		// is no longer a prepared one. Only its listing depends on it.
		relabelled := make(chan struct{})
		defer func() { <-relabelled }()
		go func() {
			defer close(relabelled)
			dctx, cancel := r.detached(ctx)
			defer cancel()
			if err := r.relabel(dctx, id, req); err != nil {
				r.logger.LogAttrs(dctx, slog.LevelWarn, "labelling a prepared container failed",
					slog.String("app", req.App), slog.String("container_id", id), slog.Any("error", err))
			}
		}()
	}
	start := task.Start
	if pre != nil {
		start = func(ctx context.Context) error { return pre.start(ctx, env, req.Event, stdout, stderr) }
	}
	if err := start(ctx); err != nil {
		if ee := execError(err); ee != nil {
			return runtime.Result{}, ee
		}
		if errdefs.IsUnavailable(err) {
			// The connection broke during Start: the process may have been
			// launched. Fail closed rather than run it again uncharged.
			return runtime.Result{}, unknown(fmt.Errorf("start task %s: %w", id, err))
		}
		return runtime.Result{}, classify(fmt.Errorf("start task %s: %w", id, err))
	}
	started := time.Now()
	// The shim holds stdin open until told otherwise: without this the
	// handler never sees EOF after the event (docs/apps.md "The handler
	// contract").
	var status client.ExitStatus
	var timedOut, cancelled bool
	if err := task.CloseIO(ctx, client.WithStdinCloser); err != nil {
		// Harmless if the handler already exited; anything else is not.
		select {
		case status = <-statusC:
			statusC = nil
		case <-time.After(time.Second):
			return runtime.Result{}, unknown(fmt.Errorf("close stdin of %s: %w", id, err))
		}
	}

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	wait := func() { status, timedOut, cancelled = awaitExit(ctx, statusC, timeout) }
	if statusC != nil {
		wait()
	}
	// containerd went away mid-wait (a restart): the shim keeps the task
	// and, once it exits, its exit status, and the restarted daemon finds
	// them again, so wait again rather than lose the outcome.
	for lost := time.Now(); !timedOut && !cancelled && daemonLost(status.Error()); {
		statusC = nil // it delivered the lost wait's status
		if time.Since(lost) > rewaitLimit {
			break
		}
		select {
		case <-time.After(rewaitInterval):
		case <-timeout:
			timedOut = true
			continue
		case <-ctx.Done():
			cancelled = true
			continue
		}
		sc, err := task.Wait(waitCtx)
		if err != nil {
			if !daemonLost(err) {
				return runtime.Result{}, unknown(fmt.Errorf("wait task %s again after containerd came back: %w", id, err))
			}
			continue
		}
		statusC = sc
		wait()
	}
	if statusC == nil && (timedOut || cancelled) {
		// Lost and not waited for again: the kill below waits for the exit
		// on statusC.
		if sc, err := task.Wait(waitCtx); err == nil {
			statusC = sc
		}
	}
	if timedOut || cancelled {
		if status, err = r.kill(ctx, task, statusC); err != nil {
			return runtime.Result{}, unknown(fmt.Errorf("kill task %s: %w", id, err))
		}
	}
	exited = true
	res := runtime.Result{Duration: time.Since(started)}
	code, _, err := status.Result()
	switch {
	case cancelled:
		return res, ctx.Err()
	case err != nil:
		return res, unknown(fmt.Errorf("wait task %s: %w", id, err))
	case timedOut:
		return res, &runtime.ExitError{Code: int(code), TimedOut: true, Timeout: req.Timeout}
	case code != 0:
		return res, r.exitError(ctx, req, id, task, int(code), 0)
	}
	return res, nil
}

// awaitExit waits for the exit status on statusC, the rule's timeout or
// ctx. An exit already reported when the timeout or ctx is seen wins: a
// worker stopped (SIGSTOP, a stalled VM) past the timeout finds both
// ready when it resumes, and a handler that exited by itself meanwhile
// was not stopped by the timeout, so its own exit is its outcome.
func awaitExit(ctx context.Context, statusC <-chan client.ExitStatus, timeout <-chan time.Time) (status client.ExitStatus, timedOut, cancelled bool) {
	select {
	case status = <-statusC:
		return status, false, false
	case <-timeout:
		timedOut = true
	case <-ctx.Done():
		cancelled = true
	}
	select {
	case status = <-statusC:
		return status, false, false
	default:
		return status, timedOut, cancelled
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
