package core

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"

	"github.com/containerd/errdefs"
	"github.com/containerd/errdefs/pkg/errgrpc"

	"github.com/relaydev/relay/runtime"
)

// Classify marks errors that mean containerd cannot be reached: they wrap
// runtime.ErrUnavailable, which holds a message pending rather than
// charging an attempt.
func Classify(err error) error {
	if errdefs.IsUnavailable(err) {
		return fmt.Errorf("%w: %w", runtime.ErrUnavailable, err)
	}
	return err
}

// DaemonLost reports an error of a call that lost its connection to
// containerd, which comes as a gRPC status from a wait under way.
func DaemonLost(err error) bool {
	return err != nil && (errdefs.IsUnavailable(err) || errdefs.IsUnavailable(errgrpc.ToNative(err)))
}

// OutcomeUnknown marks err as leaving an attempt's outcome unknown
// (runtime.ErrOutcomeUnknown): from the start of its handler on, losing
// track of it is not "never ran".
func OutcomeUnknown(err error) error {
	return fmt.Errorf("%w: %w", runtime.ErrOutcomeUnknown, err)
}

// ExecError recognises runc's report that the handler's command cannot be
// executed and turns it into the exit code a shell would give (127 not
// found, 126 not executable), or returns nil: a broken command is the
// app's fault, which should use up attempts and reach the DLQ rather than
// stay pending forever. runc reports it only as text.
func ExecError(err error) *runtime.ExitError {
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

// PathCause is err without the path of the file it is about, when that is
// a *fs.PathError or an *os.LinkError: the error of an operation on a file
// of a random name (a temporary file), whose caller names what it wrote,
// so that a failure repeated attempt after attempt (a full disk) reads the
// same every time and is logged as one (docs/operations.md#logs).
func PathCause(err error) error {
	if pe, ok := errors.AsType[*fs.PathError](err); ok {
		return fmt.Errorf("%s: %w", pe.Op, pe.Err)
	}
	if le, ok := errors.AsType[*os.LinkError](err); ok {
		return fmt.Errorf("%s: %w", le.Op, le.Err)
	}
	return err
}
