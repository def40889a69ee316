// Command embed runs a Relay Engine inside an ordinary Go program, with a Go
// function as the handler and no containers:
//
//	go run ./examples/embed -redis 127.0.0.1:6379 -stream events
//	redis-cli XADD events '*' event '{"type":"signup","email":"ada@example.com"}'
//
// main_test.go runs the same wiring against a private redis-server.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	streamName := flag.String("stream", "events", "stream to consume")
	group := flag.String("group", "embed", "consumer group")
	flag.Parse()
	if err := serve(*addr, *streamName, *group); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// serve connects to Redis and runs until SIGINT or SIGTERM.
func serve(addr, streamName, group string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer rc.Close() // the Engine never closes what it did not open
	consumer, _ := os.Hostname()
	return run(ctx, rc, streamName, group, consumer, log)
}

// run consumes streamName as consumer of group until ctx is cancelled; it
// returns nil then, once running handlers finished.
func run(ctx context.Context, rc rueidis.Client, streamName, group, consumer string, log *slog.Logger) error {
	// Apps can come from template.yaml files (relay.LoadApps) or from Go.
	pattern, err := matcher.Parse("signups", []byte(`{type: [signup], email: [{suffix: "@example.com"}]}`))
	if err != nil {
		return err
	}
	apps, err := relay.NewApps(&relay.App{
		Name:  "signups",
		Rules: []relay.Rule{{Handler: "mail.welcome", Pattern: pattern, Retries: 2}},
	})
	if err != nil {
		return err
	}
	// Handlers are keyed "app/handler". An error fails the attempt.
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"signups/mail.welcome": func(ctx context.Context, req runtime.Request) error {
			log.Info("sending welcome mail", "message_id", req.MessageID, "attempt", req.Attempt, "event", string(req.Event))
			return nil
		},
	})

	engine, err := relay.New(apps, relay.Components{
		Source:   stream.New(rc, streamName, group, consumer),
		State:    invocation.New(rc),
		Runner:   runner,
		DLQ:      dlq.NewWriter(rc, streamName),
		Stream:   streamName,
		Group:    group,
		Consumer: consumer,
	}, relay.WithLogger(log), relay.WithConcurrency(4))
	if err != nil {
		return err
	}
	return engine.Run(ctx) // returns nil after SIGINT/SIGTERM, once running handlers finished
}
