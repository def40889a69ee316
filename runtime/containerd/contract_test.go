package containerd_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// contractScript is one shell handler for every relaytest.Behaviour,
// selected by $RELAY_HANDLER.
const contractScript = `case "$RELAY_HANDLER" in
succeeds) exit 0 ;;
fails) echo "failed on purpose" >&2; exit 3 ;;
hangs) exec sleep 600 ;;
checks.event) [ "$(cat)" = "$EXPECTED_EVENT" ] ;;
*) exit 64 ;;
esac
`

var contractHandler = map[relaytest.Behaviour]string{
	relaytest.Succeeds:    "succeeds",
	relaytest.Fails:       "fails",
	relaytest.Hangs:       "hangs",
	relaytest.ChecksEvent: "checks.event",
}

// TestRunnerContract runs the shared relay.Runner suite against Runner on
// a real containerd (internal/containerdtest), and asserts after each run
// that nothing was left behind.
func TestRunnerContract(t *testing.T) {
	relaytest.TestRunner(t, func(t *testing.T) relaytest.RunnerHarness {
		c := containerdtest.Client(t)
		dir := t.TempDir()
		// The handler runs as nobody: the app directory must be readable by it.
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "handler.sh"), []byte(contractScript), 0o644); err != nil {
			t.Fatal(err)
		}
		r, err := containerd.New(c,
			containerd.WithExecHelper(testExecHelper),
			containerd.WithNamespace(c.DefaultNamespace()),
			// Every harness sweeps only what it created itself.
			containerd.WithHostID(relaytest.UniqueName(t)),
			containerd.WithOutput(io.Discard, io.Discard),
			containerd.WithPull(false),
		)
		if err != nil {
			t.Fatal(err)
		}
		// Closed first: its prepared containers go at Close (or after the
		// idle timeout, which AssertClean's wait does not outlast).
		t.Cleanup(func() {
			if err := r.Close(context.Background()); err != nil {
				t.Error(err)
			}
			containerdtest.AssertClean(t, c)
		})
		return relaytest.RunnerHarness{
			Runner: r,
			Request: func(_ *testing.T, b relaytest.Behaviour) runtime.Request {
				return runtime.Request{App: "contract", Handler: contractHandler[b], Spec: runtime.Spec{
					Dir: dir, Image: containerdtest.Image, Command: []string{"/bin/sh", "/app/handler.sh"},
					Env: map[string]string{"EXPECTED_EVENT": relaytest.CheckEvent},
				}}
			},
		}
	})
}
