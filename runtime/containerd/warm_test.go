package containerd_test

import (
	"context"
	"errors"
	"io"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// Each handler prints the container's instance (random per process) and
// how many invocations the process served: equal instances mean the same
// warm container.
const warmPython = `import os, sys, time

INSTANCE = os.urandom(6).hex()
served = 0

def count(event):
    global served
    served += 1
    print("instance", INSTANCE, "served", served)
    print("env", os.environ.get("LEAK"), os.environ.get("TRACEPARENT"), os.environ["RELAY_MESSAGE_ID"],
          os.environ["RELAY_ATTEMPT"], os.environ.get("GREETING"))
    os.environ["LEAK"] = "from an earlier invocation"

def fails(event):
    raise ValueError("cannot handle %d" % event["id"])

def forge(event):
    # A line shaped like an outcome frame, then a partial line: neither may
    # be taken for the frame, and the handler's failure must stand.
    print('relay-frame-00000000000000000000000000000000 {"code": 0}')
    sys.stdout.write("no newline")
    sys.stderr.write("err without newline")
    raise RuntimeError("forged")

def exits(event):
    sys.exit(3)

def crash(event):
    print("crashing")
    os._exit(5)

def slow(event):
    print("sleeping")
    time.sleep(60)

def stdin(event):
    print("stdin", repr(sys.stdin.read()))
`

type warmFixture struct {
	*runtimeFixture
	runner *containerd.Runner
}

func newWarmFixture(t testing.TB, rt, env, ref string, files map[string]string, opts ...containerd.Option) *warmFixture {
	t.Helper()
	w := &warmFixture{runtimeFixture: newRuntimeFixture(t, rt, env, ref, files)}
	w.runner = w.newRunner(t, "test-"+randomHex(4), opts...)
	t.Cleanup(func() { w.runner.Close(context.Background()) })
	return w
}

func (f *warmFixture) newRunner(t testing.TB, hostID string, opts ...containerd.Option) *containerd.Runner {
	t.Helper()
	r, err := containerd.New(f.client, append([]containerd.Option{
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID(hostID),
		containerd.WithOutput(f.stdout, f.stderr),
		containerd.WithDefaultImages(map[string]string{f.runtime: defaultRef(f.runtime)}),
		containerd.WithStateDir(f.stateDir),
		containerd.WithPull(false),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func defaultRef(rt string) string {
	if rt == runtime.RuntimeNode {
		return nodeImage
	}
	return pythonImage
}

func (f *warmFixture) warmRequest(handler, messageID string) runtime.Request {
	req := f.request(handler)
	req.MessageID = messageID
	req.Spec.Warm = true
	req.Spec.Env = map[string]string{"GREETING": "hi"}
	return req
}

var servedRE = regexp.MustCompile(`instance (\w+) served (\d+)`)

// count runs the count handler and returns the instance and the number of
// invocations its process served, from the handler's last output line.
func (f *warmFixture) count(t testing.TB, r *containerd.Runner, req runtime.Request) (instance, served string) {
	t.Helper()
	req.Handler = "handlers.count"
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("count: %v", err)
	}
	m := servedRE.FindAllStringSubmatch(lines(f.stdout, "handlers.count"), -1)
	if len(m) == 0 {
		t.Fatalf("count printed nothing; stdout:\n%s", f.stdout)
	}
	last := m[len(m)-1]
	return last[1], last[2]
}

// warmContainers lists the warm containers in the fixture's namespace.
func warmContainers(t testing.TB, c *client.Client) []string {
	t.Helper()
	ctx := namespaces.WithNamespace(t.Context(), c.DefaultNamespace())
	conts, err := c.Containers(ctx, `labels."relay.warm"==true`)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, ct := range conts {
		ids = append(ids, ct.ID())
	}
	return ids
}

func exitCode(t *testing.T, err error, want int) *runtime.ExitError {
	t.Helper()
	ee, ok := errors.AsType[*runtime.ExitError](err)
	if !ok || ee.Code != want {
		t.Fatalf("got %v, want an ExitError with code %d", err, want)
	}
	return ee
}

// TestWarmPython runs a sequence of invocations of a python3 app through
// one warm container and checks reuse, environment reset, failures that
// keep the container, failures that replace it, and output attribution.
func TestWarmPython(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": warmPython})
	r := f.runner

	// Reuse and environment reset.
	req := f.warmRequest("handlers.count", "1-0")
	req.Env = map[string]string{"TRACEPARENT": "00-trace-1"}
	inst, served := f.count(t, r, req)
	if served != "1" {
		t.Fatalf("first invocation: served %s", served)
	}
	req = f.warmRequest("handlers.count", "2-0")
	req.Attempt = 2
	if i, s := f.count(t, r, req); i != inst || s != "2" {
		t.Fatalf("second invocation ran in %s (served %s), want the warm container %s", i, s, inst)
	}
	env := strings.Split(lines(f.stdout, "handlers.count"), "\n")
	envLines := slices.DeleteFunc(env, func(l string) bool { return !strings.HasPrefix(l, "env ") })
	want := []string{"env None 00-trace-1 1-0 1 hi", "env None None 2-0 2 hi"}
	if !slices.Equal(envLines, want) {
		t.Errorf("environments %q, want %q (LEAK and TRACEPARENT must not carry over)", envLines, want)
	}

	// A raised exception fails the invocation only.
	_, err := r.Run(t.Context(), f.warmRequest("handlers.fails", "3-0"))
	if ee := exitCode(t, err, runtime.ExitHandlerFailed); ee.Stderr != "ValueError: cannot handle 42" {
		t.Errorf("failure reason %q", ee.Stderr)
	}
	if !strings.Contains(lines(f.stderr, "handlers.fails"), `File "/app/handlers.py", line 15, in fails`) {
		t.Errorf("no traceback on stderr:\n%s", f.stderr)
	}
	// A forged frame is output like any other; the failure stands.
	_, err = r.Run(t.Context(), f.warmRequest("handlers.forge", "4-0"))
	if ee := exitCode(t, err, runtime.ExitHandlerFailed); ee.Stderr != "RuntimeError: forged" {
		t.Errorf("failure reason %q", ee.Stderr)
	}
	if out := lines(f.stdout, "handlers.forge"); out != "relay-frame-00000000000000000000000000000000 {\"code\": 0}\nno newline" {
		t.Errorf("forge stdout %q", out)
	}
	if !strings.Contains(lines(f.stderr, "handlers.forge"), "err without newline") {
		t.Errorf("forge stderr lacks its partial line:\n%s", f.stderr)
	}
	// sys.exit(n) is outcome n, as in a one-shot container.
	_, err = r.Run(t.Context(), f.warmRequest("handlers.exits", "5-0"))
	exitCode(t, err, 3)
	// The handler's stdin is empty: requests cannot be read by it.
	if _, err := r.Run(t.Context(), f.warmRequest("handlers.stdin", "6-0")); err != nil {
		t.Fatal(err)
	}
	if out := lines(f.stdout, "handlers.stdin"); out != "stdin ''" {
		t.Errorf("stdin handler printed %q", out)
	}
	if i, s := f.count(t, r, f.warmRequest("handlers.count", "7-0")); i != inst || s != "3" {
		t.Fatalf("after failures: ran in %s (served %s), want the warm container %s serving its 3rd count", i, s, inst)
	}

	// A crash fails the invocation with the process's exit code, and a new
	// container takes over.
	_, err = r.Run(t.Context(), f.warmRequest("handlers.crash", "8-0"))
	exitCode(t, err, 5)
	if lines(f.stdout, "handlers.crash") != "crashing" {
		t.Errorf("crash output lost:\n%s", f.stdout)
	}
	inst2, served := f.count(t, r, f.warmRequest("handlers.count", "9-0"))
	if inst2 == inst || served != "1" {
		t.Fatalf("after a crash: ran in %s (served %s), want a new container", inst2, served)
	}

	// A timeout kills the container: TimedOut, as for one-shot, then a new
	// container.
	slow := f.warmRequest("handlers.slow", "10-0")
	slow.Timeout = 2 * time.Second
	_, err = r.Run(t.Context(), slow)
	if ee := exitCode(t, err, 137); !ee.TimedOut || ee.Timeout != slow.Timeout {
		t.Errorf("timeout: %+v", ee)
	}
	if lines(f.stdout, "handlers.slow") != "sleeping" {
		t.Errorf("slow output lost:\n%s", f.stdout)
	}
	inst3, served := f.count(t, r, f.warmRequest("handlers.count", "11-0"))
	if inst3 == inst2 || served != "1" {
		t.Fatalf("after a timeout: ran in %s (served %s), want a new container", inst3, served)
	}
	if ids := warmContainers(t, f.client); len(ids) != 1 {
		t.Errorf("warm containers %v, want exactly one", ids)
	}

	// Cancellation kills the container and reports ctx's error.
	ctx, cancel := context.WithCancel(t.Context())
	time.AfterFunc(time.Second, cancel)
	slow.Timeout = time.Minute
	if _, err := r.Run(ctx, slow); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: got %v", err)
	}

	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
	if _, err := r.Run(t.Context(), f.warmRequest("handlers.count", "12-0")); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Run after Close: got %v, want ErrUnavailable", err)
	}
}

// TestWarmConcurrent: concurrent Runs of one app get one container each,
// and every output line is attributed to its own invocation.
func TestWarmConcurrent(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{
		"handlers.py": "import time\ndef a(event):\n    for i in range(20):\n        print('a', i)\n        time.sleep(0.01)\n" +
			"def b(event):\n    for i in range(20):\n        print('b', i)\n        time.sleep(0.01)\n",
	}, containerd.WithWarmMaxContainers(2))
	for round := range 3 {
		errs := make(chan error, 2)
		for _, h := range []string{"handlers.a", "handlers.b"} {
			go func() {
				_, err := f.runner.Run(t.Context(), f.warmRequest(h, "1-0"))
				errs <- err
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
	}
	for _, h := range []string{"a", "b"} {
		out := lines(f.stdout, "handlers."+h)
		if n := strings.Count(out, h+" "); n != 60 || strings.Count(out, "\n")+1 != 60 {
			t.Errorf("handler %s: %d lines of its own in:\n%s", h, n, out)
		}
	}
	if ids := warmContainers(t, f.client); len(ids) > 2 {
		t.Errorf("warm containers %v, want at most 2", ids)
	}
	if err := f.runner.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestWarmRecycle: a container is replaced after WithWarmMaxInvocations,
// removed after WithWarmIdleTimeout unused, and replaced when the app's
// Spec changes.
func TestWarmRecycle(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": warmPython},
		containerd.WithWarmMaxInvocations(2), containerd.WithWarmIdleTimeout(time.Second))
	r := f.runner
	req := f.warmRequest("handlers.count", "1-0")
	a, _ := f.count(t, r, req)
	if i, s := f.count(t, r, req); i != a || s != "2" {
		t.Fatalf("second invocation in %s (served %s), want %s", i, s, a)
	}
	b, s := f.count(t, r, req)
	if b == a || s != "1" {
		t.Fatalf("third invocation in %s (served %s), want a new container after 2", b, s)
	}

	// Idle reaping.
	testutil.WaitFor(t, 30*time.Second, "the idle container removed", func() bool {
		return len(containerdtest.Leftovers(t.Context(), f.client)) == 0
	})
	c, s := f.count(t, r, req)
	if c == b || s != "1" {
		t.Fatalf("after the idle timeout: ran in %s (served %s), want a new container", c, s)
	}

	// A Spec change (here the app's env) replaces the container.
	before := warmContainers(t, f.client)
	changed := f.warmRequest("handlers.count", "2-0")
	changed.Spec.Env["GREETING"] = "hello"
	d, s := f.count(t, r, changed)
	if d == c || s != "1" {
		t.Fatalf("after a spec change: ran in %s (served %s), want a new container", d, s)
	}
	if !strings.HasSuffix(lines(f.stdout, "handlers.count"), " hello") {
		t.Errorf("the new container does not see the new env:\n%s", f.stdout)
	}
	testutil.WaitFor(t, 30*time.Second, "the old container removed", func() bool {
		after := warmContainers(t, f.client)
		return len(after) == 1 && !slices.Contains(before, after[0])
	})
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestWarmSweep: Sweep spares the Runner's own warm containers and removes
// those of a Runner that went away without Close (a crashed worker).
func TestWarmSweep(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": warmPython})
	host := "test-" + randomHex(4)
	crashed := f.newRunner(t, host)
	req := f.warmRequest("handlers.count", "1-0")
	a, _ := f.count(t, crashed, req)
	if err := crashed.Sweep(t.Context()); err != nil {
		t.Fatal(err)
	}
	if i, s := f.count(t, crashed, req); i != a || s != "2" {
		t.Fatalf("after Sweep: ran in %s (served %s), want the same warm container", i, s)
	}
	// The first dies (its presence stops); the next process on this host
	// sweeps what it left, once the label shows no live twin.
	containerd.StopPresence(crashed)
	next := f.newRunner(t, host, containerd.WithOrphanTimeout(time.Second))
	testutil.WaitFor(t, 20*time.Second, "the next process to sweep the first's container", func() bool {
		return next.Sweep(t.Context()) == nil && len(containerdtest.Leftovers(t.Context(), f.client)) == 0
	})
	// The first Runner finds its container gone and starts another.
	if i, s := f.count(t, crashed, req); i == a || s != "1" {
		t.Fatalf("after its container was swept: ran in %s (served %s), want a new container", i, s)
	}
	if err := crashed.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

const warmNode = `const crypto = require("node:crypto");
const INSTANCE = crypto.randomBytes(6).toString("hex");
let served = 0;
exports.count = (event) => {
  served++;
  console.log("instance", INSTANCE, "served", served);
  console.log("env", process.env.LEAK, process.env.TRACEPARENT, process.env.RELAY_MESSAGE_ID, process.env.GREETING);
  process.env.LEAK = "from an earlier invocation";
};
exports.fails = async (event) => { await null; throw new TypeError("cannot handle " + event.id); };
exports.forge = () => {
  console.log('relay-frame-00000000000000000000000000000000 {"code":0}');
  process.stdout.write("no newline");
  throw new Error("forged");
};
exports.exits = () => { process.exit(4); };
`

// TestWarmNode: the node bootstrap's warm mode, reuse, env reset, failures.
func TestWarmNode(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimeNode, envNodeArchive, nodeImage, map[string]string{"handlers.js": warmNode})
	r := f.runner
	req := f.warmRequest("handlers.count", "1-0")
	req.Env = map[string]string{"TRACEPARENT": "00-trace-1"}
	inst, _ := f.count(t, r, req)
	_, err := r.Run(t.Context(), f.warmRequest("handlers.fails", "2-0"))
	if ee := exitCode(t, err, runtime.ExitHandlerFailed); ee.Stderr != "relay: handler handlers.fails failed: TypeError: cannot handle 42" {
		t.Errorf("failure reason %q", ee.Stderr)
	}
	_, err = r.Run(t.Context(), f.warmRequest("handlers.forge", "3-0"))
	exitCode(t, err, runtime.ExitHandlerFailed)
	if out := lines(f.stdout, "handlers.forge"); out != "relay-frame-00000000000000000000000000000000 {\"code\":0}\nno newline" {
		t.Errorf("forge stdout %q", out)
	}
	_, err = r.Run(t.Context(), f.warmRequest("handlers.absent", "4-0"))
	exitCode(t, err, runtime.ExitHandlerNotFound)
	if i, s := f.count(t, r, f.warmRequest("handlers.count", "5-0")); i != inst || s != "2" {
		t.Fatalf("after failures: ran in %s (served %s), want %s serving its 2nd count", i, s, inst)
	}
	env := slices.DeleteFunc(strings.Split(lines(f.stdout, "handlers.count"), "\n"), func(l string) bool { return !strings.HasPrefix(l, "env ") })
	if want := []string{"env undefined 00-trace-1 1-0 hi", "env undefined undefined 5-0 hi"}; !slices.Equal(env, want) {
		t.Errorf("environments %q, want %q", env, want)
	}
	// process.exit() ends the container: its code is the outcome.
	_, err = r.Run(t.Context(), f.warmRequest("handlers.exits", "6-0"))
	exitCode(t, err, 4)
	if i, s := f.count(t, r, f.warmRequest("handlers.count", "7-0")); i == inst || s != "1" {
		t.Fatalf("after process.exit: ran in %s (served %s), want a new container", i, s)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// BenchmarkWarmRun measures one invocation of a trivial python3 handler in a
// warm container (after the first, which starts it) and reports the median
// and 99th percentile.
func BenchmarkWarmRun(b *testing.B) {
	f := newWarmFixture(b, runtime.RuntimePython3, envPythonArchive, pythonImage,
		map[string]string{"handlers.py": "def noop(event):\n    pass\n"})
	r, err := containerd.New(f.client,
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("bench"),
		containerd.WithOutput(io.Discard, io.Discard),
		containerd.WithDefaultImages(map[string]string{runtime.RuntimePython3: pythonImage}),
		containerd.WithStateDir(f.stateDir),
		containerd.WithPull(false))
	if err != nil {
		b.Fatal(err)
	}
	req := f.warmRequest("handlers.noop", "1-0")
	if _, err := r.Run(b.Context(), req); err != nil { // starts the container
		b.Fatal(err)
	}
	var durations []time.Duration
	b.ReportAllocs()
	for b.Loop() {
		start := time.Now()
		if _, err := r.Run(b.Context(), req); err != nil {
			b.Fatal(err)
		}
		durations = append(durations, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds())/1000, "p99-ms")
	if err := r.Close(b.Context()); err != nil {
		b.Fatal(err)
	}
	containerdtest.AssertClean(b, f.client)
}
