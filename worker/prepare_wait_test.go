package worker_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// gatedPreparer is a Runner whose Prepare of a version of an app (the
// app's name and its env's V) waits until the test opens that version's
// gate, or until its context ends; that of an app without V returns at
// once.
type gatedPreparer struct {
	*sweepingRunner
	mu    sync.Mutex
	gates map[string]chan struct{}
	calls map[string]int
	ended map[string]error // what Prepare returned, once it did
}

func newGatedPreparer(r *sweepingRunner) *gatedPreparer {
	return &gatedPreparer{sweepingRunner: r, gates: map[string]chan struct{}{}, calls: map[string]int{}, ended: map[string]error{}}
}

func (p *gatedPreparer) gate(version string) chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.gates[version] == nil {
		p.gates[version] = make(chan struct{})
	}
	return p.gates[version]
}

// open lets the preparations of version ("app/V") end successfully.
func (p *gatedPreparer) open(version string) { close(p.gate(version)) }

func (p *gatedPreparer) Prepare(ctx context.Context, name string, spec runtime.Spec) error {
	if spec.Env["V"] == "" {
		return nil
	}
	version := name + "/" + spec.Env["V"]
	g := p.gate(version)
	p.mu.Lock()
	p.calls[version]++
	p.mu.Unlock()
	var err error
	select {
	case <-g:
	case <-ctx.Done():
		err = ctx.Err()
	}
	p.mu.Lock()
	p.ended[version] = err
	p.mu.Unlock()
	return err
}

// result returns how many times version was prepared, whether its last
// preparation ended, and what it returned.
func (p *gatedPreparer) result(version string) (calls int, ended bool, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	err, ended = p.ended[version]
	return p.calls[version], ended, err
}

// slowApp's preparation waits for its gate; V tells its versions apart.
func slowApp(v string) string {
	return fmt.Sprintf("image: x\nenv: {V: %q}\nsecrets: [api-key]\nevents:\n  - {handler: events.a, pattern: {kind: [a]}}\n", v)
}

// quickApp's preparation ends at once.
func quickApp(kind string) string {
	return fmt.Sprintf("image: x\nevents:\n  - {handler: events.b, pattern: {kind: [%s]}}\n", kind)
}

// prepareHarness is a worker harness on an apps root holding slow (V=1)
// and quick, whose Runner prepares with a gatedPreparer and whose start
// and reloads wait 100ms for preparations.
func prepareHarness(t *testing.T) (*workerHarness, string, *gatedPreparer) {
	t.Helper()
	h := newWorkerHarness(t, "events")
	root := testutil.AppsRoot(t, map[string]string{"slow": slowApp("1"), "quick": quickApp("b")})
	h.cfg.Apps = template.Dir(root)
	h.cfg.ReloadInterval = time.Hour
	h.cfg.PrepareWait = 100 * time.Millisecond
	ok := func(context.Context, runtime.Request) error { return nil }
	h.runner.Runner = recordingRunner{h.calls, runtime.NewFunc(map[string]runtime.HandlerFunc{"slow/events.a": ok, "quick/events.b": ok})}
	p := newGatedPreparer(h.runner)
	h.cfg.Runner = p
	return h, root, p
}

