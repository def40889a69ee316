package containerd_test

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// Handlers that misbehave inside their container: processes left behind,
// memory and /tmp exhausted, an image whose /tmp is not writable.

// sandboxPython is a python3 app whose handlers leave processes behind,
// exhaust their memory or their /tmp, and report the container's process
// table along with the container's instance (random per process), which
// tells warm containers apart.
const sandboxPython = `import os, subprocess, sys, time

INSTANCE = os.urandom(6).hex()

def table():
    """The container's processes other than this one: "<state> <command>"."""
    out = []
    for p in sorted(os.listdir("/proc")):
        if p.isdigit() and int(p) != os.getpid():
            try:
                with open("/proc/%s/stat" % p) as f:
                    stat = f.read()
            except OSError:
                continue
            out.append(stat[stat.rindex(")") + 2] + " " + stat[stat.index("(") + 1:stat.rindex(")")])
    return out

def procs(event):
    print("instance", INSTANCE, "others", table())

def background(event):
    # The child keeps the invocation's stdout and stderr open for 5 minutes.
    subprocess.Popen(["sleep", "300"])
    print("started a child")

def orphan(event):
    # The shell exits at once; its child is reparented to the container's init.
    subprocess.run(["sh", "-c", "sleep 300 &"], check=True)

def zombie(event):
    # A child that ends and that nobody waits for.
    if os.fork() == 0:
        os._exit(0)

def forkbomb(event):
    n = 0
    try:
        while True:
            if os.fork() == 0:
                time.sleep(300)
                os._exit(0)
            n += 1
    except BlockingIOError:
        print("forked", n, "children before the pids limit")

def fork_returns(event):
    # The child returns into the bootstrap as if it were the handler.
    os.fork()

def hog(event):
    chunks = []
    while True:
        chunks.append(bytearray(8 << 20))

def fill_tmp(event):
    with open("/tmp/fill", "wb") as f:
        while True:
            f.write(b"x" * (1 << 20))
            f.flush()

def exits_137(event):
    os._exit(137)

def writes_tmp(event):
    with open("/tmp/probe", "w") as f:
        f.write("ok")
    print("wrote /tmp/probe")

def exits_3(event):
    sys.exit(3)
`

var procsRE = regexp.MustCompile(`instance (\w+) others (.*)`)

// procs runs handler procs (of sandboxPython or sandboxNode) with r and
// returns the container's instance and its other processes.
func procs(t *testing.T, f *runtimeFixture, r *containerd.Runner, req runtime.Request) (instance, others string) {
	t.Helper()
	req.Handler = "handlers.procs"
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("procs: %v", err)
	}
	m := procsRE.FindAllStringSubmatch(lines(f.stdout, req.Handler), -1)
	if len(m) == 0 {
		t.Fatalf("procs printed nothing; stdout:\n%s", f.stdout)
	}
	last := m[len(m)-1]
	return last[1], last[2]
}

