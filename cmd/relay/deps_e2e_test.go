package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/depstest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

// depsSecret is the value of the api-key secret: it must appear nowhere
// Relay writes.
const depsSecret = "k3y-9f1c2b7e-never-written-down"

const depsPythonHandler = `import os
import relaydemo

def hello(event):
    key = open("/run/secrets/api-key").read()
    print(relaydemo.greet(event["name"]), "key bytes", len(key))
    if any(key in v for v in os.environ.values()):
        print("secret in env")
    if event.get("fail"):
        raise RuntimeError("failing on purpose for " + event["name"])
`

const depsNodeHandler = `const isNumber = require("is-number");
exports.check = (event) => { console.log("is-number says", isNumber(event.id), isNumber(event.name)); };
`

// startWorker runs relay start with env until stop is called; it waits for
// "worker started".
func startWorker(t *testing.T, bin string, env []string) (out *testutil.Buffer, stop func()) {
	t.Helper()
	cmd := exec.Command(bin, "start")
	cmd.Env = append(os.Environ(), env...)
	out = &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-exited:
			if err != nil {
				t.Errorf("relay start exited with %v after SIGTERM", err)
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("relay start did not stop after SIGTERM")
		}
	}
	t.Cleanup(func() {
		stop()
		if t.Failed() {
			t.Logf("relay start output:\n%s", out)
		}
	})
	testutil.WaitFor(t, 5*time.Minute, "worker started", func() bool { return strings.Contains(out.String(), "worker started") })
	return out, stop
}