// pending returns how many messages of h's stream are pending.
func (h *workerHarness) pending() int64 {
	h.t.Helper()
	n, _, err := redisstream.New(h.cfg.Redis, h.streams[0], "workers", "probe").Pending(context.Background())
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

// TestStartDoesNotWaitForASlowPreparation: at start, an app whose
// preparation outlasts PrepareWait is unavailable as being prepared, its
// message pending, while another app's message is handled and
// acknowledged; when the preparation ends, the worker reloads, uses its
// result without preparing again, and the held message is handled. Being
// prepared is logged once, at INFO, and counted as no reload error.
func TestStartDoesNotWaitForASlowPreparation(t *testing.T) {
	h, _, p := prepareHarness(t)
	w, stop := h.run()
	defer stop()
	h.publish(`{"kind":"a"}`)
	h.publish(`{"kind":"b"}`)
	testutil.WaitFor(t, 10*time.Second, "quick's message handled while slow is prepared", func() bool {
		return h.calls.Count("quick/events.b") == 1
	})
	testutil.WaitFor(t, 10*time.Second, "quick's message acknowledged, slow's pending", func() bool { return h.pending() == 1 })
	if n := h.calls.Count("slow/events.a"); n != 0 {
		t.Fatalf("slow's handler ran %d times before its preparation ended", n)
	}
	if a := w.Apps().Get("slow"); a.Available() || !strings.Contains(a.Errors.Error(), "app being prepared") {
		t.Errorf("slow while prepared: errors %q, want unavailable as being prepared", a.Errors.Error())
	}

	p.open("slow/1")
	testutil.WaitFor(t, 10*time.Second, "slow's message handled once prepared", func() bool {
		return h.calls.Count("slow/events.a") == 1 && h.pending() == 0
	})
	logs := h.logs.String()
	if n := strings.Count(logs, `level=INFO msg="app being prepared; its messages wait" app=slow`); n != 1 {
		t.Errorf("slow logged as being prepared %d times, want once at INFO", n)
	}
	if !strings.Contains(logs, `msg="app loaded" app=slow`) || strings.Contains(logs, "not ready") {
		t.Errorf("slow not logged loaded once prepared, or logged not ready:\n%s", logs)
	}
	if calls, _, _ := p.result("slow/1"); calls != 1 {
		t.Errorf("slow prepared %d times, want once: the reload after it ended uses its result", calls)
	}
	if c := h.counter("relay_app_reload_errors_total"); c != 0 {
		t.Errorf("relay_app_reload_errors_total = %v, want 0: being prepared is no error", c)
	}
}

// TestReloadDoesNotWaitForASlowPreparation: an edit of an app whose
// preparation outlasts PrepareWait leaves its previous version serving;
// an edit of another app meanwhile is served without waiting for it; a
// further edit of the first app cancels the stale preparation and starts
// its own, whose version serves once it ends.
func TestReloadDoesNotWaitForASlowPreparation(t *testing.T) {
	h, root, p := prepareHarness(t)
	p.open("slow/1")
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "slow served", func() bool {
		return w.Apps() != nil && w.Apps().Get("slow").Available()
	})

	writeTemplate(t, root, "slow", slowApp("2"))
	testutil.WaitFor(t, 10*time.Second, "slow's edit being prepared", func() bool {
		return strings.Contains(h.logs.String(), `level=INFO msg="app being prepared; its previous version keeps serving" app=slow`)
	})
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 10*time.Second, "slow's previous version handling its event", func() bool {
		return h.calls.Count("slow/events.a") == 1
	})
	if v := h.calls.Get("slow/events.a")[0].Spec.Env["V"]; v != "1" {
		t.Errorf("slow's event handled by version %q, want 1 while 2 is prepared", v)
	}

	writeTemplate(t, root, "quick", quickApp("c"))
	testutil.WaitFor(t, 10*time.Second, "quick's edit served while slow's is prepared", func() bool {
		return strings.Contains(w.Apps().Get("quick").Rules[0].Pattern.String(), `"c"`)
	})
	h.publish(`{"kind":"c"}`)
	testutil.WaitFor(t, 10*time.Second, "quick's edited rule handling its event", func() bool {
		return h.calls.Count("quick/events.b") == 1
	})
	if v := w.Apps().Get("slow").Spec.Env["V"]; v != "1" {
		t.Errorf("slow serving version %q, want 1 while 2 is prepared", v)
	}

	writeTemplate(t, root, "slow", slowApp("3"))
	testutil.WaitFor(t, 10*time.Second, "slow's third version being prepared, the stale preparation cancelled", func() bool {
		_, ended, err := p.result("slow/2")
		return ended && err == context.Canceled &&
			strings.Count(h.logs.String(), `msg="app being prepared; its previous version keeps serving" app=slow`) == 2
	})
	p.open("slow/3")
	testutil.WaitFor(t, 10*time.Second, "slow's third version served", func() bool {
		return w.Apps().Get("slow").Spec.Env["V"] == "3"
	})
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 10*time.Second, "slow's third version handling its event", func() bool {
		return h.calls.Count("slow/events.a") == 2
	})
	if v := h.calls.Get("slow/events.a")[1].Spec.Env["V"]; v != "3" {
		t.Errorf("slow's second event handled by version %q, want 3", v)
	}
	logs := h.logs.String()
	if n := strings.Count(logs, `msg="app being prepared; its previous version keeps serving" app=slow`); n != 2 {
		t.Errorf("slow logged as being prepared %d times, want once for each of versions 2 and 3", n)
	}
	if !strings.Contains(logs, `msg="app changed" app=slow`) {
		t.Error("slow's third version not logged as changed")
	}
	if calls, _, _ := p.result("slow/3"); calls != 1 {
		t.Errorf("slow's third version prepared %d times, want once", calls)
	}
	if c := h.counter("relay_app_reload_errors_total"); c != 0 {
		t.Errorf("relay_app_reload_errors_total = %v, want 0", c)
	}
}

