package worker_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

const invoicesApp = `
image: x
events:
  - {handler: invoices.charge, pattern: {kind: [invoice]}}
`

// reloadHarness is a worker harness on a real apps root, reloaded only by
// its watch (the periodic rescan is an hour away) unless a test says so.
func reloadHarness(t *testing.T) (*workerHarness, string) {
	t.Helper()
	h := newWorkerHarness(t, "events")
	root := testutil.AppsRoot(t, map[string]string{"users": workerApp()})
	h.cfg.Apps = template.Dir(root)
	h.cfg.ReloadInterval = time.Hour
	handlers := map[string]runtime.HandlerFunc{}
	for _, k := range []string{"users/events.created", "users/events.audited", "users/jobs.tick", "billing/invoices.charge"} {
		handlers[k] = func(context.Context, runtime.Request) error { return nil }
	}
	h.runner.Runner = recordingRunner{h.calls, runtime.NewFunc(handlers)}
	return h, root
}

// recordingRunner records every request before running it.
type recordingRunner struct {
	calls *apptest.Calls
	r     relay.Runner
}

func (r recordingRunner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	r.calls.Add(req)
	return r.r.Run(ctx, req)
}

func writeTemplate(t *testing.T, root, name, src string) {
	t.Helper()
	dir := filepath.Join(root, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	// Write then rename, as an editor or a checkout does, so the watch
	// never reads a half-written file.
	tmp := filepath.Join(dir, ".template.yaml.tmp")
	if err := os.WriteFile(tmp, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, app.TemplateFile)); err != nil {
		t.Fatal(err)
	}
}

func (h *workerHarness) publish(event string) string {
	h.t.Helper()
	id, err := redisstream.New(h.cfg.Redis, h.streams[0], "workers", "producer").Publish(h.t.Context(), map[string]string{"event": event})
	if err != nil {
		h.t.Fatal(err)
	}
	return id
}

