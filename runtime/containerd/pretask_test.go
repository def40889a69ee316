package containerd_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/defaults"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// testExecHelper is relay-exec (cmd/relay-exec), built for the tests by
// TestMain; the tests' Runners use it unless they say otherwise.
var testExecHelper string

// envChild makes the test binary a worker that prepares containers with
// tasks and waits to be killed (TestPreTasksOfAKilledWorker).
const envChild = "RELAY_TEST_PRETASK_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envChild) != "" {
		childWorker()
		return
	}
	if os.Getenv(envPausedChild) != "" {
		pausedChild()
		return
	}
	dir, err := os.MkdirTemp("", "relay-exec-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	testExecHelper = filepath.Join(dir, containerd.ExecHelperName)
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(goruntime.GOROOT(), "bin", "go")
	}
	build := exec.Command(goTool, "build", "-o", testExecHelper, "github.com/relaydev/relay/cmd/relay-exec")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build relay-exec: %v\n%s", err, out)
		os.Exit(2)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// preTaskScript reports what an attempt sees: whether the helper is
// mounted (only in containers whose task was created ahead), its PID and
// command line, its environment and event, and anything an earlier
// attempt left.
const preTaskScript = `[ -e /tmp/mark ] && echo "reused /tmp"
[ -e /.relay/exec ] && echo "helper mounted"
echo "pid=$$ cmdline=$(tr '\0' ' ' </proc/1/cmdline)"
echo "id=$RELAY_MESSAGE_ID attempt=$RELAY_ATTEMPT handler=$RELAY_HANDLER trace=$TRACEPARENT greeting=$GREETING event=$(cat)"
touch /tmp/mark
exit 0
`

// preparedTasks returns the status of the task of each prepared container
// not taken yet ("" for one without a task).
func preparedTasks(t testing.TB, c *client.Client) map[string]client.ProcessStatus {
	t.Helper()
	m := map[string]client.ProcessStatus{}
	conts, err := c.Containers(t.Context(), fmt.Sprintf("labels.%q==true", containerd.LabelPrepared))
	if err != nil {
		t.Fatal(err)
	}
	for _, ct := range conts {
		m[ct.ID()] = ""
		if task, err := ct.Task(t.Context(), nil); err == nil {
			if st, err := task.Status(t.Context()); err == nil {
				m[ct.ID()] = st.Status
			}
		}
	}
	return m
}

// waitPreTasks waits for n prepared containers, each with its task created
// and not started, and, when r is not nil, all ready to be taken from r
// for the app "users".
func waitPreTasks(t testing.TB, r *containerd.Runner, c *client.Client, n int) map[string]client.ProcessStatus {
	t.Helper()
	var m map[string]client.ProcessStatus
	testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("%d prepared containers with created tasks", n), func() bool {
		m = preparedTasks(t, c)
		for _, st := range m {
			if st != client.Created {
				return false
			}
		}
		return len(m) == n && (r == nil || containerd.PreparedReady(r, "users") == n)
	})
	return m
}

