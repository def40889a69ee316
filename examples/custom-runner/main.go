// Command custom-runner shows a relay.Runner that wraps another one: a
// per-handler circuit breaker (breaker.go) around runtime.Func. It runs an
// Engine on the in-memory fakes of package relaytest, so it needs neither
// Redis nor containers:
//
//	go run ./examples/custom-runner
//
// A payment handler fails twice while its provider is down. The second
// failure opens the handler's circuit: while it is open, the Engine's
// redeliveries are refused without running the handler, and no attempt is
// charged. After the cool-down one trial run goes through, succeeds, and
// closes the circuit; the message is acknowledged.
//
// A production worker composes the same way: wrap the containerd runner
// (runtime/containerd) instead of runtime.Func, and keep Redis-backed
// components (see examples/embed).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/relaydev/relay/app"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

func main() {
	if err := run(os.Stdout, demoTimings); err != nil {
		fmt.Fprintln(os.Stderr, "custom-runner:", err)
		os.Exit(1)
	}
}

// timings are the demo's Engine and breaker timings, shrunk from the
// spec's minutes so that the demo takes about a second.
type timings struct {
	minPendingIdle, reclaim, backoff, coolDown time.Duration
}

var demoTimings = timings{
	minPendingIdle: 50 * time.Millisecond,
	reclaim:        10 * time.Millisecond,
	backoff:        10 * time.Millisecond,
	coolDown:       500 * time.Millisecond,
}

// run publishes one payment event, runs the Engine until the message is
// acknowledged (or 30s pass), and writes what happened to w.
func run(w io.Writer, tm timings) error {
	var mu sync.Mutex // serialises w between the handler and the breaker hook
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(w, format+"\n", args...)
	}

	pattern, err := yamlpattern.Parse("payments", []byte(`{type: [payment]}`))
	if err != nil {
		return err
	}
	apps, err := app.NewSet(&app.App{
		Name:  "payments",
		Rules: []app.Rule{{Handler: "charge", Pattern: pattern, Retry: app.Retries(4)}},
	})
	if err != nil {
		return err
	}

	// The provider is down for the first two attempts.
	handlers := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"payments/charge": func(ctx context.Context, req runtime.Request) error {
			if req.Attempt <= 2 {
				say("attempt %d: payment provider unreachable", req.Attempt)
				return errors.New("payment provider unreachable")
			}
			say("attempt %d: charged", req.Attempt)
			return nil
		},
	})
	// Composition: the Engine sees only the outermost Runner.
	breaker, err := NewBreaker(handlers, 2, tm.coolDown, WithStateChange(func(handler string, from, to State) {
		say("breaker %s: %s -> %s", handler, from, to)
	}))
	if err != nil {
		return err
	}

	src := relaytest.NewStream()
	state := relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(relaytest.NewDLQ("events")))
	engine, err := relay.NewEngine(apps, relay.Components{
		Source: src.Consumer("worker-1"), State: state, Runner: breaker,
		Stream: "events", Group: "payments", Consumer: "worker-1",
	}, relay.Config{
		Logger:          slog.New(slog.DiscardHandler),
		MinPendingIdle:  tm.minPendingIdle,
		ReclaimInterval: tm.reclaim,
		Backoff:         []time.Duration{tm.backoff},
	})
	if err != nil {
		return err
	}

	id, err := src.Publish(context.Background(), map[string]string{"event": `{"type":"payment","amount":42}`})
	if err != nil {
		return err
	}
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error, 1)
	go func() { done <- engine.Run(ctx) }()

	deadline := time.Now().Add(30 * time.Second)
	for src.Lag() > 0 || src.IsPending(id) {
		if time.Now().After(deadline) {
			stop()
			<-done
			return fmt.Errorf("message %s still pending after 30s", id)
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		return err
	}
	say("message acknowledged")
	return nil
}
