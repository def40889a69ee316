package runtime_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
)

func TestLookupBootstrap(t *testing.T) {
	for _, tt := range []struct {
		runtime, mount, interpreter string
	}{
		{runtime.RuntimePython3, "/relay/bootstrap.py", "python3"},
		{runtime.RuntimeNode, "/relay/bootstrap.cjs", "node"},
	} {
		b, err := runtime.LookupBootstrap(tt.runtime)
		if err != nil {
			t.Fatal(err)
		}
		if got := b.MountPath(); got != tt.mount {
			t.Errorf("%s: MountPath = %q, want %q", tt.runtime, got, tt.mount)
		}
		cmd := b.Command(b.MountPath())
		if cmd[0] != tt.interpreter || cmd[len(cmd)-1] != tt.mount {
			t.Errorf("%s: Command = %q", tt.runtime, cmd)
		}
		inline := b.InlineCommand()
		if inline[0] != tt.interpreter || inline[len(inline)-1] != string(b.Source) {
			t.Errorf("%s: InlineCommand does not end with the script", tt.runtime)
		}
		if len(b.Digest()) != 64 {
			t.Errorf("%s: Digest = %q", tt.runtime, b.Digest())
		}
	}
	if _, err := runtime.LookupBootstrap("ruby"); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("unknown runtime: got %v, want ErrUnavailable", err)
	}
	// runtime: go apps are Go functions: no container runner can run them.
	if _, err := runtime.LookupBootstrap(runtime.RuntimeGo); !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "the handlers are Go functions") {
		t.Errorf("runtime go: got %v, want ErrUnavailable saying the handlers are Go functions", err)
	}
}

// bootstrapCase runs one handler through a bootstrap file with a local
// interpreter, as the containerd runner does in a container.
type bootstrapCase struct {
	name       string
	handler    string
	event      string // default {"id":7,"name":"ada"}
	wantCode   int
	wantStdout string // substring
	wantStderr string // substring
	wantLast   string // last line of stderr, exactly
}

func runBootstrapCases(t *testing.T, rt string, files map[string]string, cases []bootstrapCase) {
	b, err := runtime.LookupBootstrap(rt)
	if err != nil {
		t.Fatal(err)
	}
	cmd := b.Command("")
	if _, err := exec.LookPath(cmd[0]); err != nil {
		t.Skipf("%s not installed; the containerd tests cover the bootstrap in an image", cmd[0])
	}
	app := t.TempDir()
	for name, src := range files {
		p := filepath.Join(app, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	script := filepath.Join(t.TempDir(), b.FileName)
	if err := os.WriteFile(script, b.Source, 0o444); err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			argv := b.Command(script)
			cmd := exec.CommandContext(t.Context(), argv[0], argv[1:]...)
			cmd.Dir = app
			cmd.Env = append(os.Environ(), "RELAY_HANDLER="+c.handler)
			event := c.event
			if event == "" {
				event = `{"id":7,"name":"ada"}`
			}
			cmd.Stdin = strings.NewReader(event)
			stdout, stderr, code := testutil.RunCommand(t, cmd)
			if code != c.wantCode {
				t.Errorf("exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", code, c.wantCode, stdout, stderr)
			}
			if !strings.Contains(stdout, c.wantStdout) {
				t.Errorf("stdout lacks %q:\n%s", c.wantStdout, stdout)
			}
			if !strings.Contains(stderr, c.wantStderr) {
				t.Errorf("stderr lacks %q:\n%s", c.wantStderr, stderr)
			}
			lines := strings.Split(strings.TrimRight(stderr, "\n"), "\n")
			if c.wantLast != "" && lines[len(lines)-1] != c.wantLast {
				t.Errorf("last stderr line %q, want %q\nstderr:\n%s", lines[len(lines)-1], c.wantLast, stderr)
			}
			if strings.Contains(stderr, script) {
				t.Errorf("the traceback shows the bootstrap's own frames:\n%s", stderr)
			}
		})
	}
}

