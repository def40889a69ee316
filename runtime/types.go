package runtime

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Spec is how one app's handlers run: the parts of template.yaml that a
// Runner needs (docs/apps.md "template.yaml").
type Spec struct {
	// Dir is the app directory on the host, mounted read-only at /app.
	Dir string
	// Runtime is "python3", "node" or "" (run Image's entrypoint or Command).
	Runtime string
	// Image is an OCI image reference.
	Image string
	// Command replaces the image entrypoint when non-empty.
	Command []string
	// Env is the app's environment (names never start with RELAY_).
	Env map[string]string
	// MemoryBytes, CPUs and PIDs are resource limits; 0 means the default.
	MemoryBytes int64
	CPUs        float64
	PIDs        int64
	// TmpBytes is the size of the tmpfs at /tmp (template.yaml
	// `resources.tmp`, docs/apps.md); 0 means the runner's default. Files
	// there count against MemoryBytes, so a full /tmp fails the handler's
	// write (ENOSPC) instead of getting it killed for memory.
	TmpBytes int64
	// Network is "none" or "host".
	Network string
	// Warm asks for long-lived containers that serve invocations one at a
	// time (template.yaml `warm`, docs/runtimes.md "Warm containers"); only
	// meaningful with Runtime set. Runners without warm containers ignore
	// it: the handler contract is the same either way.
	Warm bool
	// Deps is the app's dependency manifest, which the runner installs into
	// a cached image layer before the first invocation (docs/runtimes.md
	// "Dependencies"); nil when the app has none. Only language runtimes
	// have one.
	Deps *Deps
	// Secrets names files of the runner's secrets directory, each mounted
	// read-only at /run/secrets/<name> for every invocation
	// (docs/apps.md "Secrets"); every name passes CheckSecretName. Only
	// names are held here: values are read at invocation time.
	Secrets []string
}

// GoFunctions reports whether the handlers of an app with this Spec are Go
// functions (runtime.Func): no image, and the runtime go or none. Any
// other Spec describes a container (an image, or the python3 or node
// runtime).
func (s Spec) GoFunctions() bool {
	return s.Image == "" && (s.Runtime == "" || s.Runtime == RuntimeGo)
}

// CommandLine shows Command as a shell would take it: an argument that is
// empty or holds blanks, quotes, a backslash or '$' is double-quoted.
func (s Spec) CommandLine() string {
	parts := make([]string, len(s.Command))
	for i, a := range s.Command {
		if a == "" || strings.ContainsAny(a, " \t\n\"'\\$") {
			a = strconv.Quote(a)
		}
		parts[i] = a
	}
	return strings.Join(parts, " ")
}

// Request is one attempt of one invocation.
type Request struct {
	App     string
	Handler string // "module.function"
	// MessageID is the stream entry id; for relay app invoke, the id it
	// was given or an "invoke-" one it generated (manual.Invoker).
	MessageID string
	Attempt   int
	// Event is the JSON written to the handler's stdin, followed by EOF.
	Event []byte
	// Timeout bounds the attempt; past it the handler is killed (SIGKILL)
	// and the attempt fails with an *ExitError whose TimedOut is true.
	Timeout time.Duration
	// Env holds extra variables such as TRACEPARENT, added after Spec.Env.
	Env  map[string]string
	Spec Spec
}

// Result is what Runner.Run returns besides its error: how long the run
// took (a runner may leave it zero when Run fails). How an attempt ended, as the Engine counts and
// logs it, is a relay.AttemptResult (success, failure, timeout, ...), decided
// from Run's error (relay.ResultOf).
type Result struct {
	Duration time.Duration
}

