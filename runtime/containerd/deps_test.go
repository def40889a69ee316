package containerd_test

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/depstest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// depsRunner returns a Runner of f's namespace logging to a buffer of its
// own, so that a test can tell what each Runner did.
func depsRunner(t *testing.T, f *runtimeFixture, opts ...containerd.Option) (*containerd.Runner, *testutil.Buffer) {
	t.Helper()
	log := &testutil.Buffer{}
	r, err := containerd.New(f.client, append([]containerd.Option{
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("test-" + randomHex(4)),
		containerd.WithOutput(f.stdout, f.stderr),
		containerd.WithDefaultImages(map[string]string{f.runtime: defaultRef(f.runtime)}),
		containerd.WithStateDir(t.TempDir()),
		containerd.WithPull(false),
		containerd.WithLogger(slog.New(slog.NewTextHandler(log, nil))),
	}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return r, log
}

func depsOf(t *testing.T, dir string, rt string) *runtime.Deps {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if rt == runtime.RuntimeNode {
		return &runtime.Deps{Manifest: runtime.NodeManifest, ManifestData: read(runtime.NodeManifest),
			Lockfile: runtime.NodeLockfile, LockfileData: read(runtime.NodeLockfile)}
	}
	return &runtime.Deps{Manifest: runtime.PythonManifest, ManifestData: read(runtime.PythonManifest)}
}

const pythonDepsHandler = `import os, sys
import relaydemo

def hello(event):
    print(relaydemo.greet(event["name"]))
    print("module", relaydemo.__file__)
    print("app files", sorted(os.listdir("/app")))
    try:
        open("/app/x", "w")
        print("app writable")
    except OSError:
        print("app read-only")
`

// TestDepsPython: a python3 app's requirements.txt is installed by pip
// from the app's own wheels into a layer of a dependency image; the
// handler imports the package; the app directory stays read-only and
// unchanged; a second Runner (another worker) finds the image and does not
// build; warm containers use the image too.
func TestDepsPython(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.PythonApp(t, f.app, map[string]string{"handlers.py": pythonDepsHandler})
	before, _ := os.ReadDir(f.app)
	r1, log1 := depsRunner(t, f)
	req := f.request("handlers.hello")
	req.Spec.Deps = depsOf(t, f.app, runtime.RuntimePython3)
	if err := r1.Prepare(t.Context(), "app", req.Spec); err != nil {
		t.Fatalf("Prepare: %v\nlog:\n%s", err, log1)
	}
	t.Logf("first build: %s", grepLine(log1.String(), "dependency image built"))
	if !strings.Contains(log1.String(), "dependency image built") || !strings.Contains(log1.String(), "app=app") {
		t.Errorf("no build logged with the app's name:\n%s", log1)
	}
	if _, err := r1.Run(t.Context(), req); err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, f.stderr)
	}
	out := lines(f.stdout, "handlers.hello")
	for _, want := range []string{depstest.WheelGreeting + "ada", "module " + runtime.DepsDir + "/python/relaydemo/__init__.py", "app read-only"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	after, _ := os.ReadDir(f.app)
	if len(after) != len(before) {
		t.Errorf("app directory changed: %d entries before, %d after", len(before), len(after))
	}
	info, ok, err := r1.DepsImageOf(t.Context(), req.Spec)
	if err != nil || !ok || !info.Built || info.Size <= 0 || info.At.IsZero() || !strings.HasPrefix(info.Name, containerd.DepsImagePrefix) {
		t.Errorf("DepsImageOf = %+v, %v, %v", info, ok, err)
	}

	r2, log2 := depsRunner(t, f)
	if err := r2.Prepare(t.Context(), "app", req.Spec); err != nil {
		t.Fatalf("Prepare of a second Runner: %v", err)
	}
	if s := log2.String(); strings.Contains(s, "building dependency image") || !strings.Contains(s, "dependency image cached") {
		t.Errorf("second Runner: want a cache hit and no build, log:\n%s", s)
	}
	warm := req
	warm.Spec.Warm = true
	if _, err := r2.Run(t.Context(), warm); err != nil {
		t.Fatalf("warm Run: %v\nstderr:\n%s", err, f.stderr)
	}
	if n := strings.Count(lines(f.stdout, "handlers.hello"), depstest.WheelGreeting); n != 2 {
		t.Errorf("%d greetings after a cold and a warm run, want 2", n)
	}
	r2.Close(t.Context())
	containerdtest.AssertClean(t, f.client)
}

// TestDepsConcurrentRunners: Runners preparing the same manifest at once
// build it once.
func TestDepsConcurrentRunners(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.PythonApp(t, f.app, map[string]string{"handlers.py": pythonDepsHandler})
	spec := runtime.Spec{Dir: f.app, Runtime: runtime.RuntimePython3, Deps: depsOf(t, f.app, runtime.RuntimePython3)}
	var wg sync.WaitGroup
	logs := make([]*testutil.Buffer, 3)
	for i := range logs {
		r, log := depsRunner(t, f)
		logs[i] = log
		wg.Go(func() {
			if err := r.Prepare(t.Context(), "app", spec); err != nil {
				t.Errorf("Prepare %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	builds := 0
	for _, l := range logs {
		builds += strings.Count(l.String(), "building dependency image")
	}
	if builds != 1 {
		t.Errorf("%d builds, want 1", builds)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestDepsBuildFails: a manifest pip cannot install makes the app
// unavailable, with pip's last lines as the reason; Run then fails the same
// way without building again.
func TestDepsBuildFails(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.WriteFiles(t, f.app, map[string]string{
		"requirements.txt": "--no-index\nnosuchpackage==1.0\n",
		"handlers.py":      "def hello(event):\n    pass\n",
	})
	r, log := depsRunner(t, f)
	req := f.request("handlers.hello")
	req.Spec.Deps = depsOf(t, f.app, runtime.RuntimePython3)
	err := r.Prepare(t.Context(), "app", req.Spec)
	if !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "nosuchpackage") {
		t.Fatalf("Prepare: %v, want ErrUnavailable naming the package", err)
	}
	_, runErr := r.Run(t.Context(), req)
	if !errors.Is(runErr, runtime.ErrUnavailable) || !strings.Contains(runErr.Error(), "nosuchpackage") {
		t.Errorf("Run: %v, want the build's error", runErr)
	}
	if n := strings.Count(log.String(), "building dependency image"); n != 1 {
		t.Errorf("%d builds, want 1:\n%s", n, log)
	}
	if !strings.Contains(log.String(), "dependency build output") {
		t.Errorf("installer output not logged:\n%s", log)
	}
	containerdtest.AssertClean(t, f.client)
}

const nodeDepsHandler = `const isNumber = require("is-number");
exports.check = (event) => {
  console.log("isNumber", isNumber(event.id), isNumber(event.name));
  console.log("resolved", require.resolve("is-number"));
};
`

// TestDepsNode: a node app's package.json and package-lock.json are
// installed by npm ci from the npm registry; the handler requires the
// package.
func TestDepsNode(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimeNode, envNodeArchive, nodeImage, nil)
	depstest.NodeApp(t, f.app, map[string]string{"handlers.js": nodeDepsHandler})
	var opts []containerd.Option
	if ca := depstest.CAFile(); ca != "" {
		opts = append(opts, containerd.WithBuildCAFile(ca))
	}
	r, log := depsRunner(t, f, opts...)
	req := f.request("handlers.check")
	req.Spec.Deps = depsOf(t, f.app, runtime.RuntimeNode)
	if err := r.Prepare(t.Context(), "app", req.Spec); err != nil {
		t.Fatalf("Prepare: %v\nlog:\n%s", err, log)
	}
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("Run: %v\nstderr:\n%s", err, f.stderr)
	}
	out := lines(f.stdout, "handlers.check")
	for _, want := range []string{"isNumber true false", "resolved " + runtime.DepsDir + "/node_modules/is-number/index.js"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, err := os.Stat(filepath.Join(f.app, "node_modules")); err == nil {
		t.Error("node_modules written into the app directory")
	}
	containerdtest.AssertClean(t, f.client)
}

// TestDepsBuildsBounded: with WithMaxConcurrentBuilds(1), builds of two
// manifests prepared at once run one after the other.
func TestDepsBuildsBounded(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.PythonApp(t, f.app, map[string]string{"handlers.py": pythonDepsHandler})
	r, log := depsRunner(t, f, containerd.WithMaxConcurrentBuilds(1))
	var wg sync.WaitGroup
	for i := range 2 {
		spec := runtime.Spec{Dir: f.app, Runtime: runtime.RuntimePython3, Deps: depsOf(t, f.app, runtime.RuntimePython3)}
		// Another manifest: the same requirements with another comment.
		spec.Deps.ManifestData = append([]byte(fmt.Sprintf("# variant %d\n", i)), spec.Deps.ManifestData...)
		wg.Go(func() {
			if err := r.Prepare(t.Context(), fmt.Sprintf("app%d", i), spec); err != nil {
				t.Errorf("Prepare %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	var events []string
	for _, l := range strings.Split(log.String(), "\n") {
		switch {
		case strings.Contains(l, "building dependency image"):
			events = append(events, "start")
		case strings.Contains(l, "dependency image built"):
			events = append(events, "end")
		}
	}
	if got := strings.Join(events, ","); got != "start,end,start,end" {
		t.Errorf("builds %s, want start,end,start,end (one at a time)\n%s", got, log)
	}
	containerdtest.AssertClean(t, f.client)
}

// grepLine returns the first line of s containing sub.
func grepLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
