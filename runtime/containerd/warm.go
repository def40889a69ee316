package containerd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
)

// Warm containers (template.yaml `warm: true`, docs/runtimes.md "Warm
// containers"): instead of one container per attempt, each app with a
// language runtime keeps long-lived containers running the bootstrap in its
// warm mode, which serves one invocation at a time over the protocol of
// warm_frame.go. The sandbox is the one of one-shot containers (specOpts).
//
// A container is taken from its app's pool for one invocation and given
// back afterwards, once the bootstrap killed the processes the invocation
// left (its outcome frame says "clean"). It is discarded instead, and a
// later Run starts a new one, when the invocation timed out or was
// cancelled (the container is killed), when the bootstrap died (a crash, an
// OOM kill, or the handler ending the process), when it could not confirm
// that no process of the invocation is left, after WithWarmMaxInvocations
// invocations, after
// WithWarmIdleTimeout unused, and when the app's Spec changed (the pool is
// keyed by a hash of the Spec and the resolved image reference). Close
// removes them all; they carry the relay.host label, and the Runner marks
// them live, so Sweep spares them while this Runner runs and removes them
// after a crash.

// warmOutputWait bounds the wait for the stderr marker once the stdout frame
// arrived; both are written back to back, so missing it means the container
// misbehaves, and it is discarded.
const warmOutputWait = 5 * time.Second

// warmIdlePrefix is the handler part of the line prefix of output a warm
// container writes between invocations (a handler's background thread).
const warmIdlePrefix = "-"

// warmPools holds the warm containers of a Runner.
type warmPools struct {
	maxInvocations int
	idleTimeout    time.Duration
	maxContainers  int // per app; 0: no cap

	mu     sync.Mutex
	closed bool
	apps   map[string]*warmApp         // by app name: the current pool
	all    map[*warmContainer]struct{} // not yet discarded
	busy   sync.WaitGroup              // Runs holding or starting a container
	bg     sync.WaitGroup              // discards in the background
}

// warmApp is the pool of one app for one Spec.
type warmApp struct {
	key   string
	idle  []*warmContainer // most recently used last
	count int              // containers of this pool, busy or idle
	freed chan struct{}    // closed when a container is released or removed
}

func (a *warmApp) signal() {
	close(a.freed)
	a.freed = make(chan struct{})
}

// warmContainer is one long-lived container and its task.
type warmContainer struct {
	id, app string
	pool    *warmApp
	cont    client.Container
	task    client.Task
	stdin   *io.PipeWriter
	stdout  *demux
	stderr  *demux
	idleOut *runtime.LineWriter
	idleErr *runtime.LineWriter

	started    bool
	exited     chan struct{} // closed when the task exited; status is then set
	status     client.ExitStatus
	cancelWait context.CancelFunc

	secrets *stagedSecrets // the app's secrets, refreshed before each invocation

	uses      int         // under warmPools.mu
	idleTimer *time.Timer // under warmPools.mu

	discardOnce sync.Once
}

func (w *warmContainer) hasExited() bool {
	select {
	case <-w.exited:
		return true
	default:
		return false
	}
}

// warmKey identifies the containers that can serve spec: equal keys mean
// equal image, command, mounts, environment and limits.
func warmKey(spec runtime.Spec, ref string) string {
	b, _ := json.Marshal(struct {
		Spec runtime.Spec
		Ref  string
	}{spec, ref}) // maps marshal in key order: the key is deterministic
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}

// runWarm runs one attempt in a warm container of req.App, starting one when
// none is idle. Outcomes are those of run; see Run.
func (r *Runner) runWarm(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if req.Spec.Runtime == "" {
		return runtime.Result{}, fmt.Errorf("warm containers need a language runtime (runtime: python3 or node); remove warm from the app or set runtime: %w", runtime.ErrUnavailable)
	}
	ref, _, _, err := r.resolve(req.Spec)
	if err != nil {
		return runtime.Result{}, err
	}
	w, err := r.acquire(ctx, req, warmKey(req.Spec, ref))
	if err != nil {
		return runtime.Result{}, err
	}
	res, keep, err := r.invoke(ctx, w, req)
	r.release(w, keep)
	return res, err
}

