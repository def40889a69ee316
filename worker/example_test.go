package worker_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/worker"
)

// A service that consumes the stream "orders" with Go functions as
// handlers: the rules come from apps/*/template.yaml (runtime: go), the
// functions are registered by "app/handler". New refuses to build the
// Worker when a rule names a handler no function serves; Run returns nil
// after an interrupt, once running handlers finished
// (docs/embedding.md#worker).
func ExampleNew() {
	type order struct {
		ID    string `json:"id"`
		Total int    `json:"total"`
	}
	charge := runtime.Typed(func(ctx context.Context, o order, inv runtime.Invocation) error {
		log.Printf("charging order %s (attempt %d)", o.ID, inv.Attempt)
		return nil
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"127.0.0.1:6379"}, DisableCache: true})
	if err != nil {
		log.Fatal(err)
	}
	defer rc.Close()
	w, err := worker.New(worker.Config{
		Redis: rc, Streams: []string{"orders"}, Group: "orders",
		Apps:   template.Dir("apps"),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"orders/orders.charge": charge}),
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
