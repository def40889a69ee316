package containerd

import (
	"context"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
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
		status, timedOut, cancelled := awaitExit(ctx, statusC, timeout)
		if timedOut || cancelled || status.ExitCode() != 0 {
			t.Fatalf("timedOut %v, cancelled %v, code %d; want the reported exit 0", timedOut, cancelled, status.ExitCode())
		}
	}
	timeout := make(chan time.Time, 1)
	timeout <- time.Now()
	if _, timedOut, _ := awaitExit(context.Background(), make(chan client.ExitStatus), timeout); !timedOut {
		t.Error("a timeout with no exit reported is not a timeout")
	}
}
