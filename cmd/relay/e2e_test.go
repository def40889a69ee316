package main

import (
	"bytes"
	"context"
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
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// buildRelay compiles the binary under test and, next to it as make build
// puts it, the static exec helper that relay start uses.
func buildRelay(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "relay")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	helper := exec.Command("go", "build", "-o", filepath.Join(filepath.Dir(bin), "relay-exec"), "../relay-exec")
	helper.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := helper.CombinedOutput(); err != nil {
		t.Fatalf("go build relay-exec: %v\n%s", err, out)
	}
	return bin
}

// TestStartEndToEnd runs the relay binary against a real redis-server and
// containerd with the example apps: a matching event runs its handler in a
// container and is acked; a failing rule with retries: 0 is dead-lettered
// once; SIGTERM stops the worker with exit 0 and no container left.
func TestStartEndToEnd(t *testing.T) {
	cc := containerdtest.Client(t)
	bin := buildRelay(t)
	apps, err := filepath.Abs("../../examples/apps")
	if err != nil {
		t.Fatal(err)
	}
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "events")
	cmd := exec.Command(bin, "start")
	cmd.Env = append(os.Environ(),
		"REDIS_URI="+redistest.Addr(t), "REDIS_STREAM="+streamName, "REDIS_GROUP=relay",
		"RELAY_APPS="+apps, "RELAY_CONSUMER=e2e", "RELAY_STATE_DIR="+t.TempDir(),
		"CONTAINERD_NAMESPACE="+cc.DefaultNamespace(), "LOG_LEVEL=debug")
	stdout, stderr := &testutil.Buffer{}, &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = stdout, stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		if t.Failed() {
			t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
		}
	})
	testutil.WaitFor(t, 30*time.Second, "worker started", func() bool { return strings.Contains(stderr.String(), "worker started") })

	src := redisstream.New(rc, streamName, "relay", "publisher")
	ctx := context.Background()
	okID, err := src.Publish(ctx, map[string]string{"event": `{"event_name":"INSERT","table_name":"users","new_image":{"id":42,"email":"ada@example.com"}}`})
	if err != nil {
		t.Fatal(err)
	}
	failID, err := src.Publish(ctx, map[string]string{"event": `{"event_name":"INSERT","table_name":"invoices","new_image":{"id":7}}`})
	if err != nil {
		t.Fatal(err)
	}
	store := redisdlq.NewStore(rc, streamName)
	testutil.WaitFor(t, 60*time.Second, "handler output and DLQ entry", func() bool {
		n, _ := store.Len(ctx)
		return n == 1 && strings.Contains(stdout.String(), "[users/events.created] welcome user ada@example.com (message "+okID)
	})
	testutil.WaitFor(t, 30*time.Second, "both messages acked", func() bool {
		n, _, err := src.Pending(ctx)
		return err == nil && n == 0 && strings.Contains(stderr.String(), "message acknowledged")
	})
	entries, err := store.List(ctx, dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	e := entries[0]
	if e.OriginalID != failID || e.App != "billing" || e.Handler != "invoices.charge" || e.HandlerAttempts != 1 ||
		e.Reason != "handler exited with code 3: billing: payment provider unreachable (demo failure), giving up" || e.Consumer != "e2e" {
		t.Errorf("DLQ entry = %+v", e)
	}
	if !strings.Contains(stdout.String(), "[billing/invoices.charge] charging invoice") {
		t.Errorf("failing handler's output not forwarded:\n%s", stdout)
	}
	if log := stderr.String(); strings.Contains(log, "exec helper cannot be used") || strings.Contains(log, "no relay-exec") {
		t.Errorf("relay start did not use the relay-exec next to it:\n%s", log)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-exited:
		if err != nil {
			t.Errorf("relay start exited with %v after SIGTERM, want 0", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("relay start did not stop after SIGTERM")
	}
	containerdtest.AssertClean(t, cc)
}

func TestStartConfigErrors(t *testing.T) {
	var out, errb bytes.Buffer
	t.Setenv("REDIS_URI", "")
	t.Setenv("REDIS_STREAM", "")
	t.Setenv("REDIS_GROUP", "")
	code := run(context.Background(), []string{"start"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "missing required configuration: REDIS_URI") {
		t.Errorf("code %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	code = run(context.Background(), []string{"start", "--log-level", "loud", "--redis-uri", "x:1", "--stream", "s", "--group", "g"}, &out, &errb)
	if code != exitUsage || !strings.Contains(errb.String(), "--log-level") {
		t.Errorf("bad log level: code %d, stderr %q", code, errb.String())
	}
	if n := strings.Count(errb.String(), "relay:"); n != 1 {
		t.Errorf("error printed %d times: %q", n, errb.String())
	}
	// A bad size names the flag, and the variable when it came from there.
	errb.Reset()
	code = run(context.Background(), []string{"start", "--max-event-bytes", "1MB"}, &out, &errb)
	if want := `--max-event-bytes: size "1MB" must be a positive whole number with a unit`; code != exitUsage || !strings.Contains(errb.String(), want) {
		t.Errorf("bad --max-event-bytes: code %d, stderr %q, want %q", code, errb.String(), want)
	}
	errb.Reset()
	t.Setenv("MAX_EVENT_BYTES", "2mb")
	code = run(context.Background(), []string{"start"}, &out, &errb)
	if want := `(from envar MAX_EVENT_BYTES="2mb")`; code != exitUsage || !strings.Contains(errb.String(), want) {
		t.Errorf("bad MAX_EVENT_BYTES: code %d, stderr %q, want %q", code, errb.String(), want)
	}
}

func TestValidate(t *testing.T) {
	root := t.TempDir()
	write := func(app, src string) {
		if err := os.MkdirAll(filepath.Join(root, app), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, app, "template.yaml"), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("good", "image: x\nevents: [{handler: a.b, pattern: {k: [v]}}]\n")
	var out, errb bytes.Buffer
	if code := run(context.Background(), []string{"validate", "--apps", root}, &out, &errb); code != exitOK {
		t.Fatalf("valid apps: code %d, %s %s", code, out.String(), errb.String())
	}
	write("bad", "image: x\nevents:\n  - handler: a.b\n    pattern:\n      status: COMPLETED\n      id: [{prefx: u}]\n")
	out.Reset()
	errb.Reset()
	code := run(context.Background(), []string{"validate", "--apps", root}, &out, &errb)
	want := "bad/template.yaml:5:15: events[0].pattern.status: a condition is a list of alternatives, not a scalar: write status: [COMPLETED]\n" +
		"bad/template.yaml:6:13: events[0].pattern.id[0].prefx: unknown operator \"prefx\": did you mean \"prefix\"?\n"
	if code != exitFailure || out.String() != want {
		t.Errorf("code %d, output:\n%s\nwant:\n%s", code, out.String(), want)
	}
	if errb.String() != "relay: 2 template errors\n" {
		t.Errorf("stderr = %q", errb.String())
	}
}
