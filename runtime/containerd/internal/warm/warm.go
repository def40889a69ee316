// Package warm runs the attempts of apps with `warm: true` in long-lived
// containers of the one-shot sandbox, one invocation at a time each
// (docs/runtimes.md "Warm containers").
package warm

import (
	"context"
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
	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/secrets"
)

// Warm containers (template.yaml `warm: true`, docs/runtimes.md "Warm
// containers"): instead of one container per attempt, each app with a
// language runtime keeps long-lived containers running the bootstrap in its
// warm mode, which serves one invocation at a time over the protocol of
// frame.go. The sandbox is the one of one-shot containers (core.SpecOpts).
//
// A container is taken from its app's pool for one invocation and given
// back afterwards, once the bootstrap killed the processes the invocation
// left (its outcome frame says "clean"). It is discarded instead, and a
// later Run starts a new one, when the invocation timed out or was
// cancelled (the container is killed), when the bootstrap died (a crash, an
// OOM kill, or the handler core.Ending the process), when it could not confirm
// that no process of the invocation is left, after WithWarmMaxInvocations
// invocations, after
// WithWarmIdleTimeout unused, and when the app's Spec changed (the pool is
// keyed by a hash of the Spec and the resolved image reference). Close
// removes them all; they carry the relay.host label, and the Pool marks
// them live, so Sweep spares them while this Runner runs and removes them
// after a crash.

// LabelWarm is "true" on warm containers, which serve many invocations
// (their relay.handler label is empty).
const LabelWarm = "relay.warm"

// warmOutputWait bounds the wait for the stderr marker once the stdout frame
// arrived; both are written back to back, so missing it means the container
// misbehaves, and it is discarded.
const warmOutputWait = 5 * time.Second

// warmIdlePrefix is the handler part of the line prefix of output a warm
// container writes between invocations (a handler's background thread).
const warmIdlePrefix = "-"

// Config is what a Pool needs.
type Config struct {
	Host *core.Host
	// Resolve returns the image reference a Spec runs in; Prepare what
	// its containers need, pulling the image and building its
	// dependencies.
	Resolve        func(runtime.Spec) (ref string, err error)
	Prepare        func(context.Context, runtime.Spec) (core.Prepared, error)
	Secrets        *secrets.Stager
	Stdout, Stderr *runtime.Output
	// MaxInvocations (> 0) is how many invocations a container serves,
	// IdleTimeout how long it may wait for one, MaxContainers the cap of
	// one app's containers (0: none); the WithWarm options.
	MaxInvocations int
	IdleTimeout    time.Duration
	MaxContainers  int
}

