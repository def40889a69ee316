package faults_test

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"

	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/stream/redisstream"
)

// pausedApp's handler sleeps 3 s on its first attempt, past the rule's
// 1 s timeout, then exits with the event's "code"; later attempts exit 0
// at once. retries: 0 for the timeout path, where the first attempt is
// the only one; the takeover path needs a second.
const pausedApp = `
image: ` + containerdtest.Image + `
command: ["/bin/sh", "/app/handler.sh"]
events:
  - {handler: once.run, pattern: {kind: [once]}, timeout: 1s, retries: 0}
  - {handler: twice.run, pattern: {kind: [twice]}, timeout: 1s, retries: 1}
`

const pausedAppHandler = `#!/bin/sh
event=$(cat)
echo "FAULTS-START $RELAY_MESSAGE_ID $RELAY_ATTEMPT"
[ "$RELAY_ATTEMPT" -gt 1 ] && exit 0
sleep 3
exit $(echo "$event" | sed -n 's/.*"code":\([0-9]*\).*/\1/p')
`

// TestPausedWorkerOwnExit: a worker stopped (SIGSTOP) while its handler
// runs, past the rule's timeout, finds on SIGCONT that the handler exited
// by itself, and reports that exit, not a timeout (docs/delivery.md
// "Leases"): within the lease its outcome is recorded (exit 0 with
// retries 0: success, no DLQ entry); past it, another worker took the
// invocation over, and the resumed worker's refused outcome is logged with
// the handler's real exit. Worker processes run the real containerd
// runner, on the shared containerd in a namespace of the test's own.
func TestPausedWorkerOwnExit(t *testing.T) {
	cc := containerdtest.Client(t)
	rc := redistest.Client(t)
	appsRoot := writeSoakApp(t, pausedApp, pausedAppHandler)
	helper := buildExecHelper(t)
	env := func(streamName string) []string {
		return []string{envRedis + "=" + redistest.Addr(t), envStream + "=" + streamName, envApps + "=" + appsRoot,
			envRunner + "=containerd", envSocket + "=" + os.Getenv(containerdtest.EnvAddress),
			envNamespace + "=" + cc.DefaultNamespace(), envHelper + "=" + helper}
	}
	// Each path has a stream of its own; they run one after the other, as
	// both count the namespace's running tasks.
	setup := func(t *testing.T) (*soak, *redisstream.Source) {
		streamName := redistest.Name(t, "paused")
		src := redisstream.New(rc, streamName, soakGroup, "publisher")
		if err := src.EnsureGroup(t.Context()); err != nil {
			t.Fatal(err)
		}
		return newSoak(t, env(streamName)...), src
	}

	t.Run("timeout", func(t *testing.T) {
		s, src := setup(t)
		s.startWorkers("a")
		id := publish(t, rc, src, `{"kind":"once","code":0}`)
		pauseWhileHandlerRuns(t, s, cc, "a", nil)
		testutil.WaitFor(t, 30*time.Second, "the message acknowledged", func() bool { return pending(t, src) == 0 })
		line := logLine(t, s, id, "invocation ")
		if !strings.Contains(line, `msg="invocation succeeded"`) {
			t.Errorf("the handler exited 0 while its worker was stopped; logged as:\n%s", line)
		}
		if n := dlqLen(t, src); n != 0 {
			t.Errorf("%d DLQ entries for a handler that exited 0", n)
		}
		s.stopAll()
		sweepAs(t, cc, "a")
	})

	t.Run("lease taken over", func(t *testing.T) {
		for _, code := range []int{0, 1} {
			s, src := setup(t)
			s.startWorkers("a")
			id := publish(t, rc, src, fmt.Sprintf(`{"kind":"twice","code":%d}`, code))
			// Past the lease (1 s timeout + 3 s grace) another worker
			// counts the stopped attempt as lost and runs the second; once b
			// acknowledged the message, a's late outcome is refused.
			pauseWhileHandlerRuns(t, s, cc, "a", func() {
				s.startWorkers("b")
				testutil.WaitFor(t, time.Minute, "worker b finishing the invocation", func() bool {
					return s.countLogLines(`msg="invocation succeeded" stream=`+src.Stream()+` message_id=`+id) == 1
				})
			})
			line := logLine(t, s, id, "no longer pending in the consumer group")
			want := regexp.MustCompile(fmt.Sprintf(`attempt=1 .*exit_code=%d error="handler exited with code %d`, code, code))
			if code == 0 {
				want = regexp.MustCompile(`attempt=1 duration=\S+ op=finish error=.* handler_result=success`)
			}
			if strings.Contains(line, "timed out") || !want.MatchString(line) {
				t.Errorf("worker a's attempt exited %d by itself while a was stopped; its refused outcome is logged as:\n%s\nwant it to match %s", code, line, want)
			}
			if n := dlqLen(t, src); n != 0 {
				t.Errorf("%d DLQ entries for a handler that succeeded on its second attempt", n)
			}
			s.stopAll()
			sweepAs(t, cc, "a", "b")
		}
	})
}

