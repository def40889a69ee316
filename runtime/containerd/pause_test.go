package containerd_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/api/services/tasks/v1"
	"github.com/containerd/containerd/api/types/task"
	"github.com/containerd/containerd/v2/client"
	"google.golang.org/grpc"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// envPausedChild makes the test binary a worker that runs one attempt and
// prints its outcome, while the test stops and continues it
// (TestPausedWorker).
const envPausedChild = "RELAY_TEST_PAUSED_CHILD"

// pausedHandler sleeps for the event's first word in seconds, then exits
// with its second; pausedPython, in a warm container, sleeps as long and
// fails when the second is not 0.
const (
	pausedHandler = `read secs code; sleep "$secs"; exit "$code"`
	pausedPython  = `import time

def sleep(event):
    secs, code = event.split()
    time.sleep(int(secs))
    print("slept", secs, flush=True)
    if code != "0":
        raise ValueError("planned failure")
`
)

// pausedOutcome is what the paused child prints of its attempt.
type pausedOutcome struct {
	Err      string `json:"err"`
	Code     int    `json:"code"` // -1 without an ExitError
	TimedOut bool   `json:"timed_out"`
}

// TestPausedWorker: a worker stopped (SIGSTOP) past its handler's timeout
// while the handler runs, then continued. A handler that exited by itself
// meanwhile is reported with its own exit, as containerd recorded it, never
// as timed out: nothing stopped it (docs/delivery.md "Leases"). One still
// running when the worker resumes has outlived its timeout and is killed.
// The same for a handler in a warm container, whose reply waits in the
// pipe. The worker is a child process running a Runner, really stopped.
func TestPausedWorker(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		prepared bool // the attempt takes a container whose task was created ahead
		warm     bool // the attempt runs pausedPython in a warm container
		secs     int  // how long the handler sleeps
		code     int  // and its exit code
		want     pausedOutcome
	}{
		{name: "exits 0 while paused", secs: 2, code: 0, want: pausedOutcome{Code: -1}},
		{name: "exits 3 while paused, task created ahead", prepared: true, secs: 2, code: 3, want: pausedOutcome{Code: 3}},
		{name: "runs on after the pause", secs: 60, code: 0, want: pausedOutcome{Code: 137, TimedOut: true}},
		{name: "warm, returns while paused", warm: true, secs: 2, code: 0, want: pausedOutcome{Code: -1}},
		{name: "warm, raises while paused", warm: true, secs: 2, code: 1, want: pausedOutcome{Code: runtime.ExitHandlerFailed}},
		{name: "warm, runs on after the pause", warm: true, secs: 60, code: 0, want: pausedOutcome{Code: 137, TimedOut: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := runPaused(t, tc.prepared, tc.warm, tc.secs, tc.code)
			got.Err = ""
			if got != tc.want {
				t.Errorf("outcome %+v, want %+v", got, tc.want)
			}
		})
	}
}

// pausedTimeout is the timeout of the paused child's attempt.
const pausedTimeout = time.Second

// runPaused runs a child worker whose attempt's handler sleeps secs and
// exits with code, stops the child once the handler runs, continues it
// once the handler has exited (or, for a handler still running, once its
// timeout is well past), and returns the outcome the child reports.
func runPaused(t *testing.T, prepared, warm bool, secs, code int) pausedOutcome {
	var c *client.Client
	var dir string
	if warm {
		f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": pausedPython})
		c, dir = f.client, f.app
	} else {
		f := newFixture(t)
		c, dir = f.client, f.dir
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envPausedChild+"=1", "CHILD_NS="+c.DefaultNamespace(),
		"CHILD_HOST=paused-"+randomHex(4), "CHILD_DIR="+dir, "CHILD_HELPER="+testExecHelper,
		"CHILD_STATE="+t.TempDir(), "CHILD_PREPARED="+strconv.FormatBool(prepared), "CHILD_WARM="+strconv.FormatBool(warm),
		fmt.Sprintf("CHILD_EVENT=%d %d\n", secs, code))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// The child closes its Runner and exits after its report.
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("child: %v", err)
			}
		case <-time.After(time.Minute):
			cmd.Process.Kill()
			t.Error("the child did not exit after its report")
		}
		containerdtest.AssertClean(t, c)
	})
	lines := bufio.NewReader(stdout)
	if line, err := lines.ReadString('\n'); strings.TrimSpace(line) != "ready" {
		t.Fatalf("child: %q, %v", line, err)
	}
	var id string
	if !warm {
		testutil.WaitFor(t, 20*time.Second, "the handler running", func() bool {
			id = runningTask(t, c)
			return id != ""
		})
	}
	// Past the start of the child's timer, which follows the start of the
	// task or the request to the warm container.
	time.Sleep(300 * time.Millisecond)
	testutil.StopProcess(t, cmd.Process.Pid)
	stopped := time.Now()
	switch {
	case secs >= 10:
	case warm:
		// The warm container's process outlives the handler.
		time.Sleep(time.Duration(secs)*time.Second + 500*time.Millisecond)
	default:
		testutil.WaitFor(t, 20*time.Second, "the handler exited", func() bool {
			st, err := c.TaskService().Get(t.Context(), &tasks.GetRequest{ContainerID: id})
			return err == nil && st.Process.Status == task.Status_STOPPED
		})
	}
	// Well past the timeout: the child's timer has fired when it resumes.
	time.Sleep(time.Until(stopped.Add(pausedTimeout + 500*time.Millisecond)))
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	line, rerr := lines.ReadString('\n')
	var out pausedOutcome
	if err := json.Unmarshal([]byte(line), &out); err != nil {
		t.Fatalf("child's outcome %q: %v (read: %v)", line, err, rerr)
	}
	t.Logf("outcome: %+v", out)
	return out
}

