package relaytest

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
)

// Behaviour is how the handler of a request from RunnerHarness.Request
// behaves.
type Behaviour int

const (
	// Succeeds: the handler exits 0 (returns nil).
	Succeeds Behaviour = iota + 1
	// Fails: the handler exits non-zero (returns an error).
	Fails
	// Hangs: the handler runs until it is killed (returns only when its
	// context ends).
	Hangs
	// ChecksEvent: the handler succeeds exactly when its input (stdin, or
	// Request.Event for an in-process handler) is CheckEvent, byte for byte,
	// and fails otherwise.
	ChecksEvent
)

// CheckEvent is the event the handler of a ChecksEvent request expects.
const CheckEvent = `{"relaytest":"check","text":"ünïcode, \"quotes\" and a\nnewline","n":1.50}`

// RunnerHarness is one Runner under test, for TestRunner.
type RunnerHarness struct {
	// Runner is the implementation under test.
	Runner relay.Runner
	// Request returns a request (App, Handler, Spec) whose handler behaves
	// as b. The suite sets Event, Attempt, MessageID and Timeout itself.
	Request func(t *testing.T, b Behaviour) runtime.Request
}

// TestRunner runs the contract of relay.Runner (relay.go;
// docs/apps.md#the-handler-contract and
// docs/embedding.md#go-handlers) against the runners
// newHarness returns, one per parallel sub-test.
//
// It covers: success as a nil error; a handler failure as an error
// wrapping *runtime.ExitError with a non-zero Code, so that an attempt is
// used; the event delivered exactly; a handler that overruns the request's
// Timeout killed and reported as an *runtime.ExitError with TimedOut and
// Timeout set; a run whose context ends (shutdown) reported as an error
// that is not an *runtime.ExitError, so no attempt is charged; and
// concurrent runs keeping their own outcomes.
//
// Runs that must end by a kill wait for it for up to a minute of real time
// before failing, so a runner that never kills fails rather than hangs.
func TestRunner(t *testing.T, newHarness func(t *testing.T) RunnerHarness) {
	for _, c := range runnerCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Runner == nil || h.Request == nil {
				t.Fatal("relaytest: RunnerHarness needs Runner and Request")
			}
			c.run(t, h)
		})
	}
}

// runnerCases are the cases of TestRunner, in the order they run. Each is a
// function below named runner<case>; a failure names the calling test and the
// case.
var runnerCases = []struct {
	name string
	run  func(t *testing.T, h RunnerHarness)
}{
	{"Succeeds", runnerSucceeds},
	{"Fails", runnerFails},
	{"EventDelivered", runnerEventDelivered},
	{"TimeoutKills", runnerTimeoutKills},
	{"CancelChargesNothing", runnerCancelChargesNothing},
	{"Concurrent", runnerConcurrent},
}

// runnerRequest builds the request of behaviour b with the suite's event,
// attempt, message id and timeout.
func runnerRequest(t *testing.T, h RunnerHarness, b Behaviour, timeout time.Duration) runtime.Request {
	t.Helper()
	req := h.Request(t, b)
	req.Event, req.Attempt, req.MessageID, req.Timeout = []byte(CheckEvent), 2, "1700000000000-0", timeout
	return req
}

func runnerSucceeds(t *testing.T, h RunnerHarness) {
	if _, err := h.Runner.Run(t.Context(), runnerRequest(t, h, Succeeds, time.Minute)); err != nil {
		t.Errorf("Run of a succeeding handler: %v, want nil", err)
	}
}

func runnerFails(t *testing.T, h RunnerHarness) {
	_, err := h.Runner.Run(t.Context(), runnerRequest(t, h, Fails, time.Minute))
	var exit *runtime.ExitError
	switch {
	case !errors.As(err, &exit):
		t.Errorf("Run of a failing handler: %v, want a *runtime.ExitError (an attempt is used)", err)
	case exit.Code == 0 || exit.TimedOut:
		t.Errorf("Run of a failing handler: %+v, want a non-zero Code and no timeout", exit)
	}
}

func runnerEventDelivered(t *testing.T, h RunnerHarness) {
	if _, err := h.Runner.Run(t.Context(), runnerRequest(t, h, ChecksEvent, time.Minute)); err != nil {
		t.Errorf("Run of a handler checking its event: %v, want nil (the event must arrive unchanged)", err)
	}
	req := runnerRequest(t, h, ChecksEvent, time.Minute)
	req.Event = []byte(`{"relaytest":"another event"}`)
	var exit *runtime.ExitError
	if _, err := h.Runner.Run(t.Context(), req); !errors.As(err, &exit) {
		t.Errorf("Run of a handler given the wrong event: %v, want its failure (*runtime.ExitError)", err)
	}
}

func runnerTimeoutKills(t *testing.T, h RunnerHarness) {
	const timeout = 200 * time.Millisecond
	err := runBounded(t, h.Runner, t.Context(), runnerRequest(t, h, Hangs, timeout))
	var exit *runtime.ExitError
	if !errors.As(err, &exit) || !exit.TimedOut || exit.Timeout != timeout {
		t.Errorf("Run past the timeout: %v, want a *runtime.ExitError with TimedOut and Timeout %s", err, timeout)
	}
}

func runnerCancelChargesNothing(t *testing.T, h RunnerHarness) {
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	err := runBounded(t, h.Runner, ctx, runnerRequest(t, h, Hangs, time.Hour))
	var exit *runtime.ExitError
	if err == nil || errors.As(err, &exit) {
		t.Errorf("Run whose context ended: %v, want an infrastructure error (no *runtime.ExitError)", err)
	}
}

func runnerConcurrent(t *testing.T, h RunnerHarness) {
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		b := Succeeds
		if i%2 == 1 {
			b = Fails
		}
		req := runnerRequest(t, h, b, time.Minute)
		wg.Go(func() {
			_, err := h.Runner.Run(t.Context(), req)
			var exit *runtime.ExitError
			if got := errors.As(err, &exit); got != (b == Fails) || (b == Succeeds && err != nil) {
				t.Errorf("concurrent run %d (behaviour %d): %v", i, b, err)
			}
		})
	}
	wg.Wait()
}

// runBounded runs req and returns Run's error, failing the test when Run
// has not returned within a minute.
func runBounded(t *testing.T, r relay.Runner, ctx context.Context, req runtime.Request) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(ctx, req)
		done <- err
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(time.Minute):
		t.Fatalf("Run of %s/%s did not return within a minute: the handler was not killed", req.App, req.Handler)
		return nil
	}
}
