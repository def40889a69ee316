package oneshot

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// TestAwaitExitPrefersAnExitAlreadyReported: a worker resumed after a stop
// past the rule's timeout finds the exit and the timeout ready at once;
// the handler exited by itself, unstopped, so its exit is the outcome,
// never a timeout with the exit code of a handler nobody killed.
func TestAwaitExitPrefersAnExitAlreadyReported(t *testing.T) {
	for range 200 {
		statusC := make(chan client.ExitStatus, 1)
		statusC <- *client.NewExitStatus(0, time.Now(), nil)
		timeout := make(chan time.Time, 1)
		timeout <- time.Now()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		status, ended := awaitExit(ctx, statusC, timeout)
		if ended != core.EndExited || status.ExitCode() != 0 {
			t.Fatalf("ended %v, code %d; want the reported exit 0", ended, status.ExitCode())
		}
	}
	timeout := make(chan time.Time, 1)
	timeout <- time.Now()
	if _, ended := awaitExit(context.Background(), make(chan client.ExitStatus), timeout); ended != core.EndTimedOut {
		t.Error("a timeout with no exit reported is not a timeout")
	}
}
