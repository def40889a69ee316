package relay_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// TestHelperWorker is not a test: TestWorkerKilledMidHandler runs the test
// binary again with RELAY_HELPER_WORKER set, making this a worker process
// whose handler signals that it started and then blocks until killed.
func TestHelperWorker(t *testing.T) {
	if os.Getenv("RELAY_HELPER_WORKER") == "" {
		t.Skip("helper process only")
	}
	rc := redistest.Connect(t, os.Getenv("RELAY_HELPER_REDIS"))
	streamName, group := os.Getenv("RELAY_HELPER_STREAM"), os.Getenv("RELAY_HELPER_GROUP")
	marker := os.Getenv("RELAY_HELPER_MARKER")
	apps, err := relay.LoadApps(os.Getenv("RELAY_HELPER_APPS"))
	if err != nil {
		t.Fatal(err)
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"users/events.created": func(ctx context.Context, req runtime.Request) error {
			if err := os.WriteFile(marker, []byte(req.MessageID), 0o644); err != nil {
				return err
			}
			select {} // killed here
		},
	})
	e, err := relay.New(apps, relay.Components{
		Source: stream.New(rc, streamName, group, "doomed", stream.WithBlock(50*time.Millisecond)),
		State:  invocation.New(rc), Runner: runner, DLQ: dlq.NewWriter(rc, streamName),
		Stream: streamName, Group: group, Consumer: "doomed",
	}, fastOptions()...)
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Run(context.Background())
}

func TestWorkerKilledMidHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process")
	}
	h := newHarness(t, map[string]string{"users": `
image: x
events:
  - handler: events.created
    pattern: {event_name: [INSERT]}
    timeout: 1s
`})
	appsRoot := t.TempDir()
	if err := os.MkdirAll(filepath.Join(appsRoot, "users"), 0o755); err != nil {
		t.Fatal(err)
	}
	tmpl := "image: x\nevents:\n  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 1s}\n"
	if err := os.WriteFile(filepath.Join(appsRoot, "users", relay.TemplateFile), []byte(tmpl), 0o644); err != nil {
		t.Fatal(err)
	}
	marker := filepath.Join(t.TempDir(), "started")
	id := h.publish("event", `{"event_name":"INSERT"}`)

	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.v")
	cmd.Env = append(os.Environ(), "RELAY_HELPER_WORKER=1",
		"RELAY_HELPER_REDIS="+redistest.Addr(t), "RELAY_HELPER_STREAM="+h.stream, "RELAY_HELPER_GROUP="+h.group,
		"RELAY_HELPER_APPS="+appsRoot, "RELAY_HELPER_MARKER="+marker)
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "handler started in the worker process", func() bool {
		b, err := os.ReadFile(marker)
		return err == nil && string(b) == id
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if !strings.HasPrefix(h.hash(id)["users/events.created"], "running:") {
		t.Fatalf("state after kill = %v, want running", h.hash(id))
	}

	// A second worker takes over after MinPendingIdle and the lease expiry.
	h.handle("users/events.created", nil)
	h.start("c1") // the harness's metrics registry is c1's
	waitFor(t, 20*time.Second, "ack by the survivor", func() bool { return h.settled() })
	runs := h.calls.get("users/events.created")
	if len(runs) != 1 {
		t.Fatalf("survivor ran the handler %d times, want 1", len(runs))
	}
	// The killed run was a real execution: the survivor's is attempt 2.
	if runs[0].Attempt != 2 {
		t.Errorf("survivor ran attempt %d, want 2", runs[0].Attempt)
	}
	if got := h.hash(id)["users/events.created"]; got != "ok" {
		t.Errorf("state = %q, want ok", got)
	}
	if len(h.dlqEntries()) != 0 {
		t.Error("killed-and-recovered invocation was dead-lettered")
	}
	// The lost attempt is counted once, by the claim that charged it.
	if got := sumCounter(t, []*prometheus.Registry{h.reg}, "relay_invocations_total", "lost"); got != 1 {
		t.Errorf(`relay_invocations_total{outcome="lost"} = %d, want 1`, got)
	}
}
