package containerd_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/client"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// Runtime images built from Debian packages by scripts/runtime-images.sh;
// scripts/test.sh exports the archive paths.
const (
	envPythonArchive = "RELAY_TEST_PYTHON_IMAGE_ARCHIVE"
	envNodeArchive   = "RELAY_TEST_NODE_IMAGE_ARCHIVE"
	pythonImage      = "relay.local/python3:bookworm"
	nodeImage        = "relay.local/node:bookworm"
)

// runtimeFixture runs handlers of one language runtime from an app
// directory, with the image of that runtime as its default image.
type runtimeFixture struct {
	client         *client.Client
	runner         *containerd.Runner
	stdout, stderr *testutil.Buffer
	app, stateDir  string
	runtime        string
}

func newRuntimeFixture(t testing.TB, rt, env, ref string, files map[string]string) *runtimeFixture {
	t.Helper()
	f := &runtimeFixture{client: containerdtest.Client(t), stdout: &testutil.Buffer{}, stderr: &testutil.Buffer{}, runtime: rt}
	containerdtest.ImportArchive(t, f.client, env, ref)
	f.app = t.TempDir()
	if err := os.Chmod(f.app, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, src := range files {
		p := filepath.Join(f.app, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	f.stateDir = t.TempDir()
	var err error
	f.runner, err = containerd.New(f.client,
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("test-"+randomHex(4)),
		containerd.WithOutput(f.stdout, f.stderr),
		containerd.WithDefaultImages(map[string]string{rt: ref}),
		containerd.WithStateDir(f.stateDir),
		containerd.WithPull(false),
	)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *runtimeFixture) request(handler string) runtime.Request {
	return runtime.Request{
		App: "app", Handler: handler, MessageID: "1-0", Attempt: 1,
		Event:   []byte(`{"name":"ada","id":42}`),
		Timeout: time.Minute, // generous: the machine may be busy
		Spec:    runtime.Spec{Dir: f.app, Runtime: f.runtime},
	}
}

// lines returns what handler wrote to w, without the line prefix.
func lines(w *testutil.Buffer, handler string) string {
	prefix := "[app/" + handler + "] "
	var out []string
	for _, l := range strings.Split(w.String(), "\n") {
		if s, ok := strings.CutPrefix(l, prefix); ok {
			out = append(out, s)
		}
	}
	return strings.Join(out, "\n")
}

// runtimeCase is one handler run in a runtime image.
type runtimeCase struct {
	handler    string
	wantCode   int      // 0: success
	wantStdout []string // substrings
	wantStderr []string // substrings
	wantReason string   // ExitError.Stderr, the line kept as the failure reason
}

func (f *runtimeFixture) check(t *testing.T, cases []runtimeCase) {
	b, err := runtime.LookupBootstrap(f.runtime)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.handler, func(t *testing.T) {
			t.Parallel()
			_, err := f.runner.Run(t.Context(), f.request(c.handler))
			stdout, stderr := lines(f.stdout, c.handler), lines(f.stderr, c.handler)
			t.Logf("err=%v\nstdout:\n%s\nstderr:\n%s", err, stdout, stderr)
			if c.wantCode == 0 {
				if err != nil {
					t.Fatalf("got %v, want success", err)
				}
			} else {
				ee, ok := errors.AsType[*runtime.ExitError](err)
				if !ok || ee.Code != c.wantCode {
					t.Fatalf("got %v, want an ExitError with code %d", err, c.wantCode)
				}
				if c.wantReason != "" && ee.Stderr != c.wantReason {
					t.Errorf("failure reason %q, want %q", ee.Stderr, c.wantReason)
				}
			}
			for _, want := range c.wantStdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout lacks %q", want)
				}
			}
			for _, want := range c.wantStderr {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr lacks %q", want)
				}
			}
			if strings.Contains(stderr, b.MountPath()) {
				t.Errorf("the traceback shows the bootstrap's own frames")
			}
		})
	}
}

