package containerd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/deps"
	"github.com/relaydev/relay/runtime/containerd/internal/exechelper"
	"github.com/relaydev/relay/runtime/containerd/internal/images"
	"github.com/relaydev/relay/runtime/containerd/internal/oneshot"
	"github.com/relaydev/relay/runtime/containerd/internal/presence"
	"github.com/relaydev/relay/runtime/containerd/internal/secrets"
	"github.com/relaydev/relay/runtime/containerd/internal/statedir"
	"github.com/relaydev/relay/runtime/containerd/internal/warm"
)

// Runner runs invocations in containerd (relay.Runner). Create it with New.
//
// A Runner is the wiring of the packages under internal/: each job is one
// of them, all sharing the Host of core (docs/architecture.md "Packages").
type Runner struct {
	host          *core.Host
	stateDir      string // WithStateDir; "" for none
	defaultImages map[string]string

	presence   *presence.Presence
	images     *images.Store
	bootstraps *statedir.Bootstraps
	secrets    *secrets.Stager
	deps       *deps.Builder
	oneShot    *oneshot.Runner
	warm       *warm.Pool
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
	host := core.NewHost(core.Config{
		Client:         c,
		Namespace:      o.namespace,
		Snapshotter:    o.snapshotter,
		HostID:         o.hostID,
		Owner:          presence.NewOwner(),
		Logger:         o.logger,
		CleanupTimeout: o.cleanupTimeout,
		TaskGrace:      o.taskCreationGrace,
	})
	r := &Runner{
		host:          host,
		stateDir:      o.stateDir,
		defaultImages: o.defaultImages,
		images: images.New(host, images.Config{Pull: o.pull, Timeout: o.pullTimeout,
			RetryInterval: o.pullRetryInterval, ProgressInterval: o.pullProgressInterval}),
		bootstraps: statedir.NewBootstraps(o.stateDir),
		secrets:    secrets.New(host, o.secretsDir),
	}
	stdout, stderr := runtime.SharedOutputs(o.stdout, o.stderr)
	var helper *exechelper.Helper
	if o.execHelper != "" && o.preparedContainers > 0 {
		if helper, err = exechelper.Install(o.execHelper, o.stateDir, o.logger); err != nil {
			r.host.Logger.Warn("the exec helper cannot be used: prepared one-shot containers get their task on demand",
				slog.String("path", o.execHelper), slog.Any("error", err))
		}
	}
	r.oneShot = oneshot.New(oneshot.Config{Host: host, Prepare: r.prepare, Secrets: r.secrets,
		Stdout: stdout, Stderr: stderr, Helper: helper,
		Prepared: o.preparedContainers, IdleTimeout: o.warmIdleTimeout})
	r.warm = warm.New(warm.Config{Host: host, Resolve: r.resolveImage, Prepare: r.prepare, Secrets: r.secrets,
		Stdout: stdout, Stderr: stderr, MaxInvocations: o.warmMaxInvocations,
		IdleTimeout: o.warmIdleTimeout, MaxContainers: o.warmMaxContainers})
	// The Runner counts as live (presence.LiveRunner) from here until
	// Close: nothing below fails.
	r.presence = presence.New(host, o.orphanTimeout)
	r.deps = deps.New(host, r.presence, deps.Config{MaxBuilds: o.maxBuilds, Timeout: o.buildTimeout,
		RetryInterval: DefaultBuildRetryInterval, Env: o.buildEnv, CAFile: o.buildCAFile, Retention: o.depsRetention})
	return r, nil
}

// Namespace returns the containerd namespace the Runner works in.
func (r *Runner) Namespace() string { return r.host.Namespace }

// HostID returns the value of the relay.host label on what the Runner creates.
func (r *Runner) HostID() string { return r.host.HostID }

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
	r.presence.Announce(ctx)
	run := r.oneShot.Run
	if req.Spec.Warm {
		run = r.warm.Run
	}
	res, err := run(namespaces.WithNamespace(ctx, r.host.Namespace), req)
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
	err := r.warm.Close(ctx)
	if derr := r.deps.Close(ctx); derr != nil && err == nil {
		err = derr
	}
	r.oneShot.Close(ctx)
	core.WaitUntil(ctx, r.host.Shims.Wait)
	r.host.Shims.Close()
	r.bootstraps.RemovePrivate()
	if werr := r.presence.Withdraw(ctx); werr != nil && err == nil {
		err = fmt.Errorf("containerd: remove presence label: %w", werr)
	}
	return err
}