// TestStopDuringABackgroundPreparation: a worker stopped while an app's
// preparation runs in the background (the worker consuming meanwhile)
// cancels it, waits for it, and returns nil without logging the app loaded
// or not ready.
func TestStopDuringABackgroundPreparation(t *testing.T) {
	h, _, p := prepareHarness(t)
	_, stop := h.run()
	h.publish(`{"kind":"b"}`)
	testutil.WaitFor(t, 10*time.Second, "quick's message handled while slow is prepared", func() bool {
		return h.calls.Count("quick/events.b") == 1
	})
	if calls, ended, _ := p.result("slow/1"); calls != 1 || ended {
		t.Fatalf("slow's preparation: %d calls, ended %v; want one running", calls, ended)
	}

	stopWithin(t, stop, "a preparation ran")
	if _, ended, err := p.result("slow/1"); !ended || err != context.Canceled {
		t.Errorf("slow's preparation when Run returned: ended %v with %v, want cancelled and waited for", ended, err)
	}
	logs := h.logs.String()
	if strings.Contains(logs, `msg="app loaded" app=slow`) || strings.Contains(logs, "not ready") {
		t.Errorf("a preparation cut short by the stop was logged as loaded or not ready:\n%s", logs)
	}
}

// TestReloadServesANewAppWhileAnotherIsPrepared: a reload that finds one
// app's new version slow to prepare (a hung pull, a long build) and a new
// app that is quick to prepare serves the new app without waiting for the
// other, even with a PrepareWait of a minute: a new app's events are
// matched only once it is served, so waiting would leave them to be
// acknowledged unmatched (docs/apps.md#changing-apps).
func TestReloadServesANewAppWhileAnotherIsPrepared(t *testing.T) {
	h, root, p := prepareHarness(t)
	h.cfg.PrepareWait = time.Minute
	p.open("slow/1")
	p.open("fresh/1")
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "slow served", func() bool {
		return w.Apps() != nil && w.Apps().Get("slow").Available()
	})

	writeTemplate(t, root, "slow", slowApp("2")) // its preparation waits for the test
	writeTemplate(t, root, "fresh", strings.ReplaceAll(slowApp("1"), "[a]", "[f]"))
	testutil.WaitFor(t, 20*time.Second, "fresh served while slow's edit is prepared", func() bool {
		a := w.Apps().Get("fresh")
		return a != nil && a.Available()
	})
	if _, ended, _ := p.result("slow/2"); ended {
		t.Fatal("slow's second version ended its preparation: the test proves nothing")
	}
	if v := w.Apps().Get("slow").Spec.Env["V"]; v != "1" {
		t.Errorf("slow serving version %q while 2 is prepared, want 1", v)
	}
	testutil.WaitFor(t, 10*time.Second, "slow's edit logged as being prepared after the reload's wait", func() bool {
		return strings.Contains(h.logs.String(), `msg="app being prepared; its previous version keeps serving" app=slow waited=1s`)
	})
}

// stopWithin stops a worker with stop and fails t unless Run returns nil
// within 30 s; while says what the worker was doing.
func stopWithin(t *testing.T, stop func() error, while string) {
	t.Helper()
	stopped := make(chan error, 1)
	go func() { stopped <- stop() }()
	select {
	case err := <-stopped:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("the worker did not stop while %s", while)
	}
}
