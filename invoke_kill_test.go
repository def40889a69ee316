package relay_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
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
	apps, err := template.LoadDir(os.Getenv("RELAY_HELPER_APPS"))
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
	var mods []func(*timing)
	if w := os.Getenv("RELAY_HELPER_CONCURRENCY_WAIT"); w != "" {
		d, err := time.ParseDuration(w)
		if err != nil {
			t.Fatal(err)
		}
		mods = append(mods, func(tm *timing) { tm.concurrencyWait = d })
	}
	e, err := relay.NewEngine(apps, relay.Components{
		Source: redisstream.New(rc, streamName, group, "doomed", redisstream.WithBlock(50*time.Millisecond)),
		State:  redisstate.New(rc), Runner: runner,
		Stream: streamName, Group: group, Consumer: "doomed",
	}, fastConfig(mods...))
	if err != nil {
		t.Fatal(err)
	}
	_ = e.Run(context.Background())
}

// startDoomed runs TestHelperWorker as consumer "doomed" in a process of
// its own, on apps written from templates (name → template.yaml). Its
// handler users/events.created writes the message id to the returned
// marker file and then blocks until the process is killed.
func startDoomed(t *testing.T, h *harness, templates map[string]string, env ...string) (cmd *exec.Cmd, marker string) {
	t.Helper()
	appsRoot := t.TempDir()
	for name, tmpl := range templates {
		if err := os.MkdirAll(filepath.Join(appsRoot, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(appsRoot, name, app.TemplateFile), []byte(tmpl), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	marker = filepath.Join(t.TempDir(), "started")
	cmd = exec.Command(os.Args[0], "-test.run=^TestHelperWorker$", "-test.v")
	cmd.Env = append(os.Environ(), "RELAY_HELPER_WORKER=1",
		"RELAY_HELPER_REDIS="+redistest.Addr(t), "RELAY_HELPER_STREAM="+h.stream, "RELAY_HELPER_GROUP="+h.group,
		"RELAY_HELPER_APPS="+appsRoot, "RELAY_HELPER_MARKER="+marker)
	cmd.Env = append(cmd.Env, env...)
	out := &testutil.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("doomed worker output:\n%s", out)
		}
	})
	return cmd, marker
}

