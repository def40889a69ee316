package oneshot

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/exechelper"
)

// Run runs one attempt of req in a one-shot container, prepared or
// created for it, and waits for it; its outcomes are those of the
// Runner's Run (package runtime/containerd). The container, its task and
// snapshot are removed once the handler exited: in the background when it
// exited and its output is complete, which Close waits for, before Run
// returns otherwise.
func (r *Runner) Run(ctx context.Context, req runtime.Request) (_ runtime.Result, runErr error) {
	p, err := r.prepare(ctx, req.Spec)
	if err != nil {
		return runtime.Result{}, err
	}
	// Read now, so that a rotated secret is used from this invocation on;
	// removed when the run returns (deferred first, runs last).
	secrets, err := r.secrets.Stage(req.Spec.Secrets)
	if err != nil {
		return runtime.Result{}, err
	}
	defer secrets.Remove()
	cont, id, rootfs, pre, err := r.newContainer(ctx, req, p, secrets)
	if err != nil {
		return runtime.Result{}, err
	}
	if pre != nil {
		// After the task's deletion below (deferred later, runs first).
		defer pre.Release()
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
	case ended == core.EndCancelled:
		return res, ctx.Err()
	case err != nil:
		return res, core.OutcomeUnknown(fmt.Errorf("wait task %s: %w", id, err))
	case ended == core.EndTimedOut:
		return res, &runtime.ExitError{Code: int(code), TimedOut: true, Timeout: req.Timeout}
	case code != 0:
		return res, r.host.ExitError(ctx, req, id, a.task, int(code), 0)
	}
	return res, nil
}

// oneShotRun is one attempt in a one-shot container (Runner.Run): its
// container, its task once created, and the writers of its output.
type oneShotRun struct {
	r              *Runner
	req            runtime.Request
	id             string
	cont           client.Container
	pre            *exechelper.Task // the task created ahead, or nil
	stdout, stderr *runtime.LineWriter

	task   client.Task
	exited bool // the task's exit status was received
	// waitCtx bounds the waits for the exit status; cancelWait, at the
	// end of the attempt, ends them.
	waitCtx    context.Context
	cancelWait func()
	relabelled chan struct{} // closed once a prepared container is relabelled
}

// begin creates the attempt's task (or takes the one created ahead),
// waits for its exit and starts it; it returns where the exit status
// arrives.
func (a *oneShotRun) begin(ctx context.Context, p core.Prepared, rootfs []mount.Mount) (<-chan client.ExitStatus, error) {
	var env []string // the attempt's environment, for a task created ahead
	var err error
	if a.pre == nil {
		ioCreator := cio.NewCreator(cio.WithStreams(bytes.NewReader(a.req.Event), a.stdout, a.stderr))
		if a.task, err = a.r.host.NewTask(ctx, a.cont, rootfs, ioCreator); err != nil {
			if ee := core.ExecError(err); ee != nil {
				return nil, ee
			}
			return nil, core.Classify(fmt.Errorf("create task %s: %w", a.id, err))
		}
	} else {
		a.task = a.pre.Task
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
		return nil, core.Classify(fmt.Errorf("wait task %s: %w", a.id, err))
	}
	start := a.task.Start
	if a.pre != nil {
		a.relabel(ctx)
		start = func(ctx context.Context) error { return a.pre.Start(ctx, env, a.req.Event, a.stdout, a.stderr) }
	}
	if err := start(ctx); err != nil {
		if ee := core.ExecError(err); ee != nil {
			return nil, ee
		}
		if errdefs.IsUnavailable(err) {
			// The connection broke during Start: the process may have been
			// launched. Fail closed rather than run it again uncharged.
			return nil, core.OutcomeUnknown(fmt.Errorf("start task %s: %w", a.id, err))
		}
		return nil, core.Classify(fmt.Errorf("start task %s: %w", a.id, err))
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
		dctx, cancel := a.r.host.Detached(ctx)
		defer cancel()
		if err := a.r.relabel(dctx, a.id, a.req); err != nil {
			a.r.host.Logger.LogAttrs(dctx, slog.LevelWarn, "labelling a prepared container failed",
				slog.String("app", a.req.App), slog.String("container_id", a.id), slog.Any("error", err))
		}
	}()
}

