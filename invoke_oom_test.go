package relay_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/runtime"
)

// oomRunner fails every attempt as the containerd runner reports a handler
// that the kernel killed at its memory limit.
type oomRunner struct{}

func (oomRunner) Run(context.Context, runtime.Request) (runtime.Result, error) {
	return runtime.Result{}, &runtime.ExitError{Code: 137, OOMKilled: true, MemoryLimit: 128 << 20, Stderr: "Killed"}
}

const oomApp = `
image: x
events:
  - {handler: big.load, pattern: {kind: [load]}, retries: 1}
`

// TestOOMKillOutcome: an attempt killed for memory is a failure like any
// other for retries and the DLQ, but its reason says what happened and its
// outcome label is oom, apart from timeout and failure.
func TestOOMKillOutcome(t *testing.T) {
	h := newHarness(t, map[string]string{"loader": oomApp})
	h.runner = oomRunner{}
	h.start("c1")
	h.publish("event", `{"kind":"load"}`)
	testutil.WaitFor(t, 5*time.Second, "the DLQ entry", func() bool { return h.settled() && len(h.dlqEntries()) == 1 })
	const want = "handler killed: out of memory (limit 128MiB): Killed"
	if e := h.dlqEntries()[0]; e.Reason != want || e.HandlerAttempts != 2 {
		t.Errorf("DLQ entry: reason %q after %d attempts, want %q after 2", e.Reason, e.HandlerAttempts, want)
	}
	regs := []*prometheus.Registry{h.reg}
	if oom, other := sumCounter(t, regs, "relay_invocations_total", "oom"), sumCounter(t, regs, "relay_invocations_total", "failure", "timeout"); oom != 2 || other != 0 {
		t.Errorf(`relay_invocations_total: oom %d, failure+timeout %d; want 2 and 0`, oom, other)
	}
	if !strings.Contains(h.logs.String(), want) {
		t.Errorf("the engine log lacks %q:\n%s", want, h.logs)
	}

	// relay app invoke reports the runner's error as it is.
	res, err := manual.Invoker{Runner: oomRunner{}}.Invoke(t.Context(), h.apps.Get("loader"), []byte(`{"kind":"load"}`))
	if err != nil || len(res) != 1 || res[0].Err == nil || res[0].Err.Error() != want {
		t.Errorf("Invoke = %+v, %v; want one result failing with %q", res, err, want)
	}
}