// TestReloadAddsChangesAndRemovesApps: a new app directory dropped into
// the apps root of a running worker is served without a restart; a
// template edit that does not validate keeps the previous rules serving
// and is reported with its position and in relay_app_reload_errors_total;
// fixing it serves the fix; a removed app directory stops matching.
func TestReloadAddsChangesAndRemovesApps(t *testing.T) {
	h, root := reloadHarness(t)
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "the worker to start", func() bool { return w.Apps() != nil })

	writeTemplate(t, root, "billing", invoicesApp)
	testutil.WaitFor(t, 10*time.Second, "billing to be served", func() bool { return w.Apps().Get("billing") != nil })
	h.publish(`{"kind":"invoice"}`)
	testutil.WaitFor(t, 10*time.Second, "billing's handler", func() bool { return h.calls.Count("billing/invoices.charge") == 1 })

	// A broken edit: the previous rules keep serving.
	writeTemplate(t, root, "billing", "image: x\nevents:\n  - {handler: invoices.charge, pattern: {kind: invoice}}\n")
	testutil.WaitFor(t, 10*time.Second, "the reload error", func() bool {
		return strings.Contains(h.logs.String(), "app template invalid; its previous version keeps serving") &&
			strings.Contains(h.logs.String(), "billing/template.yaml:3:")
	})
	if got := h.counter("relay_app_reload_errors_total"); got < 1 {
		t.Errorf("relay_app_reload_errors_total = %v, want at least 1", got)
	}
	if a := w.Apps().Get("billing"); a == nil || !a.Available() {
		t.Fatalf("billing after a broken edit = %+v, want the previous, valid version", a)
	}
	h.publish(`{"kind":"invoice"}`)
	testutil.WaitFor(t, 10*time.Second, "billing's handler under the previous rules", func() bool { return h.calls.Count("billing/invoices.charge") == 2 })

	// The fix is served: the rule now wants another kind.
	writeTemplate(t, root, "billing", "image: x\nevents:\n  - {handler: invoices.charge, pattern: {kind: [bill]}}\n")
	testutil.WaitFor(t, 10*time.Second, "the fixed billing", func() bool {
		a := w.Apps().Get("billing")
		return a != nil && a.Available() && strings.Contains(a.Rules[0].Pattern.String(), "bill")
	})
	h.publish(`{"kind":"bill"}`)
	testutil.WaitFor(t, 10*time.Second, "billing's handler under the new rule", func() bool { return h.calls.Count("billing/invoices.charge") == 3 })

	// Removed: its events no longer match.
	if err := os.RemoveAll(filepath.Join(root, "billing")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "billing removed", func() bool { return w.Apps().Get("billing") == nil })
	h.publish(`{"kind":"bill"}`)
	h.publish(`{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "the next event", func() bool { return h.calls.Count("users/events.created") == 1 })
	if n := h.calls.Count("billing/invoices.charge"); n != 3 {
		t.Errorf("billing ran %d times, want 3: a removed app matched", n)
	}
}

// TestReloadReportsABrokenTemplateOnce: a template that stays broken is
// reported when it appears, not again at every rescan; another broken
// version, or the same one after a fix, is reported again. Undoing a
// broken edit, which restores the version serving, is logged once.
func TestReloadReportsABrokenTemplateOnce(t *testing.T) {
	h, root := reloadHarness(t)
	writeTemplate(t, root, "never", "image: x\nevents: [\n")
	h.cfg.ReloadInterval = 20 * time.Millisecond
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "the worker to start", func() bool { return w.Apps() != nil })
	writeTemplate(t, root, "billing", invoicesApp)
	testutil.WaitFor(t, 10*time.Second, "billing to be served", func() bool { return w.Apps().Get("billing") != nil })

	reports := func() int {
		return strings.Count(h.logs.String(), "app template invalid; its previous version keeps serving")
	}
	// Many rescans happen while each version stays: their count is what
	// a slow machine could lower, never raise.
	settle := func() { time.Sleep(500 * time.Millisecond) }
	broken := "image: x\nevents:\n  - {handler: invoices.charge, pattern: {kind: invoice}}\n"
	writeTemplate(t, root, "billing", broken)
	testutil.WaitFor(t, 10*time.Second, "the reload error", func() bool { return reports() == 1 })
	settle()
	if n, c := reports(), h.counter("relay_app_reload_errors_total"); n != 1 || c != 1 {
		t.Errorf("one broken version: reported %d times, relay_app_reload_errors_total %v; want 1 and 1", n, c)
	}
	writeTemplate(t, root, "billing", broken+"# another\n"+"  - {handler: x, pattern: {kind: [bill]\n")
	testutil.WaitFor(t, 10*time.Second, "the second version's error", func() bool { return reports() == 2 })
	writeTemplate(t, root, "billing", invoicesApp+"# fixed\n")
	testutil.WaitFor(t, 10*time.Second, "the fix", func() bool {
		return w.Apps().Get("billing").Digest != "" && strings.Contains(h.logs.String(), "app changed")
	})
	writeTemplate(t, root, "billing", broken)
	testutil.WaitFor(t, 10*time.Second, "the first version's error again", func() bool { return reports() == 3 })
	settle()
	if n, c := reports(), h.counter("relay_app_reload_errors_total"); n != 3 || c != 3 {
		t.Errorf("three broken versions: reported %d times, relay_app_reload_errors_total %v; want 3 and 3", n, c)
	}
	// The app that never had a valid template: once, at start.
	if n := strings.Count(h.logs.String(), "app unavailable: invalid template"); n < 1 || n > 2 {
		t.Errorf("the never-valid app was reported %d times, want once (its error may span two lines)", n)
	}

	// Undoing the broken edit restores the version that kept serving: no
	// change to log, but the end of the error is, once; the next broken
	// edit is reported again.
	fixed := func() int {
		return strings.Count(h.logs.String(), "app template valid again; the version serving is unchanged")
	}
	writeTemplate(t, root, "billing", invoicesApp+"# fixed\n")
	testutil.WaitFor(t, 10*time.Second, "the undo to be logged", func() bool { return fixed() == 1 })
	settle()
	if n := fixed(); n != 1 {
		t.Errorf("the undo was logged %d times, want once", n)
	}
	writeTemplate(t, root, "billing", broken)
	testutil.WaitFor(t, 10*time.Second, "the broken version's error after the undo", func() bool { return reports() == 4 })
}

// TestReloadFollowsAConfigMapSwap: a Kubernetes ConfigMap volume updates by
// pointing its ..data link at a new directory; the watch sees it.
func TestReloadFollowsAConfigMapSwap(t *testing.T) {
	h, root := reloadHarness(t)
	dir := filepath.Join(root, "billing")
	gen := func(name, src string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name, app.TemplateFile), []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gen("..2026_12_01_1", invoicesApp)
	if err := os.Symlink("..2026_12_01_1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", app.TemplateFile), filepath.Join(dir, app.TemplateFile)); err != nil {
		t.Fatal(err)
	}
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "billing served", func() bool { return w.Apps() != nil && w.Apps().Get("billing") != nil })

	// The update: a new timestamped directory, a new link renamed over
	// ..data, the old directory removed.
	gen("..2026_12_01_2", "image: x\nevents:\n  - {handler: invoices.charge, pattern: {kind: [bill]}}\n")
	if err := os.Symlink("..2026_12_01_2", filepath.Join(dir, "..data_tmp")); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "..2026_12_01_1")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the swapped template", func() bool {
		a := w.Apps().Get("billing")
		return a != nil && strings.Contains(a.Rules[0].Pattern.String(), "bill")
	})
}

// switchableApps is an AppSource without a watch, whose apps a test swaps.
type switchableApps struct{ apps chan *app.Set }

func (s switchableApps) Load(context.Context) (*app.Set, error) {
	a := <-s.apps
	s.apps <- a
	return a, nil
}

// TestReloadOnRequestAndRunningDeliveriesKeepTheirRules: Worker.Reload
// (SIGHUP) reloads a source that cannot watch, and a delivery that started
// before a reload finishes under the rules it started with: the second
// rule of a message whose first handler is running when the rule is
// removed still runs.
func TestReloadOnRequestAndRunningDeliveriesKeepTheirRules(t *testing.T) {
	h := newWorkerHarness(t, "events")
	two := apptest.Load(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}}
  - {handler: events.audited, pattern: {event_name: [INSERT]}}
`})
	one := apptest.Load(t, map[string]string{"users": `
image: x
events:
  - {handler: events.created, pattern: {event_name: [INSERT]}}
`})
	src := switchableApps{apps: make(chan *app.Set, 1)}
	src.apps <- two
	h.cfg.Apps = src
	h.cfg.ReloadInterval = time.Hour
	release := make(chan struct{})
	h.runner.Runner = recordingRunner{h.calls, runtime.NewFunc(map[string]runtime.HandlerFunc{
		"users/events.created": func(context.Context, runtime.Request) error { <-release; return nil },
		"users/events.audited": func(context.Context, runtime.Request) error { return nil },
	})}
	w, stop := h.run()
	defer stop()
	h.publish(`{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "the first handler running", func() bool { return h.calls.Count("users/events.created") == 1 })
	<-src.apps
	src.apps <- one
	w.Reload()
	testutil.WaitFor(t, 10*time.Second, "the reload", func() bool { return len(w.Apps().Get("users").Rules) == 1 })
	close(release)
	testutil.WaitFor(t, 10*time.Second, "the second rule of the running delivery", func() bool { return h.calls.Count("users/events.audited") == 1 })
	// A new event matches the new rules only.
	h.publish(`{"event_name":"INSERT"}`)
	testutil.WaitFor(t, 10*time.Second, "the next event", func() bool { return h.calls.Count("users/events.created") == 2 })
	if n := h.calls.Count("users/events.audited"); n != 1 {
		t.Errorf("the removed rule ran %d times, want once (for the delivery that started before the reload)", n)
	}
}

// A reload whose runtime: go app names a handler the Func does not serve
// is refused whole: the previous apps keep serving, and the error is
// logged once however often the apps are reloaded; once fixed, the reload
// goes through (docs/embedding.md#go-handlers).
func TestReloadRefusesMissingGoHandlersOnce(t *testing.T) {
	h := newWorkerHarness(t, "events")
	root := testutil.AppsRoot(t, map[string]string{"orders": "runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [placed]}}\n"})
	h.cfg.Apps = template.Dir(root)
	h.cfg.ReloadInterval = time.Hour
	ok := func(context.Context, runtime.Request) error { return nil }
	h.cfg.Runner = runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.placed": ok, "orders/orders.shipped": ok})
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "the worker to start", func() bool { return w.Apps() != nil })

	writeTemplate(t, root, "orders", "runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [placed]}}\n  - {handler: orders.charge, pattern: {type: [charge]}}\n")
	const refused = "the reloaded apps name handlers the runner does not serve; the previous apps keep serving"
	testutil.WaitFor(t, 10*time.Second, "the refusal", func() bool { return strings.Contains(h.logs.String(), refused) })
	w.Reload()
	w.Reload()
	// A different mismatch is logged again; by then the reloads asked
	// above, which came first, have run.
	writeTemplate(t, root, "orders", "runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [placed]}}\n  - {handler: orders.charge, pattern: {type: [charge]}}\n  - {handler: orders.refund, pattern: {type: [refund]}}\n")
	testutil.WaitFor(t, 10*time.Second, "the second refusal", func() bool {
		return strings.Contains(h.logs.String(), "no Go function registered for orders/orders.charge, orders/orders.refund")
	})
	if a := w.Apps().Get("orders"); a == nil || len(a.Rules) != 1 {
		t.Errorf("served orders app = %+v, want the previous version with one rule", a)
	}
	if n := strings.Count(h.logs.String(), refused); n != 2 {
		t.Errorf("the refusals are logged %d times, want once for each of the two mismatches:\n%s", n, h.logs.String())
	}
	if !strings.Contains(h.logs.String(), "no Go function registered for orders/orders.charge") {
		t.Errorf("the refusal does not name orders/orders.charge:\n%s", h.logs.String())
	}

	writeTemplate(t, root, "orders", "runtime: go\nevents:\n  - {handler: orders.placed, pattern: {type: [placed]}}\n  - {handler: orders.shipped, pattern: {type: [shipped]}}\n")
	testutil.WaitFor(t, 10*time.Second, "the fixed apps to serve", func() bool {
		a := w.Apps().Get("orders")
		return a != nil && len(a.Rules) == 2
	})
}
