package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	containerd "github.com/containerd/containerd/v2/client"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
	ctrd "github.com/relaydev/relay/runtime/containerd"
)

// RunnerFlags choose and reach the Runner of every command that runs
// handlers (start, app invoke, dlq replay), so they all run them the same way.
type RunnerFlags struct {
	ContainerdAddress   string `name:"containerd-address" env:"CONTAINERD_ADDRESS" default:"/run/containerd/containerd.sock" help:"containerd socket."`
	ContainerdNamespace string `name:"containerd-namespace" env:"CONTAINERD_NAMESPACE" default:"relay" help:"containerd namespace."`
	Runner              string `name:"runner" env:"RELAY_RUNNER" default:"containerd" enum:"containerd,process" help:"Handler runtime: containerd (isolated, production) or process (local exec, no isolation, development only)."`
	SecretsDir          string `name:"secrets-dir" env:"RELAY_SECRETS_DIR" default:"/var/lib/relay/secrets" help:"Directory of the files an app's secrets name, mounted at /run/secrets/NAME (docs/apps.md)."`
	MaxConcurrentBuilds int    `name:"max-concurrent-builds" env:"MAX_CONCURRENT_BUILDS" default:"2" help:"Dependency builds run at a time (docs/runtimes.md)."`
	BuildCAFile         string `name:"build-ca-file" env:"RELAY_BUILD_CA_FILE" help:"PEM file of extra CA certificates trusted by dependency builds, for a private package mirror."`
	// stateDir, when set (relay start's --state-dir), keeps the runner's
	// files (the python3/node bootstraps) there instead of a temp dir.
	stateDir string
}

// openRunner is a Runner built from RunnerFlags; Close releases it.
type openRunner struct {
	relay.Runner
	// containerd is the containerd Runner, nil for the process runner.
	containerd *ctrd.Runner
	close      func()
}

func (r *openRunner) Close() {
	if r.close != nil {
		r.close()
	}
}

// pingTimeout bounds a health check of Redis or containerd.
const pingTimeout = 10 * time.Second

// open builds the chosen Runner; handler output goes to stdout and stderr,
// prefixed [app/handler]. A containerd Runner is pinged first, so a command
// that cannot run anything fails at once. hostID labels the containers (see
// ctrd.WithHostID): processes sharing a containerd need different ones.
// extra are further options of a containerd Runner.
func (f *RunnerFlags) open(ctx context.Context, log *slog.Logger, stdout, stderr io.Writer, hostID string, extra ...ctrd.Option) (*openRunner, error) {
	if f.Runner == "process" {
		log.Warn("process runner: handlers run as local processes without isolation; use it for development only")
		pr, err := runtime.NewProcess(runtime.WithOutput(stdout, stderr))
		if err != nil {
			return nil, err
		}
		return &openRunner{Runner: pr}, nil
	}
	cc, err := f.containerdClient()
	if err != nil {
		return nil, err
	}
	if f.MaxConcurrentBuilds <= 0 {
		return nil, usagef("MAX_CONCURRENT_BUILDS (--max-concurrent-builds) must be > 0, not %d", f.MaxConcurrentBuilds)
	}
	opts := []ctrd.Option{ctrd.WithNamespace(f.ContainerdNamespace), ctrd.WithOutput(stdout, stderr),
		ctrd.WithHostID(hostID), ctrd.WithLogger(log), ctrd.WithMaxConcurrentBuilds(f.MaxConcurrentBuilds)}
	if f.SecretsDir != "" {
		opts = append(opts, ctrd.WithSecretsDir(f.SecretsDir))
	}
	if f.BuildCAFile != "" {
		opts = append(opts, ctrd.WithBuildCAFile(f.BuildCAFile))
	}
	if f.stateDir != "" {
		opts = append(opts, ctrd.WithStateDir(f.stateDir))
	}
	cr, err := ctrd.New(cc, append(opts, extra...)...)
	if err != nil {
		cc.Close()
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	err = cr.Ping(pctx)
	cancel()
	if err != nil {
		cc.Close()
		return nil, fmt.Errorf("containerd at %s is not usable: %w (is containerd running? set CONTAINERD_ADDRESS)", f.ContainerdAddress, err)
	}
	closeRunner := func() {
		// Warm containers go with the worker, not at the next start's sweep.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if err := cr.Close(cctx); err != nil {
			log.LogAttrs(cctx, slog.LevelWarn, "removing warm containers failed; the next start sweeps them", slog.Any("error", err))
		}
		cc.Close()
	}
	return &openRunner{Runner: cr, containerd: cr, close: closeRunner}, nil
}

