package runtime

import (
	"errors"
	"io"
	"os"
	"time"
)

// DefaultWaitDelay is how long Process waits for a handler's output pipes to
// close after the handler exited (or was killed) before closing them itself.
const DefaultWaitDelay = time.Second

// Option configures a Process.
type Option func(*processOptions) error

type processOptions struct {
	stdout, stderr io.Writer
	baseEnv        []string
	baseEnvSet     bool
	waitDelay      time.Duration
}

// WithOutput sets where handler stdout and stderr lines go; both must be
// non-nil and may be the same writer. Default: os.Stdout and os.Stderr.
func WithOutput(stdout, stderr io.Writer) Option {
	return func(o *processOptions) error {
		if stdout == nil || stderr == nil {
			return errors.New("runtime: WithOutput: nil writer")
		}
		o.stdout, o.stderr = stdout, stderr
		return nil
	}
}

// WithBaseEnv sets the environment handlers start from, before Environ's
// variables are added ("NAME=value" entries). Default: the environment of the
// current process (Process runs local tools, which need PATH, HOME, ...).
func WithBaseEnv(env []string) Option {
	return func(o *processOptions) error {
		o.baseEnv, o.baseEnvSet = env, true
		return nil
	}
}

// WithWaitDelay sets how long Process waits for output pipes held open by a
// handler's leftover children. d must be > 0. Default: DefaultWaitDelay.
func WithWaitDelay(d time.Duration) Option {
	return func(o *processOptions) error {
		if d <= 0 {
			return errors.New("runtime: WithWaitDelay: must be > 0")
		}
		o.waitDelay = d
		return nil
	}
}

func newProcessOptions(opts []Option) (processOptions, error) {
	o := processOptions{stdout: os.Stdout, stderr: os.Stderr, waitDelay: DefaultWaitDelay}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	if !o.baseEnvSet {
		o.baseEnv = os.Environ()
	}
	return o, nil
}
