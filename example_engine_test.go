package relay_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/relaydev/relay/app"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

// An Engine embedded in a Go program, with Go functions as handlers. Here
// it runs on the in-memory fakes of package relaytest, as a unit test of
// the handlers would; in production the same Components come from
// redisstream.New and redisstate.New on a Redis client (docs/embedding.md#engine),
// and a worker.Worker builds them (examples/embed).
//
// One event matches two rules, whose invocations run one after the other:
// mail.welcome fails once and succeeds on its retry; crm.sync fails both
// of its attempts and is dead-lettered. Then the message is acknowledged.
func ExampleEngine() {
	src := relaytest.NewStream()
	dead := relaytest.NewDLQ("events")
	// The store settles the stream's messages: it acknowledges them and
	// writes their dead letters, as redisstate.Store does on Redis.
	state := relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(dead))

	signup, err := yamlpattern.Parse("signups", []byte(`{type: [signup]}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	apps, err := app.NewSet(&app.App{Name: "signups", Rules: []app.Rule{
		{Handler: "mail.welcome", Pattern: signup, Retries: 2},
		{Handler: "crm.sync", Pattern: signup, Retries: 1},
	}})
	if err != nil {
		fmt.Println(err)
		return
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"signups/mail.welcome": func(ctx context.Context, req runtime.Request) error {
			if req.Attempt == 1 {
				fmt.Println("welcome: attempt 1 failed")
				return errors.New("smtp timeout")
			}
			fmt.Printf("welcome: attempt %d sent\n", req.Attempt)
			return nil
		},
		"signups/crm.sync": func(ctx context.Context, req runtime.Request) error {
			fmt.Printf("crm: attempt %d failed\n", req.Attempt)
			return errors.New("crm rejected the record")
		},
	})

	engine, err := relay.NewEngine(apps, relay.Components{
		Source: src.Consumer("worker-1"), State: state, Runner: runner,
		Stream: "events", Group: "workers", Consumer: "worker-1",
	}, relay.Config{
		Logger: slog.New(slog.DiscardHandler),
		// The production timings are minutes; shrink them so retries come fast.
		MinPendingIdle:  50 * time.Millisecond,
		ReclaimInterval: 10 * time.Millisecond,
		Backoff:         []time.Duration{10 * time.Millisecond},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	id, err := src.Publish(context.Background(), map[string]string{"event": `{"type":"signup","email":"ada@example.com"}`})
	if err != nil {
		fmt.Println(err)
		return
	}

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	done := make(chan error)
	go func() { done <- engine.Run(ctx) }()
	// Wait until every entry was read and nothing is pending any more.
	for deadline := time.Now().Add(10 * time.Second); src.Lag() > 0 || len(src.Pending()) > 0; {
		if time.Now().After(deadline) {
			fmt.Println("still pending:", src.Pending())
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	stop()
	if err := <-done; err != nil {
		fmt.Println(err)
	}

	entries, err := dead.List(context.Background(), dlq.Filter{})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range entries {
		fmt.Printf("dead letter: %s/%s after %d attempts: %s\n", e.App, e.Handler, e.HandlerAttempts, e.Reason)
	}
	fmt.Println("acknowledged:", !src.IsPending(id))
	// Output:
	// welcome: attempt 1 failed
	// crm: attempt 1 failed
	// welcome: attempt 2 sent
	// crm: attempt 2 failed
	// dead letter: signups/crm.sync after 2 attempts: handler failed: crm rejected the record
	// acknowledged: true
}
