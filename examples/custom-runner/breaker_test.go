package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/relaydev/relay/app"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

var (
	_ relay.Runner           = (*Breaker)(nil)
	_ relay.Sweeper          = (*Breaker)(nil)
	_ runtime.HandlerChecker = (*Breaker)(nil)
)

const coolDown = time.Minute

var (
	charge = runtime.Request{App: "payments", Handler: "charge", Attempt: 1}
	refund = runtime.Request{App: "payments", Handler: "refund", Attempt: 1}
)

// newBreaker wraps a scripted fake Runner, threshold 2, on a manual clock.
func newBreaker(t *testing.T) (*Breaker, *relaytest.Runner, *relaytest.ManualClock) {
	t.Helper()
	inner := relaytest.NewRunner()
	clock := relaytest.NewManualClock(time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC))
	b, err := NewBreaker(inner, 2, coolDown, WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	return b, inner, clock
}

// outcome classifies what Run returned, as the Engine does.
func outcome(err error) string {
	var exit *runtime.ExitError
	switch {
	case err == nil:
		return "ok"
	case errors.As(err, &exit):
		return "handler failed"
	case errors.Is(err, ErrOpen) && errors.Is(err, runtime.ErrUnavailable):
		return "refused"
	}
	return "infrastructure error"
}

func runs(t *testing.T, b *Breaker, req runtime.Request, n int) []string {
	t.Helper()
	var out []string
	for range n {
		_, err := b.Run(t.Context(), req)
		out = append(out, outcome(err))
	}
	return out
}

func wantOutcomes(t *testing.T, what string, got []string, want ...string) {
	t.Helper()
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("%s = %q, want %q", what, got, want)
	}
}

func TestBreakerOpensAfterConsecutiveFailures(t *testing.T) {
	b, inner, clock := newBreaker(t)
	inner.Script("payments/charge", relaytest.Fail(1, "down"), relaytest.TimeOut())
	wantOutcomes(t, "runs", runs(t, b, charge, 3), "handler failed", "handler failed", "refused")
	if n := len(inner.Requests("payments/charge")); n != 2 {
		t.Errorf("wrapped runner ran %d times, want 2: an open circuit must not run the handler", n)
	}
	if s := b.State("payments/charge"); s != Open {
		t.Errorf("state = %s, want open", s)
	}
	// Other handlers have circuits of their own.
	wantOutcomes(t, "another handler", runs(t, b, refund, 1), "ok")

	clock.Advance(coolDown - time.Millisecond)
	wantOutcomes(t, "just before the cool-down ends", runs(t, b, charge, 1), "refused")
	clock.Advance(time.Millisecond)
	// The trial succeeds and closes the circuit.
	wantOutcomes(t, "after the cool-down", runs(t, b, charge, 2), "ok", "ok")
	if s := b.State("payments/charge"); s != Closed {
		t.Errorf("state = %s, want closed", s)
	}
}

func TestBreakerSuccessResetsTheCount(t *testing.T) {
	b, inner, _ := newBreaker(t)
	inner.Script("payments/charge", relaytest.Fail(1, ""), relaytest.Succeed(), relaytest.Fail(1, ""), relaytest.Succeed())
	wantOutcomes(t, "runs", runs(t, b, charge, 4), "handler failed", "ok", "handler failed", "ok")
}

func TestBreakerFailedTrialReopens(t *testing.T) {
	b, inner, clock := newBreaker(t)
	inner.Script("payments/charge", relaytest.Fail(1, ""), relaytest.Fail(1, ""), relaytest.Fail(1, "still down"))
	runs(t, b, charge, 2)
	clock.Advance(coolDown)
	// One failed trial is enough to open the circuit again, for a whole
	// cool-down from then.
	wantOutcomes(t, "trial", runs(t, b, charge, 2), "handler failed", "refused")
	clock.Advance(coolDown - time.Millisecond)
	wantOutcomes(t, "during the second cool-down", runs(t, b, charge, 1), "refused")
	clock.Advance(time.Millisecond)
	wantOutcomes(t, "after it", runs(t, b, charge, 1), "ok")
}