// Pool holds the warm containers of a Runner and runs attempts in them.
// It is safe for concurrent use.
type Pool struct {
	host           *core.Host
	resolve        func(runtime.Spec) (string, error)
	prepare        func(context.Context, runtime.Spec) (core.Prepared, error)
	secrets        *secrets.Stager
	stdout, stderr *runtime.Output

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

// New returns the Pool of cfg; it starts no container before a Run.
func New(cfg Config) *Pool {
	return &Pool{host: cfg.Host, resolve: cfg.Resolve, prepare: cfg.Prepare, secrets: cfg.Secrets,
		stdout: cfg.Stdout, stderr: cfg.Stderr, maxInvocations: cfg.MaxInvocations, idleTimeout: cfg.IdleTimeout,
		maxContainers: cfg.MaxContainers, apps: map[string]*warmApp{}, all: map[*warmContainer]struct{}{}}
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

	secrets *secrets.Staged // the app's secrets, refreshed before each invocation

	uses      int         // under Pool.mu
	idleTimer *time.Timer // under Pool.mu

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

// Run runs one attempt in a warm container of req.App, starting one when
// none is idle; its outcomes are those of the Runner's Run (package
// runtime/containerd). A Spec without a language runtime, and a Run after
// Close, fail with an error wrapping runtime.ErrUnavailable.
func (p *Pool) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if req.Spec.Runtime == "" {
		return runtime.Result{}, fmt.Errorf("warm containers need a language runtime (runtime: python3 or node); remove warm from the app or set runtime: %w", runtime.ErrUnavailable)
	}
	ref, err := p.resolve(req.Spec)
	if err != nil {
		return runtime.Result{}, err
	}
	w, err := p.acquire(ctx, req, core.SpecKey(req.Spec, ref))
	if err != nil {
		return runtime.Result{}, err
	}
	res, keep, err := p.invoke(ctx, w, req)
	p.release(w, keep)
	return res, err
}

// acquire takes an idle container of the app's current pool, or starts one.
// It counts the caller in busy until release.
func (p *Pool) acquire(ctx context.Context, req runtime.Request, key string) (*warmContainer, error) {
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
				p.host.Logger.LogAttrs(ctx, slog.LevelInfo, "app changed: replacing its warm containers", slog.String("app", req.App))
				for _, w := range a.idle {
					w.idleTimer.Stop()
					p.discardLater(w)
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
				p.discardLater(w)
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
			w, err := p.startWarm(ctx, req, a)
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
func (p *Pool) release(w *warmContainer, keep bool) {
	p.mu.Lock()
	defer p.busy.Done() // after discardLater counted in bg, for Close
	defer p.mu.Unlock()
	w.uses++
	a := w.pool
	if !keep || p.closed || p.apps[w.app] != a || w.uses >= p.maxInvocations || w.hasExited() {
		a.count--
		a.signal()
		p.discardLater(w)
		return
	}
	a.idle = append(a.idle, w)
	w.idleTimer = time.AfterFunc(p.idleTimeout, func() { p.reap(w) })
	a.signal()
}

// reap removes w if it is idle: its idle timeout expired or its task exited.
func (p *Pool) reap(w *warmContainer) {
	p.mu.Lock()
	defer p.mu.Unlock()
	a := w.pool
	for i, x := range a.idle {
		if x == w {
			a.idle = append(a.idle[:i], a.idle[i+1:]...)
			a.count--
			a.signal()
			p.discardLater(w)
			return
		}
	}
}

// discardLater discards w in the background; Close waits for it.
// Called with Pool.mu held.
func (p *Pool) discardLater(w *warmContainer) {
	p.bg.Add(1)
	go func() {
		defer p.bg.Done()
		p.discard(w)
	}()
}

// startWarm creates and starts a warm container for req's app.
func (p *Pool) startWarm(ctx context.Context, req runtime.Request, a *warmApp) (*warmContainer, error) {
	prep, err := p.prepare(ctx, req.Spec)
	if err != nil {
		return nil, err
	}
	staged, err := p.secrets.Stage(req.Spec.Secrets)
	if err != nil {
		return nil, err
	}
	id, cont, err := p.createWarm(ctx, req, prep, staged)
	if err != nil {
		staged.Remove()
		return nil, err
	}
	idlePrefix := runtime.Prefix(req.App, warmIdlePrefix)
	w := &warmContainer{
		id: id, app: req.App, pool: a, cont: cont, secrets: staged,
		idleOut: p.stdout.LineWriter(idlePrefix),
		idleErr: p.stderr.LineWriter(idlePrefix),
		exited:  make(chan struct{}),
	}
	w.stdout, w.stderr = newDemux(w.idleOut), newDemux(w.idleErr)
	statusC, err := p.startWarmTask(ctx, w)
	if err != nil {
		p.discard(w)
		return nil, err
	}
	w.started = true
	p.mu.Lock()
	p.all[w] = struct{}{}
	p.mu.Unlock()
	go func() {
		w.status = <-statusC
		close(w.exited)
		p.reap(w) // if idle; a busy container's Run sees the exit itself
	}()
	return w, nil
}

// createWarm creates a warm container for req's app, tracked live, and
// returns its id. On error nothing is left and the id is not tracked.
func (p *Pool) createWarm(ctx context.Context, req runtime.Request, prep core.Prepared, staged *secrets.Staged) (string, client.Container, error) {
	mounts := prep.Mounts
	if staged != nil {
		mounts = append(append([]specs.Mount(nil), mounts...), staged.Mount())
	}
	id := core.ContainerID(req.App, "warm")
	p.host.Track(id, true)
	labels := map[string]string{core.LabelHost: p.host.HostID, core.LabelOwner: p.host.Owner, core.LabelApp: req.App, LabelWarm: "true"}
	// The container's environment is the app's, without the variables of
	// any one request: the bootstrap resets to it before each invocation.
	base := runtime.Request{App: req.App, Spec: req.Spec}
	argv := append(append([]string(nil), prep.Argv...), "--warm")
	cont, err := p.host.Client.NewContainer(ctx, id,
		client.WithImage(prep.Img),
		client.WithSnapshotter(p.host.Snapshotter),
		client.WithNewSnapshot(id, prep.Img, snapshots.WithLabels(labels)),
		client.WithContainerLabels(labels),
		client.WithNewSpec(append(core.SpecOpts(base, prep.ImgSpec, prep.AppDir, argv, mounts), prep.SpecOpts...)...),
	)
	if err != nil {
		// NewContainer may have prepared the snapshot before failing.
		if rerr := p.host.Remove(ctx, id); rerr != nil {
			p.logWarmCleanup(ctx, req.App, id, rerr)
		}
		p.host.Track(id, false)
		return "", nil, core.Classify(fmt.Errorf("create container %s: %w", id, err))
	}
	return id, cont, nil
}

// startWarmTask creates and starts w's task, its stdin a pipe whose
// writing end is w.stdin, and returns where its exit status arrives.
func (p *Pool) startWarmTask(ctx context.Context, w *warmContainer) (<-chan client.ExitStatus, error) {
	stdin, stdinW := io.Pipe()
	w.stdin = stdinW
	var err error
	w.task, err = w.cont.NewTask(ctx, cio.NewCreator(cio.WithStreams(stdin, w.stdout, w.stderr)))
	if err != nil {
		if ee := core.ExecError(err); ee != nil {
			return nil, ee
		}
		return nil, core.Classify(fmt.Errorf("create task %s: %w", w.id, err))
	}
	// The wait lasts as long as the container, not as the Run starting it.
	waitCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	w.cancelWait = cancel
	statusC, err := w.task.Wait(waitCtx)
	if err != nil {
		return nil, core.Classify(fmt.Errorf("wait task %s: %w", w.id, err))
	}
	if err := w.task.Start(ctx); err != nil {
		if ee := core.ExecError(err); ee != nil {
			return nil, ee
		}
		return nil, core.Classify(fmt.Errorf("start task %s: %w", w.id, err))
	}
	return statusC, nil
}

// invoke runs req in w. keep is false when w must not serve again.
func (p *Pool) invoke(ctx context.Context, w *warmContainer, req runtime.Request) (_ runtime.Result, keep bool, _ error) {
	if w.secrets != nil {
		// Read now: a rotated secret is used from this invocation on.
		if err := p.secrets.Refresh(w.secrets, req.Spec.Secrets); err != nil {
			return runtime.Result{}, true, err
		}
	}
	c, err := p.sendWarm(w, req)
	if err != nil {
		return runtime.Result{}, true, err
	}
	payload, ended := awaitWarm(ctx, w, c, req.Timeout)
	switch {
	case ended == core.EndTimedOut:
		p.discard(w)
		c.finish(w)
		res := runtime.Result{Duration: time.Since(c.start)}
		if !w.hasExited() {
			return res, false, core.OutcomeUnknown(fmt.Errorf("kill task %s: no exit %v after SIGKILL", w.id, core.KillWait))
		}
		return res, false, &runtime.ExitError{Code: int(w.status.ExitCode()), TimedOut: true, Timeout: req.Timeout, Stderr: c.stderr.LastLine()}
	case ended == core.EndCancelled:
		p.discard(w)
		c.finish(w)
		return runtime.Result{Duration: time.Since(c.start)}, false, ctx.Err()
	case payload == nil:
		res, err := p.warmExited(ctx, w, req, c)
		return res, false, err
	}
	return p.warmOutcome(ctx, w, req, c, payload)
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
// bootstrap (nil frame, core.EndExited), the timeout or ctx. A handler that
// ended by itself before the timeout, seen late because this worker was
// stopped, ends by itself (docs/runtimes.md "Exit codes").
func awaitWarm(ctx context.Context, w *warmContainer, c *warmCall, timeout time.Duration) ([]byte, core.Ending) {
	var timer <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}
	ended := core.EndTimedOut
	select {
	case payload := <-c.frameC:
		return payload, core.EndExited
	case <-w.exited:
		return nil, core.EndExited
	case <-timer:
	case <-ctx.Done():
		ended = core.EndCancelled
	}
	if timeout == 0 || time.Since(c.start.Add(timeout)) < warmLate {
		return nil, ended
	}
	select {
	case payload := <-c.frameC:
		return payload, core.EndExited
	case <-w.exited:
		return nil, core.EndExited
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

// sendWarm routes w's output to req's writers and sends req to w.
func (p *Pool) sendWarm(w *warmContainer, req runtime.Request) (*warmCall, error) {
	prefix := runtime.Prefix(req.App, req.Handler)
	c := &warmCall{stdout: p.stdout.LineWriter(prefix), stderr: p.stderr.LineWriter(prefix)}
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
// mid-invocation: a crash, an OOM kill, or the handler core.Ending the
// process. Its exit code is the outcome, as for a one-shot container; the
// output is complete once the task is gone.
func (p *Pool) warmExited(ctx context.Context, w *warmContainer, req runtime.Request, c *warmCall) (runtime.Result, error) {
	res := runtime.Result{Duration: time.Since(c.start)}
	code, _, err := w.status.Result()
	var ee *runtime.ExitError
	if err == nil && code != 0 {
		// Before discard deletes the task, whose cgroup counts the OOM
		// kills. The bootstrap is the container's init, which nothing
		// inside can SIGKILL: a 137 with an OOM kill counted is the
		// kernel's doing.
		ee = p.host.ExitError(ctx, req, w.id, w.task, int(code), 0)
	}
	p.discard(w)
	c.finish(w)
	switch {
	case err != nil:
		return res, core.OutcomeUnknown(fmt.Errorf("wait task %s: %w", w.id, err))
	case ee != nil:
		ee.Stderr = c.stderr.LastLine()
		return res, ee
	}
	return res, nil
}

// warmOutcome is the outcome of an invocation whose outcome frame,
// payload, arrived; keep says whether w may serve again.
func (p *Pool) warmOutcome(ctx context.Context, w *warmContainer, req runtime.Request, c *warmCall, payload []byte) (_ runtime.Result, keep bool, _ error) {
	res := runtime.Result{Duration: time.Since(c.start)}
	keep = true
	select {
	case <-c.markC:
	case <-w.exited:
		keep = false
	case <-time.After(warmOutputWait):
		p.host.Logger.LogAttrs(ctx, slog.LevelWarn, "warm container sent no stderr marker; discarding it",
			slog.String("app", req.App), slog.String("container_id", w.id))
		keep = false
	}
	c.finish(w)
	code, clean, err := parseOutcome(payload)
	if err != nil {
		return res, false, core.OutcomeUnknown(fmt.Errorf("container %s: %w", w.id, err))
	}
	if !clean && keep {
		// Processes the invocation started may still run, or linger as
		// zombies: the next invocation must not inherit them.
		p.host.Logger.LogAttrs(ctx, slog.LevelInfo, "replacing a warm container: the processes its invocation left could not all be removed",
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
func (p *Pool) discard(w *warmContainer) {
	w.discardOnce.Do(func() {
		ctx, cancel := p.host.Detached(p.host.Background())
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
				case <-time.After(core.KillWait):
				}
			}
			var delOpts []client.ProcessDeleteOpts
			if !exited {
				delOpts = append(delOpts, client.WithProcessKill)
			}
			// Deleting the task waits for its output to be copied.
			if err := core.DeleteTask(ctx, w.cont, w.task, delOpts...); err != nil {
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
			if err := p.host.Remove(ctx, w.id); err != nil {
				errs = append(errs, err)
			}
		} else if err := w.cont.Delete(ctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete container: %w", err))
		}
		p.host.Track(w.id, false)
		w.secrets.Remove()
		p.mu.Lock()
		delete(p.all, w)
		p.mu.Unlock()
		if err := errors.Join(errs...); err != nil {
			// Someone else (a Sweep of another process with our host id)
			// may have removed it already: then nothing is left over.
			if _, lerr := p.host.Client.LoadContainer(ctx, w.id); !errdefs.IsNotFound(lerr) {
				p.logWarmCleanup(ctx, w.app, w.id, err)
			}
		}
	})
}

// logWarmCleanup logs a failed removal; Sweep removes the leftover later.
func (p *Pool) logWarmCleanup(ctx context.Context, app, id string, err error) {
	p.host.Logger.LogAttrs(ctx, slog.LevelError, "warm container cleanup failed",
		slog.String("app", app), slog.String("container_id", id), slog.Any("error", err))
}

// Close removes the warm containers: idle ones at once, busy ones when
// their invocation ends, or at once (killed) when ctx is done first, and
// waits for the removals. Runs after Close fail with an error wrapping
// runtime.ErrUnavailable. It returns ctx.Err() when it had to kill busy
// containers, nil otherwise.
func (p *Pool) Close(ctx context.Context) error {
	p.mu.Lock()
	p.closed = true
	for _, a := range p.apps {
		for _, w := range a.idle {
			w.idleTimer.Stop()
			p.discardLater(w)
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
			p.discardLater(w)
		}
		p.mu.Unlock()
		<-idle // the Runs see their containers die and return
	}
	p.bg.Wait()
	return err
}
