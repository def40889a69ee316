package worker_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/apptest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/worker"
)

// stallingPreparer is a Runner whose Prepare waits until its context ends,
// as a dependency build that outlasts the worker does.
type stallingPreparer struct {
	*sweepingRunner
	entered chan struct{}
}

func (p stallingPreparer) Prepare(ctx context.Context, _ string, _ runtime.Spec) error {
	select {
	case p.entered <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

// TestStopWhilePreparing: a worker stopped while it prepares its apps at
// start returns without logging an app whose preparation was cut short as
// loaded, and without starting anything.
func TestStopWhilePreparing(t *testing.T) {
	h := newWorkerHarness(t, "events")
	h.cfg.Apps = worker.Static(apptest.Load(t, map[string]string{
		"users": "image: x\nsecrets: [api-key]\nevents:\n  - {handler: events.created, pattern: {event_name: [INSERT]}}\n",
	}))
	p := stallingPreparer{sweepingRunner: h.runner, entered: make(chan struct{}, 1)}
	h.cfg.Runner = p
	_, stop := h.run()
	select {
	case <-p.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("Prepare not called")
	}
	if err := stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	logs := h.logs.String()
	if strings.Contains(logs, `msg="app loaded" app=users`) || strings.Contains(logs, "worker started") {
		t.Errorf("a worker stopped while preparing logged its app loaded or itself started:\n%s", logs)
	}
}