// acquire takes an idle container of the app's current pool, or starts one.
// It counts the caller in busy until release.
func (r *Runner) acquire(ctx context.Context, req runtime.Request, key string) (*warmContainer, error) {
	p := &r.warm
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("the runner is closed: %w", runtime.ErrUnavailable)
		}
		a := p.apps[req.App]
		if a == nil || a.key != key {
			if a != nil {
				// The app changed: its idle containers go now, its busy
				// ones when their invocation ends (release).
				r.logger.LogAttrs(ctx, slog.LevelInfo, "app changed: replacing its warm containers", slog.String("app", req.App))
				for _, w := range a.idle {
					w.idleTimer.Stop()
					r.discardLater(w)
				}
				a.idle = nil
				a.signal()
			}
			a = &warmApp{key: key, freed: make(chan struct{})}
			p.apps[req.App] = a
		}
		for len(a.idle) > 0 {
			w := a.idle[len(a.idle)-1]
			a.idle = a.idle[:len(a.idle)-1]
			w.idleTimer.Stop()
			if w.hasExited() {
				a.count--
				r.discardLater(w)
				continue
			}
			p.busy.Add(1)
			p.mu.Unlock()
			return w, nil
		}
		if p.maxContainers == 0 || a.count < p.maxContainers {
			a.count++
			p.busy.Add(1)
			p.mu.Unlock()
			w, err := r.startWarm(ctx, req, a)
			if err != nil {
				p.mu.Lock()
				a.count--
				a.signal()
				p.mu.Unlock()
				p.busy.Done()
				return nil, err
			}
			return w, nil
		}
		freed := a.freed
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// release gives w back to its pool after an invocation, or discards it when
// keep is false, the pool is no longer current, w has served its quota or
// the Runner is closed.
func (r *Runner) release(w *warmContainer, keep bool) {
	p := &r.warm
	p.mu.Lock()
	defer p.busy.Done() // after discardLater counted in bg, for Close
	defer p.mu.Unlock()
	w.uses++
	a := w.pool
	if !keep || p.closed || p.apps[w.app] != a || w.uses >= p.maxInvocations || w.hasExited() {
		a.count--
		a.signal()
		r.discardLater(w)
		return
	}
	a.idle = append(a.idle, w)
	w.idleTimer = time.AfterFunc(p.idleTimeout, func() { r.reap(w) })
	a.signal()
}

// reap removes w if it is idle: its idle timeout expired or its task exited.
func (r *Runner) reap(w *warmContainer) {
	p := &r.warm
	p.mu.Lock()
	defer p.mu.Unlock()
	a := w.pool
	for i, x := range a.idle {
		if x == w {
			a.idle = append(a.idle[:i], a.idle[i+1:]...)
			a.count--
			a.signal()
			r.discardLater(w)
			return
		}
	}
}

// discardLater discards w in the background; Close waits for it.
// Called with warmPools.mu held.
func (r *Runner) discardLater(w *warmContainer) {
	r.warm.bg.Add(1)
	go func() {
		defer r.warm.bg.Done()
		r.discard(w)
	}()
}

// startWarm creates and starts a warm container for req's app.
func (r *Runner) startWarm(ctx context.Context, req runtime.Request, a *warmApp) (*warmContainer, error) {
	p, err := r.prepare(ctx, req.Spec)
	if err != nil {
		return nil, err
	}
	secrets, err := r.stageSecrets(req.Spec.Secrets)
	if err != nil {
		return nil, err
	}
	id, cont, err := r.createWarm(ctx, req, p, secrets)
	if err != nil {
		secrets.remove()
		return nil, err
	}
	idlePrefix := runtime.Prefix(req.App, warmIdlePrefix)
	w := &warmContainer{
		id: id, app: req.App, pool: a, cont: cont, secrets: secrets,
		idleOut: r.stdout.LineWriter(idlePrefix),
		idleErr: r.stderr.LineWriter(idlePrefix),
		exited:  make(chan struct{}),
	}
	w.stdout, w.stderr = newDemux(w.idleOut), newDemux(w.idleErr)
	statusC, err := r.startWarmTask(ctx, w)
	if err != nil {
		r.discard(w)
		return nil, err
	}
	w.started = true
	r.warm.mu.Lock()
	r.warm.all[w] = struct{}{}
	r.warm.mu.Unlock()
	go func() {
		w.status = <-statusC
		close(w.exited)
		r.reap(w) // if idle; a busy container's Run sees the exit itself
	}()
	return w, nil
}