// await waits for the started handler's exit, the rule's timeout or ctx,
// and returns the exit status and how the wait ended. A handler still
// running at the timeout or cancellation is killed, and the status is the
// one of the kill. Errors leave the outcome unknown.
func (a *oneShotRun) await(ctx context.Context, statusC <-chan client.ExitStatus) (client.ExitStatus, core.Ending, error) {
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
			return client.ExitStatus{}, core.EndExited, core.OutcomeUnknown(fmt.Errorf("close stdin of %s: %w", a.id, err))
		}
	}
	var timeout <-chan time.Time
	if a.req.Timeout > 0 {
		t := time.NewTimer(a.req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	status, ended, statusC, err := a.rewait(ctx, statusC, timeout)
	if err != nil || ended == core.EndExited {
		return status, ended, err
	}
	// The timer or ctx fired, which says nothing of the handler when the
	// worker was stopped past the timeout (SIGSTOP, a stalled VM) or its
	// exit's report is on its way: containerd's task state decides, and a
	// handler that exited by itself is reported with its own exit
	// (docs/delivery.md "Leases").
	if st, ok := a.exitedStatus(ctx); ok {
		return st, core.EndExited, nil
	}
	if statusC == nil {
		// Lost and not waited for again: the kill waits for the exit on
		// statusC.
		if sc, err := a.task.Wait(a.waitCtx); err == nil {
			statusC = sc
		}
	}
	if status, err = a.r.host.Kill(ctx, a.task, statusC); err != nil {
		return status, ended, core.OutcomeUnknown(fmt.Errorf("kill task %s: %w", a.id, err))
	}
	if code, _, err := status.Result(); err == nil && code != core.SigkillExit {
		// It exited by itself between the look and the kill.
		return status, core.EndExited, nil
	}
	return status, ended, nil
}

// rewait waits for the handler's exit as awaitExit does and, when
// containerd went away mid-wait (a restart), waits again: the shim keeps
// the task and, once it exits, its exit status, and the restarted daemon
// finds them again, so the outcome is not lost. It returns the status
// channel to wait on after a kill, nil when none is pending.
func (a *oneShotRun) rewait(ctx context.Context, statusC <-chan client.ExitStatus, timeout <-chan time.Time) (client.ExitStatus, core.Ending, <-chan client.ExitStatus, error) {
	status, ended := awaitExit(ctx, statusC, timeout)
	for lost := time.Now(); ended == core.EndExited && core.DaemonLost(status.Error()); {
		statusC = nil // it delivered the lost wait's status
		if time.Since(lost) > rewaitLimit {
			break
		}
		select {
		case <-time.After(rewaitInterval):
		case <-timeout:
			return status, core.EndTimedOut, nil, nil
		case <-ctx.Done():
			return status, core.EndCancelled, nil, nil
		}
		sc, err := a.task.Wait(a.waitCtx)
		if err != nil {
			if !core.DaemonLost(err) {
				return status, ended, nil, core.OutcomeUnknown(fmt.Errorf("wait task %s again after containerd came back: %w", a.id, err))
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
	dctx, cancel := a.r.host.Detached(ctx)
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
	if task != nil && a.exited && core.DrainOutput(task, core.OutputDrainTimeout) {
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
	defer r.host.Track(a.id, false)
	dctx, cancel := r.host.Detached(ctx)
	defer cancel()
	var errs []error
	if task != nil {
		var delOpts []client.ProcessDeleteOpts
		if !a.exited {
			delOpts = append(delOpts, client.WithProcessKill)
		}
		if err := core.DeleteTask(dctx, a.cont, task, delOpts...); err != nil {
			errs = append(errs, fmt.Errorf("delete task: %w", err))
		}
	}
	// Output is complete now: the task's deletion ended the copy.
	finishOutput()
	if task == nil {
		// NewTask failed, possibly after the shim created the task (ctx
		// cancelled mid-call): remove whatever task exists as well.
		if err := r.host.Remove(ctx, a.id); err != nil {
			errs = append(errs, err)
		}
	} else if err := a.cont.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
		errs = append(errs, fmt.Errorf("delete container: %w", err))
	}
	r.host.LogCleanup(ctx, a.req, a.id, errors.Join(errs...))
}

// awaitExit waits for the exit status on statusC, the rule's timeout or
// ctx. An exit already reported when the timeout or ctx is seen wins: a
// worker stopped (SIGSTOP, a stalled VM) past the timeout may find both
// ready when it resumes. When it does not, the caller asks containerd
// (oneShotRun.await).
func awaitExit(ctx context.Context, statusC <-chan client.ExitStatus, timeout <-chan time.Time) (client.ExitStatus, core.Ending) {
	var status client.ExitStatus
	ended := core.EndExited
	select {
	case status = <-statusC:
		return status, core.EndExited
	case <-timeout:
		ended = core.EndTimedOut
	case <-ctx.Done():
		ended = core.EndCancelled
	}
	select {
	case status = <-statusC:
		return status, core.EndExited
	default:
		return status, ended
	}
}

// rewaitInterval paces the new waits for a task's exit while containerd
// is unavailable, and rewaitLimit bounds them: a daemon away for longer
// leaves the outcome unknown.
const (
	rewaitInterval = 250 * time.Millisecond
	rewaitLimit    = 2 * time.Minute
)

// attemptEnv returns the environment req's container would have been
// created with: the image's, the app's and the attempt's variables, which
// a task created ahead gets with its event (exechelper.Task.Start).
func (r *Runner) attemptEnv(ctx context.Context, id string, req runtime.Request, p core.Prepared) ([]string, error) {
	s, err := oci.GenerateSpec(ctx, r.host.Client, &containers.Container{ID: id}, p.Spec(req)...)
	if err != nil {
		return nil, err
	}
	return s.Process.Env, nil
}
