package relay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/invocation"
)

// TestWriteFailedOfALostLease: a write refused because the attempt's lease
// was taken over (a stalled or suspended worker resuming), or because the
// message is no longer pending (another delivery acknowledged it, or Redis
// lost its data), is logged as a warning that says which, not as a failure
// to record the outcome; any other failed write stays an error.
func TestWriteFailedOfALostLease(t *testing.T) {
	type line struct {
		level slog.Level
		msg   string
	}
	var got []line
	log := func(l slog.Level, m string, _ ...slog.Attr) { got = append(got, line{l, m}) }
	for err, want := range map[error]string{
		invocation.ErrStale: "attempt's lease taken over by another delivery; its outcome is not recorded",
		// No other delivery need exist: Redis may have lost the PEL.
		fmt.Errorf("retry: %w", invocation.ErrTerminal): "the message is no longer pending in the consumer group (another delivery acknowledged it, or Redis lost its data); the outcome is not recorded",
	} {
		got = nil
		logObserver{}.writeFailed(log, Outcome{WriteErr: &WriteError{Op: OpRetry, Err: err}}, nil)
		if len(got) != 1 || got[0].level != slog.LevelWarn || got[0].msg != want {
			t.Errorf("write refused with %v logged %+v, want one warning: %s", err, got, want)
		}
	}
	// Refused only when tried again after an error: the first try may be
	// what took the lease.
	got = nil
	logObserver{}.writeFailed(log, Outcome{WriteErr: &WriteError{Op: OpFinish, Err: retriedWrite{invocation.ErrTerminal}}}, nil)
	if len(got) != 1 || got[0].level != slog.LevelWarn || !strings.HasPrefix(got[0].msg, "a retried write found the attempt's lease gone: the earlier try") {
		t.Errorf("a retried write refused logged %+v, want one warning that the earlier try may have applied", got)
	}
	got = nil
	logObserver{}.writeFailed(log, Outcome{WriteErr: &WriteError{Op: OpRetry, Err: errors.New("connection refused")}}, nil)
	if len(got) != 1 || got[0].level != slog.LevelError || got[0].msg != "recording failure failed; message left pending" {
		t.Errorf("a failed write logged %+v, want the error line", got)
	}
}

// TestRetryWriteMarksARefusalAfterAnError: ErrStale or ErrTerminal after a
// failed try comes back as retriedWrite (still Is the same error); on the
// first try it comes back as it is.
func TestRetryWriteMarksARefusalAfterAnError(t *testing.T) {
	tries := 0
	err := retryWrite(t.Context(), func(context.Context) error {
		tries++
		if tries == 1 {
			return errors.New("i/o timeout")
		}
		return invocation.ErrTerminal
	}, ctxtime.Sleep)
	if !errors.As(err, new(retriedWrite)) || !errors.Is(err, invocation.ErrTerminal) || tries != 2 {
		t.Errorf("after %d tries: %v (%T), want retriedWrite wrapping ErrTerminal after 2", tries, err, err)
	}
	err = retryWrite(t.Context(), func(context.Context) error { return invocation.ErrStale }, ctxtime.Sleep)
	if errors.As(err, new(retriedWrite)) || !errors.Is(err, invocation.ErrStale) {
		t.Errorf("first try refused: %v (%T), want ErrStale as it is", err, err)
	}
}
