package worker_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
)

// secretPreparer is a Runner whose Prepare fails, as for a missing secret,
// while missing is set.
type secretPreparer struct {
	*sweepingRunner
	missing atomic.Bool
	calls   atomic.Int64
}

func (p *secretPreparer) Prepare(context.Context, string, runtime.Spec) error {
	p.calls.Add(1)
	if p.missing.Load() {
		return errors.New(`secret "api-key": no file api-key in the secrets directory: ` + runtime.ErrUnavailable.Error())
	}
	return nil
}

// missingSecretHarness is a worker whose one app, slow, is not ready (its
// secret missing) until the test clears p.missing, with the rescan an hour
// away and pending messages reclaimed after 200 ms; its handler succeeds.
func missingSecretHarness(t *testing.T) (*workerHarness, *secretPreparer) {
	h := newWorkerHarness(t, "events")
	h.cfg.Apps = template.Dir(testutil.AppsRoot(t, map[string]string{"slow": slowApp("1")}))
	h.cfg.ReloadInterval = time.Hour
	h.cfg.Engine.MinPendingIdle = 200 * time.Millisecond
	ok := func(context.Context, runtime.Request) error { return nil }
	h.runner.Runner = recordingRunner{h.calls, runtime.NewFunc(map[string]runtime.HandlerFunc{"slow/events.a": ok})}
	p := &secretPreparer{sweepingRunner: h.runner}
	p.missing.Store(true)
	h.cfg.Runner = p
	return h, p
}

// TestReloadLogsAnUnchangedAppReady: an app not ready at start (a missing
// secret) whose preparation succeeds on a later reload, its template
// unchanged, is logged as ready, not as changed (nothing in it changed),
// and its held message is handled.
func TestReloadLogsAnUnchangedAppReady(t *testing.T) {
	h, p := missingSecretHarness(t)
	w, stop := h.run()
	defer stop()
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 10*time.Second, "slow unavailable: not ready", func() bool {
		return strings.Contains(h.logs.String(), `msg="app unavailable: not ready" app=slow`)
	})

	p.missing.Store(false)
	w.Reload()
	testutil.WaitFor(t, 10*time.Second, "slow's held message handled once ready", func() bool {
		return h.calls.Count("slow/events.a") == 1 && h.pending() == 0
	})
	logs := h.logs.String()
	if !strings.Contains(logs, `level=INFO msg="app ready" app=slow`) || strings.Contains(logs, `msg="app changed"`) {
		t.Errorf("slow not logged ready, or logged changed, once its secret appeared:\n%s", logs)
	}
}

// TestUndoingAnEditNotReadyIsNotLoggedAsATemplateFix: an edit of a served
// app whose preparation fails (a missing secret) keeps the previous
// version serving; undoing the edit is logged as such, not as a broken
// template made valid again (the template was valid throughout).
func TestUndoingAnEditNotReadyIsNotLoggedAsATemplateFix(t *testing.T) {
	h := newWorkerHarness(t, "events")
	root := testutil.AppsRoot(t, map[string]string{"slow": slowApp("1")})
	h.cfg.Apps = template.Dir(root)
	h.cfg.ReloadInterval = time.Hour
	p := &secretPreparer{sweepingRunner: h.runner}
	h.cfg.Runner = p
	w, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "slow served", func() bool {
		return w.Apps() != nil && w.Apps().Get("slow").Available()
	})

	p.missing.Store(true)
	writeTemplate(t, root, "slow", slowApp("2"))
	w.Reload()
	testutil.WaitFor(t, 10*time.Second, "the edit logged not ready", func() bool {
		return strings.Contains(h.logs.String(), `msg="app not ready; its previous version keeps serving" app=slow`)
	})
	writeTemplate(t, root, "slow", slowApp("1"))
	w.Reload()
	testutil.WaitFor(t, 10*time.Second, "the undone edit logged", func() bool {
		return strings.Contains(h.logs.String(), `msg="app edit that was not ready undone; the version serving is unchanged" app=slow`)
	})
	if logs := h.logs.String(); strings.Contains(logs, "app template valid again") {
		t.Errorf("an undone edit whose template was valid logged as a template fixed:\n%s", logs)
	}
	if v := w.Apps().Get("slow").Spec.Env["V"]; v != "1" {
		t.Errorf("serving V=%q, want 1", v)
	}
}

// TestFailedPreparationIsRetried: an app not ready at start (a missing
// secret) is prepared again after PrepareRetry, then after twice that, and
// so on, with no reload asked for and the rescan an hour away: neither
// never again nor in a loop. Its held message is handled once the
// preparation succeeds.
func TestFailedPreparationIsRetried(t *testing.T) {
	h, p := missingSecretHarness(t)
	h.cfg.PrepareRetry = 50 * time.Millisecond
	_, stop := h.run()
	defer stop()
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 10*time.Second, "slow prepared again twice after failing", func() bool {
		return p.calls.Load() >= 3
	})
	// Retries 50, 100, 200, 400 ms apart: at most 5 preparations in the
	// first 750 ms, fewer on a slow machine, never more.
	time.Sleep(time.Second)
	if n := p.calls.Load(); n > 8 {
		t.Errorf("%d preparations in about a second: a failing preparation is retried in a loop, not after growing delays", n)
	}
	if logs := h.logs.String(); strings.Count(logs, `msg="app unavailable: not ready" app=slow`) != 1 {
		t.Errorf("the same failure logged other than once over %d preparations:\n%s", p.calls.Load(), logs)
	}

	p.missing.Store(false)
	testutil.WaitFor(t, 10*time.Second, "slow's held message handled once ready", func() bool {
		return h.calls.Count("slow/events.a") == 1 && h.pending() == 0
	})
	if logs := h.logs.String(); !strings.Contains(logs, `level=INFO msg="app ready" app=slow`) {
		t.Errorf("slow not logged ready:\n%s", logs)
	}
}