func (f *RunnerFlags) containerdClient() (*containerd.Client, error) {
	// A missing socket would only show as a dial timeout after pingTimeout.
	if path, ok := strings.CutPrefix(f.ContainerdAddress, "unix://"); ok || !strings.Contains(f.ContainerdAddress, "://") {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("no containerd socket at %s (is containerd running? set CONTAINERD_ADDRESS)", path)
		}
	}
	cc, err := containerd.New(f.ContainerdAddress, containerd.WithDefaultNamespace(f.ContainerdNamespace),
		containerd.WithTimeout(pingTimeout))
	if err != nil {
		return nil, fmt.Errorf("connect to containerd at %s: %w (is containerd running? set CONTAINERD_ADDRESS)", f.ContainerdAddress, err)
	}
	return cc, nil
}

// cliHostID labels the containers of one CLI process. It is unique per
// process, so no worker's sweep removes a handler the CLI is running.
func cliHostID() string { return hostname() + "/relay-cli-" + strconv.Itoa(os.Getpid()) }

// lazyRunner opens its Runner on the first Run, so commands that end up
// running nothing (no match, a refused entry) never need containerd.
type lazyRunner struct {
	open func() (*openRunner, error)

	once sync.Once
	r    *openRunner
	err  error
}

func (l *lazyRunner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	l.once.Do(func() { l.r, l.err = l.open() })
	if l.err != nil {
		return runtime.Result{}, l.err
	}
	return l.r.Run(ctx, req)
}

func (l *lazyRunner) Close() {
	if l.r != nil {
		l.r.Close()
	}
}

// manualRunner is the lazy Runner of app invoke and dlq replay. With
// toStderr all handler output goes to stderr, keeping stdout for --json.
func (f *RunnerFlags) manualRunner(ctx context.Context, g *Globals, toStderr bool) *lazyRunner {
	out := g.stdout
	if toStderr {
		out = g.stderr
	}
	return &lazyRunner{open: func() (*openRunner, error) {
		// A few attempts and exit: containers prepared ahead would only be
		// created to be removed (docs/runtimes.md "One-shot containers").
		return f.open(ctx, g.logger(), out, g.stderr, cliHostID(), ctrd.WithPreparedContainers(0))
	}}
}

// execHelper returns the option giving a worker's containerd Runner the
// exec helper next to the relay executable, with which one-shot containers
// get their task ahead of demand (docs/runtimes.md "One-shot containers");
// none, said once in the log, when there is no such file.
func execHelper(runner string, log *slog.Logger) []ctrd.Option {
	if runner == "process" {
		return nil
	}
	exe, err := os.Executable()
	if err == nil {
		if p := ctrd.ExecHelperNextTo(exe); p != "" {
			return []ctrd.Option{ctrd.WithExecHelper(p)}
		}
	}
	log.Info("no " + ctrd.ExecHelperName + " next to the relay executable: one-shot containers get their task on demand (docs/runtimes.md \"One-shot containers\")")
	return nil
}

// observed is a Runner that calls before and after (when not nil) around
// each run, so progress lines sit next to the handler's own output.
type observed struct {
	relay.Runner
	before func(runtime.Request)
	after  func(runtime.Request, time.Duration, error)
}

func (o observed) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	if o.before != nil {
		o.before(req)
	}
	start := time.Now()
	res, err := o.Runner.Run(ctx, req)
	if o.after != nil {
		o.after(req, time.Since(start), err)
	}
	return res, err
}