const pythonHandlers = `import asyncio, json, os, sys

def created(event):
    print("sync", json.dumps(event, sort_keys=True), type(event).__name__)
    print("cwd", os.getcwd(), "python", sys.version_info[0], "handler", os.environ["RELAY_HANDLER"])

async def later(event):
    await asyncio.sleep(0.01)
    print("async", event["name"])

def fails(event):
    helper(event)

def helper(event):
    raise ValueError("cannot handle %d" % event["id"])

async def fails_later(event):
    await asyncio.sleep(0)
    raise RuntimeError("async failure")

def sandbox(event):
    path = "/relay/bootstrap.py"
    print("bootstrap readable", len(open(path).read()) > 0)
    try:
        open(path, "a")
        print("bootstrap writable")
    except OSError as e:
        print("write refused", e.strerror)
    for line in open("/proc/self/mountinfo"):
        fields = line.split()
        if fields[4] == path:
            print("mount options", fields[5])

def bytecode(event):
    # Whether the image's bytecode caches of modules every start and this
    # handler import are valid: a stale one (a timestamp cache whose
    # source's time changed) is compiled again on every start.
    import encodings.aliases, json.decoder
    for m in (encodings.aliases, json.decoder):
        with open(m.__spec__.cached, "rb") as f:
            head = f.read(16)
        flags = int.from_bytes(head[4:8], "little")
        if flags & 1:
            print("cache", m.__name__, "hash-based")
        elif int.from_bytes(head[8:12], "little") == int(os.stat(m.__spec__.origin).st_mtime) & 0xFFFFFFFF:
            print("cache", m.__name__, "timestamp, valid")
        else:
            print("cache", m.__name__, "stale")
`

// TestPythonRuntime runs `runtime: python3` handlers through the mounted
// bootstrap in the image built from Debian's python3.
func TestPythonRuntime(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{
		"handlers.py":       pythonHandlers,
		"events/created.py": "def handle(event):\n    print('package path', event['id'])\n",
	})
	t.Run("handlers", func(t *testing.T) {
		f.check(t, []runtimeCase{
			{handler: "handlers.created", wantStdout: []string{
				`sync {"id": 42, "name": "ada"} dict`, // the event arrives parsed
				"cwd /app python 3 handler handlers.created",
			}},
			{handler: "handlers.later", wantStdout: []string{"async ada"}},
			{handler: "events.created.handle", wantStdout: []string{"package path 42"}},
			{handler: "handlers.fails", wantCode: runtime.ExitHandlerFailed,
				wantStderr: []string{"Traceback (most recent call last):", `File "/app/handlers.py", line 15, in helper`},
				wantReason: "ValueError: cannot handle 42"},
			{handler: "handlers.fails_later", wantCode: runtime.ExitHandlerFailed,
				wantReason: "RuntimeError: async failure"},
			{handler: "nomodule.run", wantCode: runtime.ExitHandlerNotFound,
				wantReason: "relay: handler nomodule.run: module 'nomodule' not found in /app"},
			{handler: "handlers.absent", wantCode: runtime.ExitHandlerNotFound,
				wantReason: "relay: handler handlers.absent: module 'handlers' has no function 'absent'"},
			{handler: "handlers.sandbox", wantStdout: []string{"bootstrap readable True", "write refused"}},
		})
	})
	// scripts/runtime-images.sh compiles the image's caches again after
	// mkimage fixed every file's time, so no start compiles the standard
	// library (docs/runtimes.md "Offline images built from Debian packages").
	t.Run("bytecode caches", func(t *testing.T) {
		if _, err := f.runner.Run(t.Context(), f.request("handlers.bytecode")); err != nil {
			t.Fatalf("Run: %v", err)
		}
		if out := lines(f.stdout, "handlers.bytecode"); strings.Contains(out, "stale") || strings.Count(out, "cache ") != 2 {
			t.Errorf("the image's bytecode caches of the standard library are not valid:\n%s", out)
		}
	})
	if t.Failed() {
		return
	}
	out := lines(f.stdout, "handlers.sandbox")
	if !strings.Contains(out, "mount options ro,") {
		t.Errorf("/relay/bootstrap.py is not a read-only mount:\n%s", out)
	}
	containerdtest.AssertClean(t, f.client)

	// The host copy: in the state directory, named by content hash,
	// read-only; rewritten when it disappears.
	b, _ := runtime.LookupBootstrap(runtime.RuntimePython3)
	host := filepath.Join(f.stateDir, "bootstrap", "python3-"+b.Digest()[:16]+".py")
	fi, err := os.Stat(host)
	if err != nil {
		t.Fatalf("no bootstrap copy in the state directory: %v", err)
	}
	if fi.Mode().Perm() != 0o444 {
		t.Errorf("bootstrap copy mode %v, want 0444", fi.Mode().Perm())
	}
	if got, _ := os.ReadFile(host); !bytes.Equal(got, b.Source) {
		t.Errorf("bootstrap copy differs from the embedded script")
	}
	if err := os.Remove(host); err != nil {
		t.Fatal(err)
	}
	if _, err := f.runner.Run(t.Context(), f.request("handlers.later")); err != nil {
		t.Fatalf("after the copy was removed: %v", err)
	}
	if _, err := os.Stat(host); err != nil {
		t.Errorf("bootstrap copy not rewritten: %v", err)
	}
	containerdtest.AssertClean(t, f.client)
}

