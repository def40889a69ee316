// Command embed is an orders service that embeds Relay: its rules are in
// apps/orders/template.yaml (runtime: go), built into the binary, its
// handlers Go functions with typed payloads (docs/embedding.md). Run it:
//
//	REDIS_ADDR=127.0.0.1:6379 go run .
//	redis-cli XADD orders '*' event '{"type":"orders.charge","id":"o-1","total":1200}'
package main

import (
	"context"
	"embed"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/worker"
)

// Apps holds apps/orders/template.yaml: the binary carries its rules.
//
//go:embed apps
var Apps embed.FS

// Order is the payload of both events.
type Order struct {
	ID    string `json:"id"`
	Total int    `json:"total"`
}

// Handlers are the service's Go functions, keyed "app/handler".
var Handlers = map[string]runtime.HandlerFunc{
	"orders/orders.placed": runtime.Typed(func(ctx context.Context, o Order, inv runtime.Invocation) error {
		slog.InfoContext(ctx, "order placed", "order", o.ID, "message_id", inv.MessageID)
		return nil
	}),
	"orders/orders.charge": runtime.Typed(func(_ context.Context, o Order, _ runtime.Invocation) error {
		if o.Total > 1000 { // no retry can change that: dead-letter it now
			return runtime.Permanent(fmt.Errorf("order %s: total %d is above the limit of 1000", o.ID, o.Total))
		}
		return nil // charge the card here; a plain error is retried
	}),
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{os.Getenv("REDIS_ADDR")}, DisableCache: true})
	if err == nil {
		defer rc.Close() // the Worker never closes what it did not open
		var w *worker.Worker
		w, err = worker.New(worker.Config{Redis: rc, Streams: []string{"orders"}, Group: "orders",
			Apps: template.FS(Apps, "apps"), Runner: runtime.NewFunc(Handlers)})
		if err == nil {
			err = w.Run(ctx) // nil after SIGINT/SIGTERM, once running handlers finished
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "orders:", err)
		os.Exit(1)
	}
}