// TestStartDependenciesAndSecrets runs relay start on a python3 app whose
// requirements.txt installs a wheel from the app's directory and which
// reads a secret, a node app installing a real package from the npm
// registry, and an app whose manifest cannot be installed. The handlers
// import their packages; the broken app is unavailable with pip's error
// and its message stays pending, never dead-lettered; a second start
// reuses both dependency images without building; the secret's value is in
// no log line, DLQ entry, trace or app inspect output, nor in the
// handler's environment.
func TestStartDependenciesAndSecrets(t *testing.T) {
	cc := containerdtest.Client(t)
	containerdtest.ImportArchive(t, cc, containerdtest.EnvPythonArchive, containerdtest.PythonImage)
	containerdtest.ImportArchive(t, cc, containerdtest.EnvNodeArchive, containerdtest.NodeImage)
	bin := buildRelay(t)

	apps := t.TempDir()
	depstest.PythonApp(t, filepath.Join(apps, "pydeps"), map[string]string{
		"handlers.py": depsPythonHandler,
		"template.yaml": "runtime: python3\nimage: " + containerdtest.PythonImage + "\nsecrets: [api-key]\n" +
			"events:\n  - handler: handlers.hello\n    pattern: {table_name: [people]}\n    retries: 0\n    timeout: 30s\n",
	})
	depstest.NodeApp(t, filepath.Join(apps, "nodedeps"), map[string]string{
		"handlers.js": depsNodeHandler,
		"template.yaml": "runtime: node\nimage: " + containerdtest.NodeImage + "\n" +
			"events:\n  - handler: handlers.check\n    pattern: {table_name: [numbers]}\n    timeout: 30s\n",
	})
	depstest.WriteFiles(t, filepath.Join(apps, "broken"), map[string]string{
		"requirements.txt": "--no-index\nnosuchpackage==1.0\n",
		"handlers.py":      "def hello(event):\n    print('never runs')\n",
		"template.yaml": "runtime: python3\nimage: " + containerdtest.PythonImage + "\n" +
			"events:\n  - handler: handlers.hello\n    pattern: {table_name: [broken]}\n",
	})
	secrets := t.TempDir()
	if err := os.WriteFile(filepath.Join(secrets, "api-key"), []byte(depsSecret), 0o600); err != nil {
		t.Fatal(err)
	}

	traces, endpoint := serveOTLPHTTP(t)
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "events")
	env := []string{
		"REDIS_URI=" + redistest.Addr(t), "REDIS_STREAM=" + streamName, "REDIS_GROUP=relay",
		"RELAY_APPS=" + apps, "RELAY_CONSUMER=deps", "RELAY_STATE_DIR=" + t.TempDir(),
		"CONTAINERD_NAMESPACE=" + cc.DefaultNamespace(), "LOG_LEVEL=debug", "RELAY_SECRETS_DIR=" + secrets,
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + endpoint, "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf", "OTEL_BSP_SCHEDULE_DELAY=100",
	}
	if ca := depstest.CAFile(); ca != "" {
		env = append(env, "RELAY_BUILD_CA_FILE="+ca)
	}
	out1, stop1 := startWorker(t, bin, env)
	// The worker starts consuming after at most 10s of preparations; the
	// builds still running go on in the background.
	testutil.WaitFor(t, 5*time.Minute, "the builds to end", func() bool {
		for _, want := range []string{"dependency image built", "app=pydeps", "app=nodedeps", "app unavailable: not ready", "nosuchpackage"} {
			if !strings.Contains(out1.String(), want) {
				return false
			}
		}
		return true
	})

	src := redisstream.New(rc, streamName, "relay", "publisher")
	ctx := context.Background()
	for _, ev := range []string{
		`{"table_name":"people","name":"ada"}`,
		`{"table_name":"people","name":"bob","fail":true}`,
		`{"table_name":"numbers","id":5,"name":"five"}`,
		`{"table_name":"broken"}`,
	} {
		if _, err := src.Publish(ctx, map[string]string{"event": ev}); err != nil {
			t.Fatal(err)
		}
	}
	store := redisdlq.NewStore(rc, streamName)
	testutil.WaitFor(t, 2*time.Minute, "handlers ran and the failure was dead-lettered", func() bool {
		n, _ := store.Len(ctx)
		s := out1.String()
		return n == 1 && strings.Contains(s, "[pydeps/handlers.hello] "+depstest.WheelGreeting+"ada key bytes "+fmt.Sprint(len(depsSecret))) &&
			strings.Contains(s, "[nodedeps/handlers.check] is-number says true false")
	})
	testutil.WaitFor(t, 30*time.Second, "only the broken app's message pending", func() bool {
		n, _, err := src.Pending(ctx)
		return err == nil && n == 1
	})
	if strings.Contains(out1.String(), "never runs") || strings.Contains(out1.String(), "secret in env") {
		t.Errorf("unexpected handler output:\n%s", out1)
	}
	entries, err := store.List(ctx, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].App != "pydeps" {
		t.Fatalf("DLQ = %+v, want the pydeps failure only", entries)
	}
	stop1()

	out2, stop2 := startWorker(t, bin, env)
	testutil.WaitFor(t, 2*time.Minute, "the preparations to end", func() bool {
		s := out2.String()
		return strings.Contains(s, "app unavailable: not ready") &&
			strings.Count(s, `msg="dependency image cached; not rebuilding"`) >= 2
	})
	stop2()
	// The broken app builds again (a new process tries a failed manifest
	// once more); the others are cache hits.
	for _, line := range strings.Split(out2.String(), "\n") {
		if strings.Contains(line, "building dependency image") && !strings.Contains(line, "app=broken") {
			t.Errorf("second start rebuilt: %s", line)
		}
	}
	for _, a := range []string{"pydeps", "nodedeps"} {
		if !strings.Contains(out2.String(), `msg="dependency image cached; not rebuilding" app=`+a) {
			t.Errorf("second start: no cache hit logged for %s", a)
		}
	}

	var inspect strings.Builder
	for _, args := range [][]string{{"app", "inspect", "pydeps"}, {"app", "inspect", "pydeps", "--json"}, {"app", "inspect", "nodedeps", "--json"}} {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), env...)
		b, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("relay %v: %v\n%s", args, err, b)
		}
		inspect.Write(b)
		if args[len(args)-1] == "--json" {
			var got struct {
				Secrets []string `json:"secrets"`
				Deps    *struct {
					Image     string `json:"image"`
					Built     bool   `json:"built"`
					SizeBytes int64  `json:"size_bytes"`
					BuiltAt   string `json:"built_at"`
				} `json:"dependencies"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if got.Deps == nil || !got.Deps.Built || got.Deps.SizeBytes <= 0 || got.Deps.BuiltAt == "" || !strings.HasPrefix(got.Deps.Image, "relay.local/deps:") {
				t.Errorf("relay %v: dependencies %+v", args, got.Deps)
			}
		}
	}
	if !strings.Contains(inspect.String(), "api-key") {
		t.Errorf("app inspect does not name the secret:\n%s", inspect.String())
	}

	// The console's Apps page shows the same dependency images, built.
	page := consolePage(t, bin, env, "/apps")
	if n := strings.Count(page, `<span class="badge good">built</span> <code>relay.local/deps:`); n != 2 {
		t.Errorf("console apps page: %d built dependency images, want 2 (pydeps, nodedeps):\n%s", n, page)
	}
	if !strings.Contains(page, `<dd class="secrets"><code>api-key</code>`) {
		t.Errorf("console apps page does not name the secret:\n%s", page)
	}

	dlqJSON, _ := json.Marshal(entries)
	_, spans, _ := traces.snapshot()
	places := map[string]string{
		"first start's output":  out1.String(),
		"second start's output": out2.String(),
		"DLQ entries":           string(dlqJSON),
		"traces":                fmt.Sprint(spans),
		"app inspect":           inspect.String(),
		"console apps page":     page,
	}
	for where, text := range places {
		if strings.Contains(text, depsSecret) {
			t.Errorf("the secret's value is in the %s", where)
		}
	}
	if len(spans) == 0 {
		t.Error("no spans exported: the traces were not checked")
	}
}

// consolePage runs relay console with env, read-only, and returns the page
// at path once it answers.
func consolePage(t *testing.T, bin string, env []string, path string) string {
	t.Helper()
	addr := "127.0.0.1:" + fmt.Sprint(testutil.FreePort(t))
	cmd := exec.Command(bin, "console", "--read-only", "--listen", addr)
	cmd.Env = append(os.Environ(), env...)
	var out testutil.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}()
	var body string
	testutil.WaitFor(t, 30*time.Second, "relay console to answer", func() bool {
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		body = string(b)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("relay console %s: status %d\n%s\n%s", path, resp.StatusCode, body, out.String())
		}
		return true
	})
	return body
}