// TestRuntimeImageOverride: the runtime's default image is used when the
// template has no image, and image: overrides it.
func TestRuntimeImageOverride(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, map[string]string{
		"handlers.py": pythonHandlers,
	})
	r, err := containerd.New(f.client,
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("test-"+randomHex(4)),
		containerd.WithOutput(f.stdout, f.stderr),
		containerd.WithDefaultImages(map[string]string{runtime.RuntimePython3: "relay.local/absent-python:1"}),
		containerd.WithStateDir(f.stateDir),
		containerd.WithPull(false),
	)
	if err != nil {
		t.Fatal(err)
	}
	req := f.request("handlers.later")
	_, err = r.Run(t.Context(), req)
	if !errors.Is(err, runtime.ErrUnavailable) {
		t.Fatalf("absent default image: got %v, want ErrUnavailable", err)
	}
	for _, want := range []string{"relay.local/absent-python:1", "set image: in template.yaml"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	req.Spec.Image = pythonImage
	if _, err := r.Run(t.Context(), req); err != nil {
		t.Fatalf("image: %s overriding the absent default: %v", pythonImage, err)
	}
	if !strings.Contains(lines(f.stdout, "handlers.later"), "async ada") {
		t.Errorf("stdout:\n%s", f.stdout)
	}
	containerdtest.AssertClean(t, f.client)
}

const nodeSandbox = `const fs = require("node:fs");
exports.sandbox = () => {
  const path = "/relay/bootstrap.cjs";
  console.log("bootstrap readable", fs.readFileSync(path, "utf8").length > 0);
  try {
    fs.appendFileSync(path, "x");
    console.log("bootstrap writable");
  } catch (err) {
    console.log("write refused", err.code);
  }
  for (const line of fs.readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
    const fields = line.split(" ");
    if (fields[4] === path) console.log("mount options", fields[5]);
  }
};
`

// TestNodeRuntime runs `runtime: node` handlers, CommonJS and ES modules,
// through the mounted bootstrap in the image built from Debian's nodejs.
func TestNodeRuntime(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimeNode, envNodeArchive, nodeImage, map[string]string{
		"cjs.js": `exports.created = (event) => {
  console.log("cjs", JSON.stringify(event), typeof event);
  console.log("cwd", process.cwd(), "handler", process.env.RELAY_HANDLER);
};
exports.later = async (event) => { await new Promise((r) => setTimeout(r, 10)); console.log("cjs async", event.name); };
exports.fails = (event) => { throw new TypeError("cannot handle " + event.id); };
`,
		"esm.mjs": `export async function handle(event) { await null; console.log("esm", event.name); }
export const rejects = async (event) => { await null; throw new Error("rejected " + event.id); };
`,
		"lib/package.json": `{"type": "module"}`,
		"lib/events.js":    "export function handle(event) { console.log('esm by package.json', event.id); }\n",
		"checks.cjs":       nodeSandbox,
	})
	t.Run("handlers", func(t *testing.T) {
		f.check(t, []runtimeCase{
			{handler: "cjs.created", wantStdout: []string{
				`cjs {"name":"ada","id":42} object`, // the event arrives parsed
				"cwd /app handler cjs.created",
			}},
			{handler: "cjs.later", wantStdout: []string{"cjs async ada"}},
			{handler: "esm.handle", wantStdout: []string{"esm ada"}},
			{handler: "lib/events.handle", wantStdout: []string{"esm by package.json 42"}},
			{handler: "cjs.fails", wantCode: runtime.ExitHandlerFailed,
				wantStderr: []string{"TypeError: cannot handle 42", "(/app/cjs.js:"},
				wantReason: "relay: handler cjs.fails failed: TypeError: cannot handle 42"},
			{handler: "esm.rejects", wantCode: runtime.ExitHandlerFailed,
				wantStderr: []string{"file:///app/esm.mjs:"},
				wantReason: "relay: handler esm.rejects failed: Error: rejected 42"},
			{handler: "esm.absent", wantCode: runtime.ExitHandlerNotFound,
				wantReason: `relay: handler esm.absent: module esm.mjs has no export "absent"`},
			{handler: "nomodule.run", wantCode: runtime.ExitHandlerNotFound,
				wantStderr: []string{`relay: handler nomodule.run: module "nomodule" not found in /app`}},
			{handler: "checks.sandbox", wantStdout: []string{"bootstrap readable true", "write refused"}},
		})
	})
	if t.Failed() {
		return
	}
	if out := lines(f.stdout, "checks.sandbox"); !strings.Contains(out, "mount options ro,") {
		t.Errorf("/relay/bootstrap.cjs is not a read-only mount:\n%s", out)
	}
	containerdtest.AssertClean(t, f.client)
}
