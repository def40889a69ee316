package containerd_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime/containerd"
)

// restartMidRun waits until a task runs in c's namespace, restarts the
// private containerd d, and fails the test unless the Run reporting on
// done then returns without error within 30 s.
func restartMidRun(t *testing.T, c *client.Client, d *containerdtest.Daemon, done <-chan error) {
	t.Helper()
	testutil.WaitFor(t, 10*time.Second, "the handler's task running", func() bool {
		tasks, err := c.TaskService().List(t.Context(), nil)
		return err == nil && slices.ContainsFunc(tasks.Tasks, func(p *task.Process) bool { return p.Status == task.Status_RUNNING })
	})
	d.Stop()
	d.Start()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after a containerd restart = %v, want the handler's success", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after containerd restarted")
	}
}

// TestContainerdRestartMidHandler restarts the daemon while a handler
// runs. The shim keeps the task through the restart, so the runner waits
// for it again and reports how the handler ended, with its output, instead
// of an unknown outcome that would run it a second time; nothing is left
// behind.
func TestContainerdRestartMidHandler(t *testing.T) {
	d := containerdtest.Private(t)
	f := newFixture(t)
	req := f.request("events.created")
	req.Spec.Command = []string{"/bin/sh", "-c", "sleep 3; echo finished"}
	done := runInBackground(t, f.runner, req)
	ctx := t.Context()
	restartMidRun(t, f.client, d, done)
	if out := f.stdout.String(); !strings.Contains(out, "finished") {
		t.Errorf("the handler's output after the restart is lost: %q", out)
	}
	testutil.WaitFor(t, 20*time.Second, "nothing left behind", func() bool {
		return f.runner.Sweep(ctx) == nil && len(containerdtest.Leftovers(ctx, f.client)) == 0
	})
}

// TestCleanupFailureNamesTheApp: prepared containers that cannot be
// removed because containerd went away are logged with their app, so an
// operator knows whose leftovers the next sweep removes.
func TestCleanupFailureNamesTheApp(t *testing.T) {
	d := containerdtest.Private(t)
	f := newFixture(t)
	logs := &testutil.Buffer{}
	r := f.newRunner(t, "cleanup-"+randomHex(4), containerd.WithPreparedContainers(1),
		containerd.WithLogger(slog.New(slog.NewTextHandler(logs, nil))))
	ctx := t.Context()
	req := f.request("events.created")
	if _, err := r.Run(ctx, req); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "a container prepared", func() bool { return len(preparedIDs(t, f.client)) == 1 })
	d.Stop()
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_ = r.Close(cctx)
	d.Start()
	out := logs.String()
	if !strings.Contains(out, `msg="container cleanup failed" app=users container_id=`) {
		t.Errorf("the failed removal of a prepared container is not logged with its app and without a handler:\n%s", out)
	}
	// What the next worker's sweep does with it.
	sweeper := f.newRunner(t, "cleanup-sweep-"+randomHex(4), containerd.WithOrphanTimeout(time.Nanosecond))
	testutil.WaitFor(t, 20*time.Second, "the leftover swept", func() bool {
		return sweeper.Sweep(ctx) == nil && len(containerdtest.Leftovers(ctx, f.client)) == 0
	})
}