// createWarm creates a warm container for req's app, tracked live, and
// returns its id. On error nothing is left and the id is not tracked.
func (r *Runner) createWarm(ctx context.Context, req runtime.Request, p prepared, secrets *stagedSecrets) (string, client.Container, error) {
	mounts := p.mounts
	if secrets != nil {
		mounts = append(append([]specs.Mount(nil), mounts...), secrets.mount())
	}
	id := containerID(req.App, "warm")
	r.track(id, true)
	labels := map[string]string{LabelHost: r.hostID, LabelOwner: r.presence.owner, LabelApp: req.App, LabelWarm: "true"}
	// The container's environment is the app's, without the variables of
	// any one request: the bootstrap resets to it before each invocation.
	base := runtime.Request{App: req.App, Spec: req.Spec}
	argv := append(append([]string(nil), p.argv...), "--warm")
	cont, err := r.client.NewContainer(ctx, id,
		client.WithImage(p.img),
		client.WithSnapshotter(r.snapshotter),
		client.WithNewSnapshot(id, p.img, snapshots.WithLabels(labels)),
		client.WithContainerLabels(labels),
		client.WithNewSpec(append(specOpts(base, p.imgSpec, p.appDir, argv, mounts), p.specOpts...)...),
	)
	if err != nil {
		// NewContainer may have prepared the snapshot before failing.
		if rerr := r.remove(ctx, id); rerr != nil {
			r.logWarmCleanup(ctx, req.App, id, rerr)
		}
		r.track(id, false)
		return "", nil, classify(fmt.Errorf("create container %s: %w", id, err))
	}
	return id, cont, nil
}

// startWarmTask creates and starts w's task, its stdin a pipe whose
// writing end is w.stdin, and returns where its exit status arrives.
func (r *Runner) startWarmTask(ctx context.Context, w *warmContainer) (<-chan client.ExitStatus, error) {
	stdin, stdinW := io.Pipe()
	w.stdin = stdinW
	var err error
	w.task, err = w.cont.NewTask(ctx, cio.NewCreator(cio.WithStreams(stdin, w.stdout, w.stderr)))
	if err != nil {
		if ee := execError(err); ee != nil {
			return nil, ee
		}
		return nil, classify(fmt.Errorf("create task %s: %w", w.id, err))
	}
	// The wait lasts as long as the container, not as the Run starting it.
	waitCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancelWait = cancel
	statusC, err := w.task.Wait(waitCtx)
	if err != nil {
		return nil, classify(fmt.Errorf("wait task %s: %w", w.id, err))
	}
	if err := w.task.Start(ctx); err != nil {
		if ee := execError(err); ee != nil {
			return nil, ee
		}
		return nil, classify(fmt.Errorf("start task %s: %w", w.id, err))
	}
	return statusC, nil
}

// invoke runs req in w. keep is false when w must not serve again.
func (r *Runner) invoke(ctx context.Context, w *warmContainer, req runtime.Request) (_ runtime.Result, keep bool, _ error) {
	if w.secrets != nil {
		// Read now: a rotated secret is used from this invocation on.
		if err := r.refreshSecrets(w.secrets, req.Spec.Secrets); err != nil {
			return runtime.Result{}, true, err
		}
	}
	c, err := r.sendWarm(w, req)
	if err != nil {
		return runtime.Result{}, true, err
	}
	payload, ended := awaitWarm(ctx, w, c, req.Timeout)
	switch {
	case ended == endTimedOut:
		r.discard(w)
		c.finish(w)
		res := runtime.Result{Duration: time.Since(c.start)}
		if !w.hasExited() {
			return res, false, warmUnknown(fmt.Errorf("kill task %s: no exit %v after SIGKILL", w.id, killWait))
		}
		return res, false, &runtime.ExitError{Code: int(w.status.ExitCode()), TimedOut: true, Timeout: req.Timeout, Stderr: c.stderr.LastLine()}
	case ended == endCancelled:
		r.discard(w)
		c.finish(w)
		return runtime.Result{Duration: time.Since(c.start)}, false, ctx.Err()
	case payload == nil:
		res, err := r.warmExited(ctx, w, req, c)
		return res, false, err
	}
	return r.warmOutcome(ctx, w, req, c, payload)
}

// Past the deadline by more than warmLate, the timer says this worker was
// stopped (SIGSTOP, a frozen VM) rather than the handler slow: a reply
// written meanwhile may still be in the pipe, and gets warmLateGrace to be
// read.
const (
	warmLate      = 500 * time.Millisecond
	warmLateGrace = time.Second
)

// awaitWarm waits for call c's outcome frame (returned), the death of w's
// bootstrap (nil frame, endExited), the timeout or ctx. A handler that
// ended by itself before the timeout, seen late because this worker was
// stopped, ends by itself (docs/runtimes.md "Exit codes").
func awaitWarm(ctx context.Context, w *warmContainer, c *warmCall, timeout time.Duration) ([]byte, ending) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	ended := endTimedOut
	select {
	case payload := <-c.frameC:
		return payload, endExited
	case <-w.exited:
		return nil, endExited
	case <-timer:
	case <-ctx.Done():
		ended = endCancelled
	}
	if timeout == 0 || time.Since(c.start.Add(timeout)) < warmLate {
		return nil, ended
	}
	select {
	case payload := <-c.frameC:
		return payload, endExited
	case <-w.exited:
		return nil, endExited
	case <-time.After(warmLateGrace):
		return nil, ended
	}
}