// kill SIGKILLs the doomed worker once its handler started on message id.
func kill(t *testing.T, cmd *exec.Cmd, marker, id string) {
	t.Helper()
	testutil.WaitFor(t, 20*time.Second, "handler started in the worker process", func() bool {
		b, err := os.ReadFile(marker)
		return err == nil && string(b) == id
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
}

func TestWorkerKilledMidHandler(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process")
	}
	const tmpl = "image: x\nevents:\n  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 1s}\n"
	h := newHarness(t, map[string]string{"users": tmpl})
	id := h.publish("event", `{"event_name":"INSERT"}`)
	cmd, marker := startDoomed(t, h, map[string]string{"users": tmpl})
	kill(t, cmd, marker, id)
	if !strings.HasPrefix(h.hash(id)["users/events.created"], "running:") {
		t.Fatalf("state after kill = %v, want running", h.hash(id))
	}

	// A second worker takes over after MinPendingIdle and the lease expiry.
	h.handle("users/events.created", nil)
	h.start("c1") // the harness's metrics registry is c1's
	testutil.WaitFor(t, 20*time.Second, "ack by the survivor", func() bool { return h.settled() })
	runs := h.calls.Get("users/events.created")
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

// TestWorkerKilledWhileWaitingForASlotChargesNothing: with the app's one
// slot taken by a handler, a second message waits for it. The waiting
// invocation holds no claim, so when the worker is killed only the
// attempt that ran is charged: the attempt count is the number of handler
// runs (docs/delivery.md#attempts-retries-backoff), even with retries: 0. A
// first delivery takes the slot before claiming; a redelivery, which may
// find state, claims first and gives the claim back for the wait.
func TestWorkerKilledWhileWaitingForASlotChargesNothing(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process")
	}
	for _, redelivered := range []bool{false, true} {
		t.Run(fmt.Sprintf("redelivered=%v", redelivered), func(t *testing.T) {
			const tmpl = "image: x\nconcurrency: 1\nevents:\n  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 1s, retries: 0}\n"
			h := newHarness(t, map[string]string{"users": tmpl})
			first := h.publish("event", `{"event_name":"INSERT","n":1}`)
			second := h.publish("event", `{"event_name":"INSERT","n":2}`)
			if redelivered {
				// A consumer that dies at once: the doomed worker reclaims
				// both, so they reach it as redeliveries.
				cmd := h.rc.B().Xreadgroup().Group(h.group, "ghost").Count(2).Streams().Key(h.stream).Id(">").Build()
				if err := h.rc.Do(t.Context(), cmd).Error(); err != nil {
					t.Fatal(err)
				}
			}
			// A wait far longer than the test: a claim held through it would stay.
			cmd, marker := startDoomed(t, h, map[string]string{"users": tmpl}, "RELAY_HELPER_CONCURRENCY_WAIT=1h")
			// Either message may get the slot.
			var running, waiting string
			testutil.WaitFor(t, 20*time.Second, "a handler started in the doomed worker", func() bool {
				b, err := os.ReadFile(marker)
				running = string(b)
				return err == nil && (running == first || running == second)
			})
			waiting = first
			if running == first {
				waiting = second
			}
			testutil.WaitFor(t, 20*time.Second, "the waiting message delivered to the doomed worker, without a claim", func() bool {
				claimed := strings.HasPrefix(h.hash(waiting)["users/events.created"], "running:")
				return h.owner(waiting) == "doomed" && !claimed
			})
			kill(t, cmd, marker, running)

			h.handle("users/events.created", nil)
			h.start("c1")
			testutil.WaitFor(t, 20*time.Second, "ack by the survivor", func() bool { return h.settled() })
			runs := h.calls.Get("users/events.created")
			if len(runs) != 1 || runs[0].MessageID != waiting || runs[0].Attempt != 1 {
				t.Fatalf("survivor runs = %+v, want only attempt 1 of %s", runs, waiting)
			}
			// The killed run used the only attempt of the first message.
			es := h.dlqEntries()
			if len(es) != 1 || es[0].OriginalID != running || es[0].HandlerAttempts != 1 {
				t.Errorf("DLQ entries = %+v, want one for %s after 1 attempt", es, running)
			}
		})
	}
}

// owner returns the consumer whose PEL holds id, "" when it is not pending.
func (h *harness) owner(id string) string {
	h.t.Helper()
	rows, err := h.rc.Do(context.Background(), h.rc.B().Xpending().Key(h.stream).Group(h.group).Start(id).End(id).Count(1).Build()).ToArray()
	if err != nil {
		h.t.Fatal(err)
	}
	if len(rows) == 0 {
		return ""
	}
	row, err := rows[0].ToArray()
	if err != nil || len(row) < 2 {
		h.t.Fatalf("XPENDING row for %s: %v", id, err)
	}
	c, _ := row[1].ToString()
	return c
}

// TestRedeliveryRunsWhatTheFirstDeliveryMatched: a worker is killed while
// the first of a message's two invocations runs, before it could claim
// the second. The templates then change so that the event no longer
// matches either rule, and matches a new one. The redelivery runs exactly
// what the first delivery matched: the first invocation again (its lost
// attempt charged) and the second, never claimed, as attempt 1; the new
// rule does not run for this message (docs/delivery.md#from-entry-to-acknowledgement).
func TestRedeliveryRunsWhatTheFirstDeliveryMatched(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a worker process")
	}
	const before = `image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}, timeout: 1s}
  - {handler: events.audited, pattern: {event_name: [INSERT]}, timeout: 1s}
`
	const after = `image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT], table_name: [orders]}, timeout: 1s}
  - {handler: events.audited, pattern: {event_name: [INSERT], table_name: [orders]}, timeout: 1s}
  - {handler: events.new, pattern: {event_name: [INSERT]}, timeout: 1s}
`
	h := newHarness(t, map[string]string{"users": after})
	id := h.publish("event", `{"event_name":"INSERT"}`)
	cmd, marker := startDoomed(t, h, map[string]string{"users": before})
	kill(t, cmd, marker, id)
	st := h.hash(id)
	if !strings.HasPrefix(st["users/events.created"], "running:") || !strings.HasPrefix(st["users/events.audited"], "next_attempt_at:") ||
		st["__matched"] != "1" {
		t.Fatalf("state after the kill = %v; want the first running, the second recorded, the record complete", st)
	}

	for _, k := range []string{"users/events.created", "users/events.audited", "users/events.new"} {
		h.handle(k, nil)
	}
	h.start("c1")
	testutil.WaitFor(t, 20*time.Second, "ack by the survivor", func() bool { return h.settled() })
	created, audited := h.calls.Get("users/events.created"), h.calls.Get("users/events.audited")
	if len(created) != 1 || created[0].Attempt != 2 {
		t.Errorf("events.created ran %+v, want once, as attempt 2", created)
	}
	if len(audited) != 1 || audited[0].Attempt != 1 {
		t.Errorf("events.audited ran %+v, want once, as attempt 1", audited)
	}
	if n := h.calls.Count("users/events.new"); n != 0 {
		t.Errorf("events.new, which the first delivery did not match, ran %d times", n)
	}
	if len(h.dlqEntries()) != 0 {
		t.Errorf("dead letters: %+v", h.dlqEntries())
	}
}