// TestPreTaskEnvMatchesOnDemand: a handler started through a task created
// ahead sees exactly the environment a handler in a container created for
// its attempt sees, HOME (which runc adds from the user's passwd entry)
// included.
func TestPreTaskEnvMatchesOnDemand(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("jobs.env")
	req.Spec.Command = []string{"/bin/sh", "-c", "cat >/dev/null; env | sort"}
	run := func(r *containerd.Runner) string {
		t.Helper()
		f.stdout.Reset()
		if _, err := r.Run(t.Context(), req); err != nil {
			t.Fatalf("%v\nstderr: %s", err, f.stderr.String())
		}
		return f.stdout.String()
	}
	onDemand := run(f.runner) // WithPreparedContainers(0)
	r := f.newRunner(t, "pretask-"+randomHex(4), containerd.WithPreparedContainers(1))
	run(r)
	waitPreTasks(t, r, f.client, 1)
	ahead := run(r)
	if !strings.Contains(onDemand, "HOME=") {
		t.Fatalf("no HOME on demand:\n%s", onDemand)
	}
	if ahead != onDemand {
		t.Errorf("environment through a task created ahead:\n%s\nwant, as on demand:\n%s", ahead, onDemand)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// TestPreTask: attempts that take a container whose task was created ahead
// of demand each get their own environment, stdin and fresh /tmp, with the
// handler as PID 1, and report failures as before.
func TestPreTask(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	if err := os.WriteFile(filepath.Join(f.dir, "pre.sh"), []byte(preTaskScript), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.newRunner(t, "pretask-"+randomHex(4), containerd.WithPreparedContainers(2))
	req := f.request("jobs.run")
	req.Spec.Command = []string{"/bin/sh", "/app/pre.sh"}
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		before := waitPreTasks(t, r, f.client, 2)
		req.MessageID, req.Attempt = fmt.Sprintf("1700000000001-%d", i), i+1
		req.Env = map[string]string{"TRACEPARENT": fmt.Sprintf("00-trace-%d-01", i)}
		req.Event = fmt.Appendf(nil, `{"n":%d}`, i)
		f.stdout.Reset()
		if _, err := r.Run(t.Context(), req); err != nil {
			t.Fatalf("run %d: %v\nstderr: %s", i, err, f.stderr.String())
		}
		out := f.stdout.String()
		for _, want := range []string{
			"helper mounted",
			"pid=1 cmdline=/bin/sh /app/pre.sh ",
			fmt.Sprintf(`id=%s attempt=%d handler=jobs.run trace=00-trace-%d-01 greeting=hello event={"n":%d}`, req.MessageID, i+1, i, i),
		} {
			if !strings.Contains(out, want) {
				t.Errorf("run %d: stdout lacks %q:\n%s", i, want, out)
			}
		}
		if strings.Contains(out, "reused") {
			t.Errorf("run %d: /tmp of an earlier attempt:\n%s", i, out)
		}
		after := preparedTasks(t, f.client)
		taken := 0
		for id := range before {
			if _, ok := after[id]; !ok {
				taken++
			}
		}
		if taken != 1 || len(after) > 2 {
			t.Errorf("run %d: took %d of the prepared containers %v, %d prepared now (bound 2)", i, taken, before, len(after))
		}
	}

	// A failure, a timeout and a cancellation, as in any container.
	waitPreTasks(t, r, f.client, 2)
	fail := req
	fail.Handler = "jobs.fail"
	fail.Spec.Command = []string{"/bin/sh", "-c", `echo "cannot bill" >&2; exit 3`}
	// A Spec of its own: a generation of its own. Run twice, the second
	// in a container prepared with a task.
	for i := range 2 {
		_, err := r.Run(t.Context(), fail)
		if ee, ok := errors.AsType[*runtime.ExitError](err); !ok || ee.Code != 3 || ee.Stderr != "cannot bill" {
			t.Errorf("failing handler, run %d: got %v, want exit 3 with stderr \"cannot bill\"", i, err)
		}
		waitPreTasks(t, r, f.client, 2)
	}
	hang := req
	hang.Spec.Command = []string{"/bin/sh", "-c", "exec sleep 600"}
	hang.Timeout = time.Second
	for i := range 2 {
		_, err := r.Run(t.Context(), hang)
		if ee, ok := errors.AsType[*runtime.ExitError](err); !ok || !ee.TimedOut {
			t.Errorf("hanging handler, run %d: got %v, want a timeout", i, err)
		}
		waitPreTasks(t, r, f.client, 2)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	hang.Timeout = time.Minute
	if _, err := r.Run(ctx, hang); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("cancelled handler: got %v, want the context's error", err)
	}

	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestPreTaskExecErrors: a command that cannot be executed gives the same
// exit code in a container whose task was created ahead as in one created
// on demand (the first run of each Spec), with a line naming it.
func TestPreTaskExecErrors(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.newRunner(t, "pretask-exec-"+randomHex(4), containerd.WithPreparedContainers(1))
	for _, c := range []struct {
		command []string
		code    int
	}{
		{[]string{"/bin/does-not-exist"}, 127},
		{[]string{"does-not-exist"}, 127},
		{[]string{"/app/handler.sh"}, 126}, // not executable
	} {
		req := f.request("events.created")
		req.Spec.Command = c.command
		_, err := r.Run(t.Context(), req)
		onDemand, ok := errors.AsType[*runtime.ExitError](err)
		if !ok || onDemand.Code != c.code {
			t.Fatalf("%v on demand: got %v, want exit %d", c.command, err, c.code)
		}
		waitPreTasks(t, r, f.client, 1)
		_, err = r.Run(t.Context(), req)
		ee, ok := errors.AsType[*runtime.ExitError](err)
		if !ok || ee.Code != c.code || !strings.Contains(ee.Stderr, c.command[0]) {
			t.Errorf("%v in a task created ahead: got %v, want exit %d naming the command", c.command, err, c.code)
		}
		t.Logf("%v: on demand %v; created ahead %v", c.command, onDemand, err)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestPreTaskSecrets: a container whose task was created ahead sees the
// attempt's secrets, as TestSecretsMounted asserts for one created on
// demand, a rotated secret at the next attempt, and no copy is left.
func TestPreTaskSecrets(t *testing.T) {
	f := newFixture(t)
	secrets := t.TempDir()
	const v1, v2 = "pretask-secret-one", "pretask-secret-two"
	write := func(name, v string) {
		if err := os.WriteFile(filepath.Join(secrets, name), []byte(v), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("db-password", v1)
	write("other-app-key", "not-for-this-app")
	script := "[ -e /.relay/exec ] && echo helper-mounted\n" + secretScript
	if err := os.WriteFile(filepath.Join(f.dir, "secret.sh"), []byte(script), 0o644); err != nil {
		t.Fatal(err)
	}
	r := f.newRunner(t, "pretask-secrets-"+randomHex(4), containerd.WithSecretsDir(secrets), containerd.WithPreparedContainers(1))
	req := f.request("secret.check")
	req.Spec.Command = []string{"/bin/sh", "/app/secret.sh"}
	req.Spec.Secrets = []string{"db-password"}
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	for i, v := range []string{v1, v2} {
		write("db-password", v)
		waitPreTasks(t, r, f.client, 1)
		f.stdout.Reset()
		if _, err := r.Run(t.Context(), req); err != nil {
			t.Fatalf("run %d: %v\nstderr: %s", i, err, f.stderr.String())
		}
		out := f.stdout.String()
		for _, want := range []string{"helper-mounted", "sum=" + sum(v), "mode=400 owner=65534", "db-password \n"} {
			if !strings.Contains(out, want) {
				t.Errorf("run %d: output lacks %q:\n%s", i, want, out)
			}
		}
		for _, bad := range []string{"secret-writable", "secrets-dir-writable", "secret-in-env", "other-app-key"} {
			if strings.Contains(out, bad) {
				t.Errorf("run %d: output has %q:\n%s", i, bad, out)
			}
		}
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
	left, _ := filepath.Glob(filepath.Join(os.TempDir(), "relay-secrets-*", "s", "db-password"))
	for _, p := range left {
		if b, _ := os.ReadFile(p); string(b) == v1 || string(b) == v2 {
			t.Errorf("staged secret left at %s", p)
		}
	}
}

// TestPreTaskFallback: without a usable helper (here a dynamically linked
// executable) the Runner says why once and prepares containers without
// tasks, which serve as before.
func TestPreTaskFallback(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	dynamic, err := exec.LookPath("sh")
	if err != nil {
		t.Skip(err)
	}
	var logs bytes.Buffer
	r := f.newRunner(t, "pretask-fallback-"+randomHex(4), containerd.WithPreparedContainers(1),
		containerd.WithExecHelper(dynamic), containerd.WithLogger(slog.New(slog.NewTextHandler(syncWriter(&logs), nil))))
	if n := strings.Count(logs.String(), "exec helper cannot be used"); n != 1 || !strings.Contains(logs.String(), "dynamically linked") {
		t.Errorf("log %q: want one line saying the helper cannot be used and why", logs.String())
	}
	req := f.request("events.created")
	for i := range 2 {
		f.stdout.Reset()
		if _, err := r.Run(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(f.stdout.String(), "welcome {\"id\":42}") {
			t.Errorf("run %d: stdout %q", i, f.stdout.String())
		}
		var m map[string]client.ProcessStatus
		testutil.WaitFor(t, 20*time.Second, "a prepared container", func() bool {
			m = preparedTasks(t, f.client)
			return len(m) == 1
		})
		for id, st := range m {
			if st != "" {
				t.Errorf("prepared container %s has a task (%s) without a helper", id, st)
			}
		}
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestPreTaskHelperCopyRemoved: a copy of the exec helper removed behind
// the Runner's back (a cleaned state directory) is written again, so
// prepared containers keep getting their tasks, without a warning per
// container.
func TestPreTaskHelperCopyRemoved(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	state := t.TempDir()
	var logs bytes.Buffer
	r := f.newRunner(t, "pretask-"+randomHex(4), containerd.WithPreparedContainers(1), containerd.WithStateDir(state),
		containerd.WithLogger(slog.New(slog.NewTextHandler(syncWriter(&logs), nil))))
	copies, err := filepath.Glob(filepath.Join(state, "bin", containerd.ExecHelperName+"-*"))
	if err != nil || len(copies) != 1 {
		t.Fatalf("copies of the helper in the state directory: %v, %v", copies, err)
	}
	req := f.request("events.created")
	for i := range 3 {
		if err := os.Remove(copies[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Run(t.Context(), req); err != nil {
			t.Fatalf("run %d: %v", i, err)
		}
		waitPreTasks(t, r, f.client, 1)
	}
	if strings.Contains(logs.String(), "preparing a container failed") || strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("warnings after the helper's copy was removed:\n%s", logs.String())
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// fifosOf lists the FIFOs containerd's client made for container id.
func fifosOf(id string) []string {
	m, _ := filepath.Glob(filepath.Join(defaults.DefaultFIFODir, "*", id+"-*"))
	return m
}

// TestPreTasksOfAKilledWorker: a worker SIGKILLed while it holds
// containers with created tasks leaves them, and their FIFOs, to the next
// sweep, which removes them all.
func TestPreTasksOfAKilledWorker(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	host := "pretask-killed-" + randomHex(4)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envChild+"=1", "CHILD_NS="+f.client.DefaultNamespace(),
		"CHILD_HOST="+host, "CHILD_DIR="+f.dir, "CHILD_HELPER="+testExecHelper, "CHILD_IMAGE="+containerdtest.Image)
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("worker: %q, %v", line, err)
	}
	ids := waitPreTasks(t, nil, f.client, 2)
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	for id := range ids {
		if len(fifosOf(id)) == 0 {
			t.Errorf("no FIFOs of %s after the kill: the test does not test the FIFOs' removal", id)
		}
	}
	sweeper := f.newRunner(t, host)
	if err := sweeper.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
	for id := range ids {
		if left := fifosOf(id); len(left) > 0 {
			t.Errorf("FIFOs left after the sweep: %v", left)
		}
	}
	if err := sweeper.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
}

// childWorker runs one attempt with two prepared containers, says "ready"
// once their tasks exist and waits to be killed.
func childWorker() {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "child worker:", err)
		os.Exit(1)
	}
	ns := os.Getenv("CHILD_NS")
	c, err := client.New(os.Getenv(containerdtest.EnvAddress), client.WithDefaultNamespace(ns))
	if err != nil {
		fail(err)
	}
	r, err := containerd.New(c, containerd.WithNamespace(ns), containerd.WithHostID(os.Getenv("CHILD_HOST")),
		containerd.WithExecHelper(os.Getenv("CHILD_HELPER")), containerd.WithPreparedContainers(2),
		containerd.WithPull(false), containerd.WithOutput(io.Discard, io.Discard))
	if err != nil {
		fail(err)
	}
	req := runtime.Request{App: "users", Handler: "events.created", MessageID: "1-0", Attempt: 1, Timeout: 20 * time.Second,
		Spec: runtime.Spec{Dir: os.Getenv("CHILD_DIR"), Image: os.Getenv("CHILD_IMAGE"), Command: []string{"/bin/true"}}}
	if _, err := r.Run(context.Background(), req); err != nil {
		fail(err)
	}
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		conts, err := c.Containers(context.Background(), fmt.Sprintf("labels.%q==true", containerd.LabelPrepared))
		if err != nil {
			fail(err)
		}
		n := 0
		for _, ct := range conts {
			if _, err := ct.Task(context.Background(), nil); err == nil {
				n++
			}
		}
		if n == 2 {
			fmt.Println("ready")
			select {}
		}
	}
	fail(errors.New("no two prepared containers with tasks"))
}

// TestPreTaskOOMKill: a handler killed at its memory limit in a container
// whose task was created ahead is reported as in one created on demand.
func TestPreTaskOOMKill(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.newRunner(t, "pretask-oom-"+randomHex(4), containerd.WithPreparedContainers(1))
	req := f.request("x")
	req.Spec.MemoryBytes = 32 << 20
	req.Spec.TmpBytes = req.Spec.MemoryBytes
	req.Spec.Command = []string{"/bin/sh", "-c", "[ -e /.relay/exec ] && echo helper-mounted; head -c 64000000 /dev/zero >/tmp/fill; echo survived"}
	for i := range 2 {
		f.stdout.Reset()
		_, err := r.Run(t.Context(), req)
		ee := exitCode(t, err, 137)
		if !ee.OOMKilled || ee.MemoryLimit != 32<<20 {
			t.Errorf("run %d: OOM kill reported as %q (%+v)", i, err, ee)
		}
		if i == 0 {
			waitPreTasks(t, r, f.client, 1)
		} else if !strings.Contains(f.stdout.String(), "helper-mounted") {
			t.Errorf("run %d did not take the container with a task: %q", i, f.stdout.String())
		}
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestPreTaskContainerdRestart: as TestContainerdRestartMidHandler, for a
// handler in a container whose task was created ahead: the runner waits
// for it again after containerd restarted and reports its outcome with its
// output.
func TestPreTaskContainerdRestart(t *testing.T) {
	d := containerdtest.Private(t)
	f := newFixture(t)
	r := f.newRunner(t, "pretask-restart-"+randomHex(4), containerd.WithPreparedContainers(1))
	req := f.request("events.created")
	req.Spec.Command = []string{"/bin/sh", "-c", `[ -e /.relay/exec ] && echo helper-mounted; [ "$(cat)" = '{"id":42}' ] || exit 5; sleep 3; echo "finished $RELAY_ATTEMPT"`}
	req.Timeout = time.Minute
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatal(err)
	}
	waitPreTasks(t, r, f.client, 1)
	f.stdout.Reset()
	done := runInBackground(t, r, req)
	ctx := t.Context()
	restartMidRun(t, f.client, d, done)
	if out := f.stdout.String(); !strings.Contains(out, "helper-mounted") || !strings.Contains(out, "finished 3") {
		t.Errorf("the handler's output after the restart is lost: %q", out)
	}
	if err := r.Close(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "nothing left behind", func() bool {
		return r.Sweep(ctx) == nil && len(containerdtest.Leftovers(ctx, f.client)) == 0
	})
}

// TestPreTaskStdin: as TestRunStdin, in containers whose task was created
// ahead: a handler reads a whole 1 MiB event after the header, and one that
// exits without reading it does not hold up Run.
func TestPreTaskStdin(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	r := f.newRunner(t, "pretask-stdin-"+randomHex(4), containerd.WithPreparedContainers(2))
	req := f.request("count.stdin")
	req.Event = bytes.Repeat([]byte("x"), 1<<20)
	for i := range 3 {
		f.stdout.Reset()
		if _, err := r.Run(t.Context(), req); err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(strings.TrimPrefix(f.stdout.String(), "[users/count.stdin] ")); got != "1048576" {
			t.Errorf("run %d: handler read %s bytes, want 1048576", i, got)
		}
		waitPreTasks(t, r, f.client, 2)
	}
	exit := f.request("exit.now")
	exit.Event = req.Event // more than a pipe holds
	for i := range 4 {
		if _, err := r.Run(t.Context(), exit); err != nil {
			t.Fatal(err)
		}
		if i == 0 {
			waitPreTasks(t, r, f.client, 2)
		}
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}
