package relay

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/relaydev/relay/invocation"
)

// TestWriteFailedOfALostLease: a write refused because the attempt's lease
// was taken over (a stalled or suspended worker resuming) is logged as a
// warning that says so, not as a failure to record the outcome; any other
// failed write stays an error.
func TestWriteFailedOfALostLease(t *testing.T) {
	type line struct {
		level slog.Level
		msg   string
	}
	var got []line
	log := func(l slog.Level, m string, _ ...slog.Attr) { got = append(got, line{l, m}) }
	for _, err := range []error{invocation.ErrStale, fmt.Errorf("retry: %w", invocation.ErrTerminal)} {
		got = nil
		logObserver{}.writeFailed(log, Outcome{Op: "retry", WriteErr: err}, nil)
		if len(got) != 1 || got[0].level != slog.LevelWarn || got[0].msg != "attempt's lease taken over by another delivery; its outcome is not recorded" {
			t.Errorf("write refused with %v logged %+v, want one warning that the lease was taken over", err, got)
		}
	}
	got = nil
	logObserver{}.writeFailed(log, Outcome{Op: "retry", WriteErr: errors.New("connection refused")}, nil)
	if len(got) != 1 || got[0].level != slog.LevelError || got[0].msg != "recording failure failed; message left pending" {
		t.Errorf("a failed write logged %+v, want the error line", got)
	}
}