func TestPythonBootstrap(t *testing.T) {
	files := map[string]string{
		"handlers.py": `import asyncio, json
def created(event):
    print("sync", json.dumps(event, sort_keys=True), type(event).__name__)
async def later(event):
    await asyncio.sleep(0)
    print("async", event["name"])
def returns_coroutine(event):
    return later(event)
def fails(event):
    helper(event)
def helper(event):
    raise ValueError("cannot handle %d" % event["id"])
async def fails_later(event):
    await asyncio.sleep(0)
    raise RuntimeError("async failure")
def exits(event):
    raise SystemExit(5)
class BadOrder(ValueError):
    relay_permanent = True
def refuses(event):
    raise BadOrder("order %d has no customer" % event["id"])
not_a_function = 3
`,
		"events/created.py":   "def handle(event):\n    print('package path', event['id'])\n",
		"needs_dependency.py": "import relay_no_such_dependency\n",
	}
	runBootstrapCases(t, runtime.RuntimePython3, files, []bootstrapCase{
		{name: "sync", handler: "handlers.created", wantStdout: `sync {"id": 7, "name": "ada"} dict`},
		{name: "async", handler: "handlers.later", wantStdout: "async ada"},
		{name: "returned coroutine", handler: "handlers.returns_coroutine", wantStdout: "async ada"},
		{name: "package path", handler: "events.created.handle", wantStdout: "package path 7"},
		{name: "exception", handler: "handlers.fails", wantCode: 1,
			wantStderr: "handlers.py\", line 12, in helper", wantLast: "ValueError: cannot handle 7"},
		{name: "async exception", handler: "handlers.fails_later", wantCode: 1, wantLast: "RuntimeError: async failure"},
		{name: "handler's own exit code", handler: "handlers.exits", wantCode: 5},
		{name: "permanent failure", handler: "handlers.refuses", wantCode: runtime.ExitPermanent, wantLast: "handlers.BadOrder: order 7 has no customer"},
		{name: "missing module", handler: "nomodule.run", wantCode: 127,
			wantStderr: "relay: handler nomodule.run: module 'nomodule' not found in /"},
		{name: "missing submodule", handler: "events.deleted.handle", wantCode: 127,
			wantStderr: "module 'events.deleted' not found"},
		{name: "missing function", handler: "handlers.absent", wantCode: 127,
			wantLast: "relay: handler handlers.absent: module 'handlers' has no function 'absent'"},
		{name: "not a function", handler: "handlers.not_a_function", wantCode: 127,
			wantLast: "relay: handler handlers.not_a_function: handlers.not_a_function is not a function (it is int)"},
		{name: "missing dependency of the module", handler: "needs_dependency.run", wantCode: 1,
			wantLast: "ModuleNotFoundError: No module named 'relay_no_such_dependency'"},
		{name: "malformed handler", handler: "nodot", wantCode: 2},
		{name: "event not JSON", handler: "handlers.created", event: "not json", wantCode: 2,
			wantStderr: "relay: stdin is not a JSON event"},
	})
}

func TestNodeBootstrap(t *testing.T) {
	files := map[string]string{
		"cjs.js": `exports.created = (event) => { console.log("cjs", JSON.stringify(event), typeof event); };
exports.later = async (event) => { await new Promise((r) => setTimeout(r, 1)); console.log("cjs async", event.name); };
exports.fails = (event) => { throw new TypeError("cannot handle " + event.id); };
exports.linger = () => { setInterval(() => {}, 1000); console.log("left a timer"); };
exports.throwsString = () => { throw "just a string"; };
exports.notAFunction = 3;
exports.refuses = (event) => { throw Object.assign(new Error("order " + event.id + " has no customer"), { relayPermanent: true }); };
`,
		"assigned.cjs": "const h = {}; h.handle = (e) => console.log('module.exports object', e.id); module.exports = h;\n",
		"esm.mjs": `export async function handle(event) { await null; console.log("esm", event.name); }
export const rejects = async (event) => { await null; throw new Error("rejected " + event.id); };
export default { viaDefault(event) { console.log("default export", event.id); } };
`,
		"lib/package.json": `{"type": "module"}`,
		"lib/events.js":    "export function handle(event) { console.log('esm by package.json', event.id); }\n",
		"dir/index.js":     "module.exports.handle = (event) => console.log('index', event.id);\n",
		"broken.mjs":       "import 'relay-no-such-dependency';\nexport const run = () => {};\n",
	}
	runBootstrapCases(t, runtime.RuntimeNode, files, []bootstrapCase{
		{name: "commonjs", handler: "cjs.created", wantStdout: `cjs {"id":7,"name":"ada"} object`},
		{name: "commonjs async", handler: "cjs.later", wantStdout: "cjs async ada"},
		{name: "commonjs assigned exports", handler: "assigned.handle", wantStdout: "module.exports object 7"},
		{name: "esm", handler: "esm.handle", wantStdout: "esm ada"},
		{name: "esm default export object", handler: "esm.viaDefault", wantStdout: "default export 7"},
		{name: "esm by package.json type", handler: "lib/events.handle", wantStdout: "esm by package.json 7"},
		{name: "directory index", handler: "dir.handle", wantStdout: "index 7"},
		{name: "exits despite a pending timer", handler: "cjs.linger", wantStdout: "left a timer"},
		{name: "throw", handler: "cjs.fails", wantCode: 1,
			wantStderr: "TypeError: cannot handle 7\n    at ", wantLast: "relay: handler cjs.fails failed: TypeError: cannot handle 7"},
		{name: "permanent failure", handler: "cjs.refuses", wantCode: runtime.ExitPermanent,
			wantLast: "relay: handler cjs.refuses failed: Error: order 7 has no customer"},
		{name: "rejection", handler: "esm.rejects", wantCode: 1, wantLast: "relay: handler esm.rejects failed: Error: rejected 7"},
		{name: "thrown non-error", handler: "cjs.throwsString", wantCode: 1,
			wantLast: "relay: handler cjs.throwsString failed: thrown 'just a string'"},
		{name: "missing module", handler: "nomodule.run", wantCode: 127, wantStderr: `module "nomodule" not found in `},
		{name: "missing export", handler: "esm.absent", wantCode: 127,
			wantLast: `relay: handler esm.absent: module esm.mjs has no export "absent"`},
		{name: "not a function", handler: "cjs.notAFunction", wantCode: 127,
			wantLast: `relay: handler cjs.notAFunction: export "notAFunction" of cjs.js is number, not a function`},
		{name: "missing dependency of the module", handler: "broken.run", wantCode: 1,
			wantStderr: "relay-no-such-dependency"},
		{name: "module outside the app", handler: "../etc/passwd.x", wantCode: 127},
		{name: "malformed handler", handler: "nodot", wantCode: 2},
		{name: "event not JSON", handler: "esm.handle", event: "not json", wantCode: 2,
			wantStderr: "relay: stdin is not a JSON event"},
	})
}