// warmCall is an invocation sent to a warm container: the writers of its
// output, where its outcome frame and stderr marker arrive, and when it
// was sent.
type warmCall struct {
	stdout, stderr *runtime.LineWriter
	frameC, markC  <-chan []byte
	start          time.Time
}

// finish ends the call's output: what w writes next is no longer its.
func (c *warmCall) finish(w *warmContainer) {
	w.stdout.end()
	w.stderr.end()
	c.stdout.Close()
	c.stderr.Close()
}

// warmUnknown marks err as leaving the invocation's outcome unknown.
func warmUnknown(err error) error { return fmt.Errorf("%w: %w", runtime.ErrOutcomeUnknown, err) }

// sendWarm routes w's output to req's writers and sends req to w.
func (r *Runner) sendWarm(w *warmContainer, req runtime.Request) (*warmCall, error) {
	prefix := runtime.Prefix(req.App, req.Handler)
	c := &warmCall{stdout: r.stdout.LineWriter(prefix), stderr: r.stderr.LineWriter(prefix)}
	token := newToken()
	c.frameC = w.stdout.begin(token, c.stdout)
	c.markC = w.stderr.begin(token, c.stderr)
	env := runtime.Environ(req)
	envMap := make(map[string]string, len(env))
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		envMap[k] = v
	}
	line, err := json.Marshal(warmRequest{Token: token, Handler: req.Handler, Env: envMap, Event: string(req.Event)})
	if err != nil {
		c.finish(w)
		return nil, err
	}
	line = append(line, '\n')
	c.start = time.Now()
	// A pipe write blocks until containerd's copy reads it, which a dead
	// container never does: write aside, discard unblocks it.
	go w.stdin.Write(line)
	return c, nil
}

// warmExited is the outcome of an invocation whose bootstrap died
// mid-invocation: a crash, an OOM kill, or the handler ending the
// process. Its exit code is the outcome, as for a one-shot container; the
// output is complete once the task is gone.
func (r *Runner) warmExited(ctx context.Context, w *warmContainer, req runtime.Request, c *warmCall) (runtime.Result, error) {
	res := runtime.Result{Duration: time.Since(c.start)}
	code, _, err := w.status.Result()
	var ee *runtime.ExitError
	if err == nil && code != 0 {
		// Before discard deletes the task, whose cgroup counts the OOM
		// kills. The bootstrap is the container's init, which nothing
		// inside can SIGKILL: a 137 with an OOM kill counted is the
		// kernel's doing.
		ee = r.exitError(ctx, req, w.id, w.task, int(code), 0)
	}
	r.discard(w)
	c.finish(w)
	switch {
	case err != nil:
		return res, warmUnknown(fmt.Errorf("wait task %s: %w", w.id, err))
	case ee != nil:
		ee.Stderr = c.stderr.LastLine()
		return res, ee
	}
	return res, nil
}

// warmOutcome is the outcome of an invocation whose outcome frame,
// payload, arrived; keep says whether w may serve again.
func (r *Runner) warmOutcome(ctx context.Context, w *warmContainer, req runtime.Request, c *warmCall, payload []byte) (_ runtime.Result, keep bool, _ error) {
	res := runtime.Result{Duration: time.Since(c.start)}
	keep = true
	select {
	case <-c.markC:
	case <-w.exited:
		keep = false
	case <-time.After(warmOutputWait):
		r.logger.LogAttrs(ctx, slog.LevelWarn, "warm container sent no stderr marker; discarding it",
			slog.String("app", req.App), slog.String("container_id", w.id))
		keep = false
	}
	c.finish(w)
	code, clean, err := parseOutcome(payload)
	if err != nil {
		return res, false, warmUnknown(fmt.Errorf("container %s: %w", w.id, err))
	}
	if !clean && keep {
		// Processes the invocation started may still run, or linger as
		// zombies: the next invocation must not inherit them.
		r.logger.LogAttrs(ctx, slog.LevelInfo, "replacing a warm container: the processes its invocation left could not all be removed",
			slog.String("app", req.App), slog.String("handler", req.Handler), slog.String("container_id", w.id))
		keep = false
	}
	if code != 0 {
		return res, keep, &runtime.ExitError{Code: code, Stderr: c.stderr.LastLine()}
	}
	return res, keep, nil
}