// ExitError is a handler failure: the handler ran and exited non-zero, timed
// out, was killed for exceeding its memory limit, or (for in-process
// handlers) returned an error. It uses up an attempt. Any other error from
// Runner.Run is an infrastructure failure that charges no attempt.
type ExitError struct {
	Code     int
	TimedOut bool
	// Timeout is the limit that was exceeded, when TimedOut.
	Timeout time.Duration
	// OOMKilled is set when the kernel killed the handler because its
	// container reached its memory limit (Code is then 137, as for any
	// SIGKILL); a handler that exits 137 by itself is not OOMKilled. Only
	// runners that enforce a memory limit set it (docs/apps.md).
	OOMKilled bool
	// MemoryLimit is the limit in bytes that was reached, when OOMKilled.
	MemoryLimit int64
	// Stderr is the last non-blank line the handler wrote to stderr, if
	// any, so that logs and DLQ entries say why it failed.
	Stderr string
	// Err is the underlying cause for in-process handlers, nil otherwise.
	Err error
}

func (e *ExitError) Error() string {
	var msg string
	switch {
	case e.TimedOut && e.Timeout > 0:
		msg = fmt.Sprintf("handler timed out after %s (the rule's timeout)", e.Timeout)
	case e.TimedOut:
		msg = "handler timed out"
	case e.OOMKilled && e.MemoryLimit > 0:
		msg = fmt.Sprintf("handler killed: out of memory (limit %s)", FormatSize(e.MemoryLimit))
	case e.OOMKilled:
		msg = "handler killed: out of memory"
	case e.IsPermanent() && e.Err != nil:
		msg = fmt.Sprintf("handler failed permanently: %v", e.Err)
	case e.Err != nil:
		msg = fmt.Sprintf("handler failed: %v", e.Err)
	case e.IsPermanent():
		msg = fmt.Sprintf("handler exited with code %d (permanent failure)", e.Code)
	default:
		msg = fmt.Sprintf("handler exited with code %d", e.Code)
	}
	if e.Stderr != "" {
		msg += ": " + e.Stderr
	}
	return msg
}

func (e *ExitError) Unwrap() error { return e.Err }

// ExitPermanent is the exit code by which a handler says that its failure
// is permanent: the same event can never succeed, so the invocation is
// dead-lettered at once instead of retried (docs/delivery.md#permanent-failures).
// It is EX_DATAERR of sysexits.h, "the input data was incorrect".
const ExitPermanent = 65

// ErrPermanent is wrapped by Permanent; a Go handler's error that wraps it
// fails its invocation for good.
var ErrPermanent = errors.New("permanent failure")

// Permanent marks err as a permanent failure: returned by a HandlerFunc,
// the invocation is exhausted at once and dead-lettered with err as the
// reason, never retried (docs/delivery.md#permanent-failures). The attempt
// still counts. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

type permanentError struct{ err error }

func (e *permanentError) Error() string   { return e.err.Error() }
func (e *permanentError) Unwrap() []error { return []error{e.err, ErrPermanent} }

// IsPermanent reports whether the handler said its failure is permanent:
// it exited ExitPermanent by itself (not at a timeout or out of memory), or
// its Go function returned an error wrapping ErrPermanent.
func (e *ExitError) IsPermanent() bool {
	if e.TimedOut || e.OOMKilled {
		return false
	}
	return e.Code == ExitPermanent || errors.Is(e.Err, ErrPermanent)
}

// ErrOutcomeUnknown marks an infrastructure error after the handler
// started (the runtime lost track of it): it may have run to the end, or may
// still be running. The Engine then keeps the claim instead of releasing
// it, so the attempt is counted when its lease expires, as when a worker
// dies mid-handler, and the handler is not started twice uncharged.
var ErrOutcomeUnknown = errors.New("runtime: handler outcome unknown")

// ErrUnavailable marks an infrastructure error that makes an app unable to
// run right now (image missing, runtime daemon down). Runners wrap it; the
// Engine leaves the message pending and charges no attempt.
var ErrUnavailable = errors.New("runtime: app unavailable")

// FormatSize formats a byte count the way template.yaml writes sizes: in
// the largest of GiB, MiB and KiB that divides it, else in bytes
// ("128MiB", "1536KiB", "100B").
func FormatSize(n int64) string {
	for _, u := range []struct {
		suffix string
		size   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return fmt.Sprintf("%d%s", n/u.size, u.suffix)
		}
	}
	return fmt.Sprintf("%dB", n)
}
