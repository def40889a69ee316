package relay_test

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
}

func (p *secretPreparer) Prepare(context.Context, string, runtime.Spec) error {
	if p.missing.Load() {
		return errors.New(`secret "api-key": no file api-key in the secrets directory: ` + runtime.ErrUnavailable.Error())
	}
	return nil
}

// TestReloadLogsAnUnchangedAppReady: an app not ready at start (a missing
// secret) whose preparation succeeds on a later reload, its template
// unchanged, is logged as ready, not as changed (nothing in it changed),
// and its held message is handled.
func TestReloadLogsAnUnchangedAppReady(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.Apps = template.Dir(testutil.AppsRoot(t, map[string]string{"slow": slowApp("1")}))
	h.cfg.ReloadInterval = time.Hour
	h.cfg.MinPendingIdle = 200 * time.Millisecond
	ok := func(context.Context, runtime.Request) error { return nil }
	h.runner.Runner = recordingRunner{h.calls, runtime.NewFunc(map[string]runtime.HandlerFunc{"slow/events.a": ok})}
	p := &secretPreparer{sweepingRunner: h.runner}
	p.missing.Store(true)
	h.cfg.Runner = p
	w, stop := h.run()
	defer stop()
	h.publish(`{"kind":"a"}`)
	testutil.WaitFor(t, 10*time.Second, "slow unavailable: not ready", func() bool {
		return strings.Contains(h.logs.String(), `msg="app unavailable: not ready" app=slow`)
	})

	p.missing.Store(false)
	w.Reload()
	testutil.WaitFor(t, 10*time.Second, "slow's held message handled once ready", func() bool {
		return h.calls.count("slow/events.a") == 1 && h.pending() == 0
	})
	logs := h.logs.String()
	if !strings.Contains(logs, `level=INFO msg="app ready" app=slow`) || strings.Contains(logs, `msg="app changed"`) {
		t.Errorf("slow not logged ready, or logged changed, once its secret appeared:\n%s", logs)
	}
}
