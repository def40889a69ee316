package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Process is a Runner that runs each invocation as a local process, with no
// isolation and no resource limits: for development and tests only.
//
// The command is spec.Command (or the runtime's bootstrap), started in
// spec.Dir; arguments "/app" and "/app/..." are rewritten to spec.Dir, so the
// same template works here and in a container. The environment is the base
// environment (WithBaseEnv) plus Environ(req); the event is on stdin. The
// handler runs in a process group of its own, and the whole group is killed
// with SIGKILL on timeout. Safe for concurrent use.
type Process struct {
	stdout, stderr *Output
	baseEnv        []string
	waitDelay      time.Duration
}

// NewProcess returns a Process runner.
func NewProcess(opts ...Option) (*Process, error) {
	o, err := newProcessOptions(opts)
	if err != nil {
		return nil, err
	}
	p := &Process{baseEnv: o.baseEnv, waitDelay: o.waitDelay}
	p.stdout, p.stderr = SharedOutputs(o.stdout, o.stderr)
	return p, nil
}

// Run runs one attempt and waits for it (relay.Runner).
//
// A non-zero exit is an *ExitError with that code (128+n for a process
// killed by signal n); a command that cannot be executed is an *ExitError
// with code 127 (not found) or 126 (not executable), as in a shell. A missing
// app directory or command wraps ErrUnavailable. When ctx is cancelled the
// process group is killed and Run returns an error wrapping ctx.Err(),
// unless req.Timeout expired first: then it is a timeout (TimedOut).
func (p *Process) Run(ctx context.Context, req Request) (Result, error) {
	name := req.App + "/" + req.Handler
	argv, err := p.command(req.Spec)
	if err != nil {
		return Result{}, fmt.Errorf("run %s: %w", name, err)
	}
	if fi, err := os.Stat(req.Spec.Dir); err != nil || !fi.IsDir() {
		return Result{}, fmt.Errorf("run %s: app directory %q: %w", name, req.Spec.Dir, ErrUnavailable)
	}

	runCtx, cancel := withTimeout(ctx, req.Timeout)
	defer cancel()
	cmd := exec.CommandContext(runCtx, argv[0], argv[1:]...)
	cmd.Dir = req.Spec.Dir
	cmd.Env = append(append([]string(nil), p.baseEnv...), Environ(req)...)
	cmd.Stdin = bytes.NewReader(req.Event)
	prefix := Prefix(req.App, req.Handler)
	stdout, stderr := p.stdout.LineWriter(prefix), p.stderr.LineWriter(prefix)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	setProcessGroup(cmd)
	cmd.Cancel = func() error { return killProcessGroup(cmd) }
	cmd.WaitDelay = p.waitDelay

	start := time.Now()
	err = cmd.Run()
	res := Result{Duration: time.Since(start)}
	// Output errors are the log sink's problem, not the handler's.
	_ = stdout.Close()
	_ = stderr.Close()

	var exitErr *exec.ExitError
	switch {
	case timedOut(runCtx):
		// Killed at its timeout, whether or not a shutdown followed.
		return res, &ExitError{Code: exitCode(cmd), TimedOut: true, Timeout: req.Timeout, Stderr: stderr.LastLine()}
	case ctx.Err() != nil && (err != nil || outlived(req.Timeout, res.Duration)):
		return res, fmt.Errorf("run %s: %w", name, ctx.Err())
	case err == nil, errors.Is(err, exec.ErrWaitDelay):
		// ErrWaitDelay: the handler exited 0 but a child kept its output open.
		return res, nil
	case errors.As(err, &exitErr):
		return res, &ExitError{Code: exitCode(cmd), Stderr: stderr.LastLine()}
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, fs.ErrNotExist):
		return res, &ExitError{Code: 127, Err: err}
	case errors.Is(err, fs.ErrPermission):
		return res, &ExitError{Code: 126, Err: err}
	}
	return res, fmt.Errorf("run %s: %w", name, err)
}

// command resolves the command line for spec.
func (p *Process) command(spec Spec) ([]string, error) {
	argv, err := Command(spec)
	if err != nil {
		return nil, err
	}
	if len(argv) == 0 {
		return nil, fmt.Errorf("process runner needs a command or runtime (an image entrypoint cannot run locally): %w", ErrUnavailable)
	}
	argv = append([]string(nil), argv...)
	for i, a := range argv {
		if a == "/app" || strings.HasPrefix(a, "/app/") {
			argv[i] = filepath.Join(spec.Dir, strings.TrimPrefix(a, "/app"))
		}
	}
	return argv, nil
}

// exitCode returns the exit status of cmd's process, 128+n when signal n
// ended it, as a shell reports it.
func exitCode(cmd *exec.Cmd) int {
	if cmd.ProcessState == nil {
		return -1
	}
	if code := cmd.ProcessState.ExitCode(); code >= 0 {
		return code
	}
	if sig, ok := signalOf(cmd.ProcessState); ok {
		return 128 + sig
	}
	return -1
}
