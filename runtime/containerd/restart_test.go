package containerd_test

import (
	"errors"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/task"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
)

// containerdScript runs scripts/containerd.sh, which starts a private
// daemon under a state directory and stops only the PID it started.
func containerdScript(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("bash", append([]string{"../../scripts/containerd.sh"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("containerd.sh %v: %v\n%s", args, err, out)
	}
}

// TestContainerdRestartMidHandler restarts the daemon while a handler
// runs. The runner cannot know how the handler ended, so it must report
// runtime.ErrOutcomeUnknown (the Engine then keeps the claim instead of
// running the handler again uncharged), and the orphaned container must
// go at the next Sweep.
func TestContainerdRestartMidHandler(t *testing.T) {
	if testing.Short() || os.Geteuid() != 0 || os.Getenv(containerdtest.EnvAddress) == "" {
		t.Skip("needs root and a containerd setup (CONTAINERD_ADDRESS); restarts a private daemon of its own")
	}
	state := t.TempDir()
	containerdScript(t, "start", state)
	// Registered first, so it runs after containerdtest's own cleanup.
	t.Cleanup(func() { _ = exec.Command("bash", "../../scripts/containerd.sh", "stop", state).Run() })
	t.Setenv(containerdtest.EnvAddress, state+"/containerd/containerd.sock")

	f := newFixture(t)
	req := f.request("events.created")
	req.Spec.Command = []string{"/bin/sh", "-c", "sleep 3; echo finished"}
	done := make(chan error, 1)
	go func() {
		_, err := f.runner.Run(t.Context(), req)
		done <- err
	}()
	ctx := t.Context()
	testutil.WaitFor(t, 10*time.Second, "the handler's task running", func() bool {
		tasks, err := f.client.TaskService().List(ctx, nil)
		return err == nil && len(tasks.Tasks) == 1 && tasks.Tasks[0].Status == task.Status_RUNNING
	})
	containerdScript(t, "stop", state)
	containerdScript(t, "start", state)

	select {
	case err := <-done:
		if !errors.Is(err, runtime.ErrOutcomeUnknown) {
			t.Fatalf("Run after a containerd restart = %v, want ErrOutcomeUnknown", err)
		}
		if _, isExit := errors.AsType[*runtime.ExitError](err); isExit {
			t.Fatalf("an unknown outcome must not be a handler failure: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after containerd restarted")
	}
	// The shim outlived the daemon: Sweep removes the orphan.
	testutil.WaitFor(t, 20*time.Second, "sweep to remove the orphan", func() bool {
		return f.runner.Sweep(ctx) == nil && len(containerdtest.Leftovers(ctx, f.client)) == 0
	})
}