// pauseWhileHandlerRuns stops worker name with SIGSTOP once its handler
// has run for a moment, calls during (if not nil) while it is stopped,
// waits for the handler to exit by itself and well past its 1 s timeout,
// and continues the worker.
func pauseWhileHandlerRuns(t *testing.T, s *soak, cc *client.Client, name string, during func()) {
	t.Helper()
	var id string
	testutil.WaitFor(t, 30*time.Second, "the handler running", func() bool {
		list, err := cc.TaskService().List(t.Context(), nil)
		if err != nil {
			return false
		}
		i := slices.IndexFunc(list.Tasks, func(p *task.Process) bool { return p.Status == task.Status_RUNNING })
		if i >= 0 {
			id = list.Tasks[i].ID
		}
		return i >= 0
	})
	time.Sleep(300 * time.Millisecond) // past the start of the worker's timer
	w := s.procs.Proc(name)
	testutil.StopProcess(t, w.Pid())
	stopped := time.Now()
	t.Cleanup(func() { _ = w.Cmd.Process.Signal(syscall.SIGCONT) })
	if during != nil {
		during()
	}
	testutil.WaitFor(t, 30*time.Second, "the handler exited", func() bool {
		list, err := cc.TaskService().List(t.Context(), nil)
		return err == nil && !slices.ContainsFunc(list.Tasks, func(p *task.Process) bool {
			return p.ID == id && p.Status == task.Status_RUNNING
		})
	})
	time.Sleep(time.Until(stopped.Add(2 * time.Second)))
	if err := w.Cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
}

// sweepAs removes what the stopped workers names left in cc's namespace
// (prepared containers: a worker process does not close its runner), as
// their next start would.
func sweepAs(t *testing.T, cc *client.Client, names ...string) {
	t.Helper()
	for _, n := range names {
		// No grace: a container whose task the stopped worker was removing
		// is a leftover too.
		r, err := ctrd.New(cc, ctrd.WithNamespace(cc.DefaultNamespace()), ctrd.WithHostID("faults/"+n),
			ctrd.WithTaskCreationGrace(0), ctrd.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Sweep(t.Context()); err != nil {
			t.Error(err)
		}
		if err := r.Close(t.Context()); err != nil {
			t.Error(err)
		}
	}
}

// logLine waits for the workers' log line about message id that contains
// text and returns it.
func logLine(t *testing.T, s *soak, id, text string) string {
	t.Helper()
	var line string
	testutil.WaitFor(t, 30*time.Second, "a log line with "+text, func() bool {
		for _, path := range s.procs.Logs() {
			b, _ := os.ReadFile(path)
			for l := range strings.Lines(string(b)) {
				if strings.Contains(l, "message_id="+id) && strings.Contains(l, text) {
					line = l
					return true
				}
			}
		}
		return false
	})
	return line
}

// pending is the number of src's group's pending entries.
func pending(t *testing.T, src *redisstream.Source) int64 {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	n, _, err := src.Pending(ctx)
	if err != nil {
		return -1
	}
	return n
}

// dlqLen is the length of src's stream's DLQ.
func dlqLen(t *testing.T, src *redisstream.Source) int64 {
	rc := src.Client()
	n, err := rc.Do(t.Context(), rc.B().Xlen().Key(redisdlq.NewWriter(rc, src.Stream()).Key()).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}