// runningTask returns the ID of a running task in c's namespace, or "".
func runningTask(t *testing.T, c *client.Client) string {
	list, err := c.TaskService().List(t.Context(), nil)
	if err != nil {
		return ""
	}
	i := slices.IndexFunc(list.Tasks, func(p *task.Process) bool { return p.Status == task.Status_RUNNING })
	if i < 0 {
		return ""
	}
	return list.Tasks[i].ID
}

// pausedChild runs one attempt of pausedHandler with the event CHILD_EVENT
// and a timeout of pausedTimeout, after a first attempt that leaves a
// container with its task created ahead when CHILD_PREPARED is true; with
// CHILD_WARM true, of pausedPython in a warm container that a first
// attempt started. It prints "ready" before the attempt, and the attempt's
// pausedOutcome.
func pausedChild() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "paused child:", err)
		os.Exit(1)
	}
	ns := os.Getenv("CHILD_NS")
	// containerd's report of the exit reaches the resumed worker after its
	// timer has fired, as it does in a busy worker (relay start: 3 times
	// of 4), rather than by chance.
	lateExit := grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if strings.HasSuffix(method, "/Wait") {
			time.Sleep(300 * time.Millisecond)
		}
		return err
	})
	c, err := client.New(os.Getenv(containerdtest.EnvAddress), client.WithDefaultNamespace(ns),
		client.WithExtraDialOpts([]grpc.DialOption{lateExit}))
	if err != nil {
		fail(err)
	}
	prepared := os.Getenv("CHILD_PREPARED") == "true"
	var output io.Writer = io.Discard
	if os.Getenv("CHILD_WARM") == "true" {
		// The warm container's reply comes after the handler's last line,
		// which a slow output destination holds up once the worker
		// resumes: after the timer has fired, rather than by chance.
		output = slowDiscard{}
	}
	n := 0
	if prepared {
		n = 1
	}
	r, err := containerd.New(c, containerd.WithNamespace(ns), containerd.WithHostID(os.Getenv("CHILD_HOST")),
		containerd.WithExecHelper(os.Getenv("CHILD_HELPER")), containerd.WithPreparedContainers(n),
		containerd.WithPull(false), containerd.WithOutput(output, output), containerd.WithStateDir(os.Getenv("CHILD_STATE")))
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	req := runtime.Request{App: "users", Handler: "paused.sleep", MessageID: "1-0", Attempt: 1, Timeout: pausedTimeout,
		Event: []byte("0 0\n"),
		Spec:  runtime.Spec{Dir: os.Getenv("CHILD_DIR"), Image: containerdtest.Image, Command: []string{"/bin/sh", "-c", pausedHandler}}}
	if os.Getenv("CHILD_WARM") == "true" {
		// The warm container started by a first attempt serves the next.
		req.Handler, req.Event = "handlers.sleep", []byte(`"0 0"`)
		req.Spec = runtime.Spec{Dir: os.Getenv("CHILD_DIR"), Runtime: runtime.RuntimePython3, Image: pythonImage, Warm: true}
		req.Timeout = time.Minute
		if _, err := r.Run(ctx, req); err != nil {
			fail(err)
		}
		req.Timeout = pausedTimeout
	}
	if prepared {
		if _, err := r.Run(ctx, req); err != nil {
			fail(err)
		}
		for containerd.PreparedReady(r, req.App) == 0 {
			time.Sleep(20 * time.Millisecond)
		}
	}
	fmt.Println("ready")
	req.Event = []byte(os.Getenv("CHILD_EVENT"))
	if req.Spec.Warm {
		req.Event, _ = json.Marshal(strings.TrimSpace(os.Getenv("CHILD_EVENT")))
	}
	_, err = r.Run(ctx, req)
	out := pausedOutcome{Code: -1}
	if err != nil {
		out.Err = err.Error()
	}
	if ee, ok := errors.AsType[*runtime.ExitError](err); ok {
		out.Code, out.TimedOut = ee.Code, ee.TimedOut
	}
	b, _ := json.Marshal(out)
	fmt.Println(string(b))
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	// Close waits for the attempt's container's removal.
	if err := r.Close(cctx); err != nil {
		fail(err)
	}
}

// slowDiscard is an output destination that takes 300 ms per line.
type slowDiscard struct{}

func (slowDiscard) Write(p []byte) (int, error) {
	time.Sleep(300 * time.Millisecond)
	return len(p), nil
}