func TestBreakerAdmitsOneTrialAtATime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b, inner, clock := newBreaker(t)
		release := make(chan struct{})
		inner.Script("payments/charge", relaytest.Fail(1, ""), relaytest.Fail(1, ""), relaytest.Block(release, relaytest.Succeed()))
		runs(t, b, charge, 2)
		clock.Advance(coolDown)
		trial := make(chan error)
		go func() { _, err := b.Run(t.Context(), charge); trial <- err }()
		if _, err := inner.WaitRuns(t.Context(), "payments/charge", 3); err != nil {
			t.Fatal(err)
		}
		if s := b.State("payments/charge"); s != HalfOpen {
			t.Errorf("state during the trial = %s, want half-open", s)
		}
		wantOutcomes(t, "run during the trial", runs(t, b, charge, 1), "refused")
		close(release)
		if err := <-trial; err != nil {
			t.Fatalf("trial: %v", err)
		}
		wantOutcomes(t, "after the trial", runs(t, b, charge, 1), "ok")
	})
}

func TestBreakerIgnoresInfrastructureErrors(t *testing.T) {
	b, inner, clock := newBreaker(t)
	inner.Script("payments/charge",
		relaytest.Unavailable("image missing"), relaytest.Fail(1, ""), relaytest.Unavailable("image missing"),
		relaytest.Fail(1, ""), // second consecutive handler failure: opens
	)
	got := runs(t, b, charge, 5)
	wantOutcomes(t, "runs", got[:4], "infrastructure error", "handler failed", "infrastructure error", "handler failed")
	wantOutcomes(t, "fifth run", got[4:], "refused")

	// A trial that cannot run (infrastructure) leaves the next run a trial.
	clock.Advance(coolDown)
	inner.Script("payments/charge", relaytest.Unavailable("image missing"))
	runs(t, b, charge, 1)
	if s := b.State("payments/charge"); s != HalfOpen {
		t.Errorf("state after a trial that could not run = %s, want half-open", s)
	}
	wantOutcomes(t, "next trial", runs(t, b, charge, 1), "ok")
}

type sweeper struct {
	*relaytest.Runner
	swept atomic.Int32
}

func (s *sweeper) Sweep(context.Context) error { s.swept.Add(1); return nil }