// TestWarmLeavesNoProcesses: nothing an invocation starts outlives it in a
// warm container. A child left running (one holding the invocation's
// output open, one orphaned, a fork bomb at the pids limit, a fork that
// returns into the bootstrap) and a child never waited for are gone when the
// next invocation starts, which sees the process table of the first, in the
// same container. Twenty invocations that each leave a child do not add up
// to the pids limit of 16.
func TestWarmLeavesNoProcesses(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": sandboxPython})
	r := f.runner
	req := func(handler string) runtime.Request {
		req := f.warmRequest("handlers."+handler, "1-0")
		req.Spec.PIDs = 16
		req.Timeout = 20 * time.Second // a handler that waited for its child would time out
		return req
	}
	inst, others := procs(t, f.runtimeFixture, r, req("procs"))
	if others != "[]" {
		t.Fatalf("a fresh warm container runs %s besides the bootstrap", others)
	}
	for i := range 20 {
		if _, err := r.Run(t.Context(), req("background")); err != nil {
			t.Fatalf("invocation %d leaving a child: %v", i+1, err)
		}
	}
	if n := strings.Count(lines(f.stdout, "handlers.background"), "started a child"); n != 20 {
		t.Errorf("background printed %d times, want 20", n)
	}
	if i, o := procs(t, f.runtimeFixture, r, req("procs")); i != inst || o != "[]" {
		t.Fatalf("after 20 invocations that left a child: container %s with %s besides the bootstrap; want %s with none", i, o, inst)
	}
	for _, h := range []string{"orphan", "zombie", "forkbomb", "fork_returns"} {
		if _, err := r.Run(t.Context(), req(h)); err != nil {
			t.Fatalf("%s: %v", h, err)
		}
		if i, o := procs(t, f.runtimeFixture, r, req("procs")); i != inst || o != "[]" {
			t.Fatalf("after %s: container %s with %s besides the bootstrap; want %s with none", h, i, o, inst)
		}
	}
	if !strings.Contains(lines(f.stdout, "handlers.forkbomb"), "children before the pids limit") {
		t.Errorf("the fork bomb did not reach the pids limit:\n%s", f.stdout)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

const sandboxNode = `const { spawn, spawnSync } = require("node:child_process");
const crypto = require("node:crypto");
const fs = require("node:fs");
const INSTANCE = crypto.randomBytes(6).toString("hex");

function table() {
  const out = [];
  for (const p of fs.readdirSync("/proc").sort()) {
    if (!/^[0-9]+$/.test(p) || Number(p) === process.pid) continue;
    let stat;
    try { stat = fs.readFileSync("/proc/" + p + "/stat", "latin1"); } catch { continue; }
    out.push(stat[stat.lastIndexOf(")") + 2] + " " + stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")")));
  }
  return out;
}
exports.procs = () => console.log("instance", INSTANCE, "others", JSON.stringify(table()));
// The child keeps the invocation's stdout and stderr open for 5 minutes.
exports.background = () => { spawn("sleep", ["300"], { stdio: "inherit" }); console.log("started a child"); };
// The shell exits at once; its child is reparented to the container's init,
// which Node cannot wait for.
exports.orphan = () => { spawnSync("sh", ["-c", "sleep 300 &"], { stdio: "ignore" }); };
`

// TestWarmNodeLeavesNoProcesses: the node bootstrap kills what an
// invocation leaves behind too. Node reaps the children it started, so the
// container serves on; an orphaned grandchild ends as a zombie that Node
// cannot reap, so that container is replaced.
func TestWarmNodeLeavesNoProcesses(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimeNode, envNodeArchive, nodeImage, map[string]string{"handlers.js": sandboxNode})
	r := f.runner
	req := func(handler string) runtime.Request {
		req := f.warmRequest("handlers."+handler, "1-0")
		req.Spec.PIDs = 32 // node has about a dozen threads
		req.Timeout = 20 * time.Second
		return req
	}
	inst, others := procs(t, f.runtimeFixture, r, req("procs"))
	if others != "[]" {
		t.Fatalf("a fresh warm container runs %s besides the bootstrap", others)
	}
	for i := range 20 {
		if _, err := r.Run(t.Context(), req("background")); err != nil {
			t.Fatalf("invocation %d leaving a child: %v", i+1, err)
		}
	}
	if i, o := procs(t, f.runtimeFixture, r, req("procs")); i != inst || o != "[]" {
		t.Fatalf("after 20 invocations that left a child: container %s with %s besides the bootstrap; want %s with none", i, o, inst)
	}
	if _, err := r.Run(t.Context(), req("orphan")); err != nil {
		t.Fatal(err)
	}
	if i, o := procs(t, f.runtimeFixture, r, req("procs")); i == inst || o != "[]" {
		t.Fatalf("after an orphan: container %s with %s besides the bootstrap; want a new container with none", i, o)
	}
	if err := r.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestRunChildHoldsOutput: a one-shot handler whose child keeps its stdout
// and stderr open completes when the handler exits, not at its timeout; a
// handler that exits without reading a 200 KiB event is judged by its exit
// code.
func TestRunChildHoldsOutput(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("x")
	req.Spec.Command = []string{"/bin/sh", "-c", "sleep 300 & echo started"}
	req.Timeout = 10 * time.Second
	if _, err := f.run(t, req); err != nil {
		t.Fatalf("handler whose child holds its output: %v", err)
	}
	if !strings.Contains(f.stdout.String(), "[users/x] started\n") {
		t.Errorf("stdout = %q", f.stdout.String())
	}
	for _, script := range []string{"exit 3", "echo unread >&2; exit 3"} {
		req := f.request("x")
		req.Spec.Command = []string{"/bin/sh", "-c", script}
		req.Event = bytes.Repeat([]byte("x"), 200<<10)
		_, err := f.run(t, req)
		exitCode(t, err, 3)
	}
}

// TestRunOOMKill: a handler killed by the kernel at its memory limit is
// reported as such, with the limit; one that exits 137 by itself, or
// whose child it killed with SIGKILL, is an ordinary exit.
func TestRunOOMKill(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	req := f.request("x")
	req.Spec.MemoryBytes = 32 << 20
	req.Spec.TmpBytes = req.Spec.MemoryBytes // /tmp can hold the whole limit
	req.Spec.Command = []string{"/bin/sh", "-c", "head -c 64000000 /dev/zero >/tmp/fill; echo survived"}
	_, err := f.run(t, req)
	ee := exitCode(t, err, 137)
	if !ee.OOMKilled || ee.MemoryLimit != 32<<20 || !strings.HasPrefix(err.Error(), "handler killed: out of memory (limit 32MiB)") {
		t.Errorf("OOM kill reported as %q (%+v)", err, ee)
	}
	for _, script := range []string{"exit 137", "sleep 10 & kill -9 $!; wait $!"} {
		req := f.request("x")
		req.Spec.MemoryBytes = 32 << 20
		req.Spec.Command = []string{"/bin/sh", "-c", script}
		_, err := f.run(t, req)
		if ee := exitCode(t, err, 137); ee.OOMKilled || strings.Contains(err.Error(), "memory") {
			t.Errorf("%q reported as %q (%+v)", script, err, ee)
		}
	}
}

// TestPythonMemoryAndTmp: in one-shot and warm containers, a python3
// handler that outgrows its memory is reported killed for it (a warm
// container is replaced), one that exits 137 is not, and one that fills
// /tmp gets ENOSPC, which its traceback reports, instead of being killed.
func TestPythonMemoryAndTmp(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": sandboxPython})
	for _, warm := range []bool{false, true} {
		req := func(handler string) runtime.Request {
			req := f.warmRequest("handlers."+handler, "1-0")
			req.Spec.Warm = warm
			req.Spec.MemoryBytes = 64 << 20 // /tmp: 32MiB by default
			return req
		}
		var inst string
		if warm {
			inst, _ = procs(t, f.runtimeFixture, f.runner, req("procs"))
		}
		_, err := f.runner.Run(t.Context(), req("hog"))
		if ee := exitCode(t, err, 137); !ee.OOMKilled || !strings.HasPrefix(err.Error(), "handler killed: out of memory (limit 64MiB)") {
			t.Errorf("warm %v: a memory hog reported as %q", warm, err)
		}
		if warm {
			if again, _ := procs(t, f.runtimeFixture, f.runner, req("procs")); again == inst {
				t.Errorf("the warm container %s killed for memory serves on", inst)
			}
		}
		_, err = f.runner.Run(t.Context(), req("exits_137"))
		if ee := exitCode(t, err, 137); ee.OOMKilled {
			t.Errorf("warm %v: os._exit(137) reported as %q", warm, err)
		}
		if warm {
			inst, _ = procs(t, f.runtimeFixture, f.runner, req("procs"))
		}
		_, err = f.runner.Run(t.Context(), req("fill_tmp"))
		if ee := exitCode(t, err, runtime.ExitHandlerFailed); !strings.Contains(ee.Stderr, "No space left on device") {
			t.Errorf("warm %v: filling /tmp reported as %q", warm, err)
		}
		if warm {
			if again, _ := procs(t, f.runtimeFixture, f.runner, req("procs")); again != inst {
				t.Errorf("the warm container %s whose /tmp filled up was replaced by %s; a failed write does not end it", inst, again)
			}
		}
	}
	if err := f.runner.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}

// importWithTmpMode imports the image of archive (a docker archive of one
// image) into c's namespace as ref, with one more layer that makes /tmp a
// directory of mode perm, as in some users' images.
func importWithTmpMode(t *testing.T, c *client.Client, archive, ref string, perm int64) {
	t.Helper()
	if archive == "" {
		t.Fatal("no image archive (see internal/containerdtest)")
	}
	img, err := tarball.ImageFromPath(archive, nil)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: "tmp/", Mode: perm, ModTime: time.Unix(0, 0)}); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf.Bytes())), nil })
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.AppendLayers(img, layer); err != nil {
		t.Fatal(err)
	}
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(path, tag, img); err != nil {
		t.Fatal(err)
	}
	file, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer file.Close()
	ctx := namespaces.WithNamespace(t.Context(), c.DefaultNamespace())
	imgs, err := c.Import(ctx, file)
	if err != nil {
		t.Fatal(err)
	}
	for _, im := range imgs {
		if im.Name == tag.Name() {
			if err := client.NewImage(c, im).Unpack(ctx, containerdtest.Snapshotter); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("%s not in the archive written", tag.Name())
}

// TestTmpWritableWhateverTheImageMode: runc gives the tmpfs at /tmp the
// mode of the image's /tmp directory; in an image where that is 0755 the
// handler (uid 65534) must still be able to write there, one-shot and warm.
func TestTmpWritableWhateverTheImageMode(t *testing.T) {
	f := newWarmFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{"handlers.py": sandboxPython})
	const busybox, python = "relay.local/busybox:tmp0755", "relay.local/python3:tmp0755"
	importWithTmpMode(t, f.client, os.Getenv(containerdtest.EnvImageArchive), busybox, 0o755)
	importWithTmpMode(t, f.client, os.Getenv(envPythonArchive), python, 0o755)

	oneShot := f.request("x")
	oneShot.Spec = runtime.Spec{Dir: f.app, Image: busybox,
		Command: []string{"/bin/sh", "-c", "ls -ld /tmp; echo data >/tmp/probe && echo wrote /tmp/probe"}}
	if _, err := f.runner.Run(t.Context(), oneShot); err != nil {
		t.Fatal(err)
	}
	if out := lines(f.stdout, "x"); !strings.Contains(out, "wrote /tmp/probe") {
		t.Errorf("one-shot: /tmp not writable:\n%s\n%s", out, lines(f.stderr, "x"))
	}
	for _, warm := range []bool{false, true} {
		req := f.warmRequest("handlers.writes_tmp", "1-0")
		req.Spec.Image, req.Spec.Warm = python, warm
		if _, err := f.runner.Run(t.Context(), req); err != nil {
			t.Errorf("python3, warm %v: %v", warm, err)
		}
	}
	if n := strings.Count(lines(f.stdout, "handlers.writes_tmp"), "wrote /tmp/probe"); n != 2 {
		t.Errorf("python3 wrote /tmp %d times of 2:\n%s", n, f.stderr)
	}
	if err := f.runner.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	containerdtest.AssertClean(t, f.client)
}