// discard kills w's task if it still runs and removes the task, the
// container and its snapshot, detached from any caller's context. Only the
// first call acts; concurrent calls wait for it.
func (r *Runner) discard(w *warmContainer) {
	w.discardOnce.Do(func() {
		ctx, cancel := r.detached(namespaces.WithNamespace(context.Background(), r.namespace))
		defer cancel()
		var errs []error
		w.stdin.Close() // ends containerd's stdin copy and a blocked request write
		if w.task != nil {
			exited := false
			if w.started {
				if !w.hasExited() {
					if err := w.task.Kill(ctx, syscall.SIGKILL, client.WithKillAll); err != nil && !errdefs.IsNotFound(err) {
						errs = append(errs, fmt.Errorf("kill task: %w", err))
					}
				}
				select {
				case <-w.exited:
					exited = true
				case <-time.After(killWait):
				}
			}
			var delOpts []client.ProcessDeleteOpts
			if !exited {
				delOpts = append(delOpts, client.WithProcessKill)
			}
			// Deleting the task waits for its output to be copied.
			if err := deleteTask(ctx, w.cont, w.task, delOpts...); err != nil {
				errs = append(errs, fmt.Errorf("delete task: %w", err))
			}
		}
		if w.cancelWait != nil {
			w.cancelWait()
		}
		w.stdout.end()
		w.stderr.end()
		w.idleOut.Close()
		w.idleErr.Close()
		if w.task == nil {
			// NewTask failed, possibly after the shim created the task (ctx
			// cancelled mid-call): remove whatever task exists as well.
			if err := r.remove(ctx, w.id); err != nil {
				errs = append(errs, err)
			}
		} else if err := w.cont.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
		r.track(w.id, false)
		w.secrets.remove()
		r.warm.mu.Lock()
		delete(r.warm.all, w)
		r.warm.mu.Unlock()
		if err := errors.Join(errs...); err != nil {
			// Someone else (a Sweep of another process with our host id)
			// may have removed it already: then nothing is left over.
			if _, lerr := r.client.LoadContainer(ctx, w.id); !errdefs.IsNotFound(lerr) {
				r.logWarmCleanup(ctx, w.app, w.id, err)
			}
		}
	})
}

// logWarmCleanup logs a failed removal; Sweep removes the leftover later.
func (r *Runner) logWarmCleanup(ctx context.Context, app, id string, err error) {
	r.logger.LogAttrs(ctx, slog.LevelError, "warm container cleanup failed",
		slog.String("app", app), slog.String("container_id", id), slog.Any("error", err))
}

// Close removes the Runner's warm containers: idle ones at once, busy ones
// when their invocation ends, or at once (killed) when ctx is done first;
// it also waits, until ctx is done, for the stops of leftover shims still
// under way (docs/operations.md "containerd"), and ends the dependency
// builds still running, waiting for each to release its lease and remove
// its build container. Runs of warm apps fail after
// Close with an error wrapping runtime.ErrUnavailable; one-shot Runs are
// unaffected. Close returns ctx.Err() when it had to kill busy containers,
// nil otherwise; it is idempotent and does not close the containerd
// client. Close then stops refreshing the Runner's presence label and
// removes it (LabelPresencePrefix), so call it after the Runner's last Run
// and Sweep. A process that dies without Close leaves a label that goes
// stale, and other Runners' Sweep removes its containers after the orphan
// timeout.
func (r *Runner) Close(ctx context.Context) error {
	p := &r.warm
	p.mu.Lock()
	p.closed = true
	for _, a := range p.apps {
		for _, w := range a.idle {
			w.idleTimer.Stop()
			r.discardLater(w)
		}
		a.idle = nil
		a.signal()
	}
	clear(p.apps)
	p.mu.Unlock()

	idle := make(chan struct{})
	go func() {
		p.busy.Wait()
		close(idle)
	}()
	var err error
	select {
	case <-idle:
	case <-ctx.Done():
		err = ctx.Err()
		p.mu.Lock()
		for w := range p.all {
			r.discardLater(w)
		}
		p.mu.Unlock()
		<-idle // the Runs see their containers die and return
	}
	p.bg.Wait()
	if derr := r.closeDeps(ctx); derr != nil && err == nil {
		err = derr
	}
	r.closeOneShots(ctx)
	r.waitShimWork(ctx)
	r.fifos.closeAll()
	r.bootstraps.removePrivate()
	if werr := r.withdraw(ctx); werr != nil && err == nil {
		err = fmt.Errorf("containerd: remove presence label: %w", werr)
	}
	return err
}