func TestBreakerForwardsSweep(t *testing.T) {
	s := &sweeper{Runner: relaytest.NewRunner()}
	b, err := NewBreaker(s, 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Sweep(t.Context()); err != nil || s.swept.Load() != 1 {
		t.Errorf("Sweep = %v, swept %d times; want forwarded once", err, s.swept.Load())
	}
	plain, err := NewBreaker(relaytest.NewRunner(), 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Sweep(t.Context()); err != nil {
		t.Errorf("Sweep of a Runner that is no Sweeper: %v, want nil", err)
	}
}

func TestNewBreakerRejectsBadArguments(t *testing.T) {
	for name, f := range map[string]func() (*Breaker, error){
		"nil runner":    func() (*Breaker, error) { return NewBreaker(nil, 1, time.Second) },
		"threshold 0":   func() (*Breaker, error) { return NewBreaker(relaytest.NewRunner(), 0, time.Second) },
		"zero cooldown": func() (*Breaker, error) { return NewBreaker(relaytest.NewRunner(), 1, 0) },
	} {
		if b, err := f(); err == nil || b != nil {
			t.Errorf("%s: NewBreaker = %v, %v; want an error", name, b, err)
		}
	}
}

// countingRunner counts the Engine's calls to the Runner it wraps and the
// ones the breaker refused: composition once more.
type countingRunner struct {
	next            relay.Runner
	calls, refusals atomic.Int32
}

func (c *countingRunner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	c.calls.Add(1)
	res, err := c.next.Run(ctx, req)
	if errors.Is(err, ErrOpen) {
		c.refusals.Add(1)
	}
	return res, err
}

// TestEngineChargesNoAttemptWhileOpen runs the breaker under a real Engine
// on relaytest fakes, with the Engine's default timings in a synctest
// bubble: the handler fails attempts 1 and 2, the circuit opens, the
// Engine's redeliveries during the cool-down are refused without charging
// an attempt, and after it attempt 3 succeeds.
func TestEngineChargesNoAttemptWhileOpen(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const coolDown = 10 * time.Minute
		var mu sync.Mutex
		var attempts []int
		var times []time.Time
		handlers := runtime.NewFunc(map[string]runtime.HandlerFunc{
			"payments/charge": func(ctx context.Context, req runtime.Request) error {
				mu.Lock()
				defer mu.Unlock()
				attempts = append(attempts, req.Attempt)
				times = append(times, time.Now())
				if req.Attempt <= 2 {
					return errors.New("payment provider unreachable")
				}
				return nil
			},
		})
		b, err := NewBreaker(handlers, 2, coolDown)
		if err != nil {
			t.Fatal(err)
		}
		counter := &countingRunner{next: b}
		pattern, err := yamlpattern.Parse("payments", []byte(`{type: [payment]}`))
		if err != nil {
			t.Fatal(err)
		}
		apps, err := app.NewSet(&app.App{Name: "payments", Rules: []app.Rule{{Handler: "charge", Pattern: pattern, Retry: app.Retries(2)}}})
		if err != nil {
			t.Fatal(err)
		}
		src := relaytest.NewStream()
		dead := relaytest.NewDLQ("events")
		engine, err := relay.NewEngine(apps, relay.Components{
			Source: src.Consumer("w"), State: relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(dead)), Runner: counter,
			Stream: "events", Group: "g", Consumer: "w",
		}, relay.Config{Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			t.Fatal(err)
		}
		id, err := src.Publish(t.Context(), map[string]string{"event": `{"type":"payment"}`})
		if err != nil {
			t.Fatal(err)
		}
		ctx, stop := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- engine.Run(ctx) }()
		for deadline := time.Now().Add(time.Hour); src.Lag() > 0 || src.IsPending(id); {
			if time.Now().After(deadline) {
				t.Fatal("message still pending after an hour of virtual time")
			}
			time.Sleep(time.Second)
		}
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}

		mu.Lock()
		defer mu.Unlock()
		// retries: 2 allows 3 attempts; refusals used none of them.
		if len(attempts) != 3 || attempts[0] != 1 || attempts[1] != 2 || attempts[2] != 3 {
			t.Fatalf("handler attempts = %v, want 1, 2, 3", attempts)
		}
		if gap := times[2].Sub(times[1]); gap < coolDown {
			t.Errorf("attempt 3 ran %s after attempt 2 failed, want at least the cool-down %s", gap, coolDown)
		}
		if counter.refusals.Load() == 0 || counter.calls.Load() != 3+counter.refusals.Load() {
			t.Errorf("Engine called the breaker %d times, %d refused; want 3 runs plus at least one refusal",
				counter.calls.Load(), counter.refusals.Load())
		}
		if n, err := dead.Len(t.Context()); err != nil || n != 0 {
			t.Errorf("DLQ has %d entries (%v), want none: refusals must not exhaust the invocation", n, err)
		}
		if entries, _ := dead.List(t.Context(), dlq.Filter{}); len(entries) != 0 {
			t.Errorf("DLQ = %+v", entries)
		}
	})
}

// A Breaker around a runtime.Func keeps the start check of Go handlers: a
// rule naming an unregistered function still fails NewEngine.
func TestBreakerForwardsCheckHandlers(t *testing.T) {
	ok := func(context.Context, runtime.Request) error { return nil }
	b, err := NewBreaker(runtime.NewFunc(map[string]runtime.HandlerFunc{"payments/charge": ok}), 1, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	err = b.CheckHandlers([]runtime.Target{{App: "payments", Handler: "charge"}, {App: "payments", Handler: "refund"}})
	if err == nil || !strings.Contains(err.Error(), "payments/refund") {
		t.Errorf("CheckHandlers = %v, want it to name the missing payments/refund", err)
	}
}
