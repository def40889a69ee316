// Command embed runs a Relay Worker inside an ordinary Go program, with Go
// functions as handlers and no containers: one app consumes two streams and
// has a schedule.
//
//	go run ./examples/embed -redis 127.0.0.1:6379 -streams signups,orders
//	redis-cli XADD signups '*' event '{"type":"signup","email":"ada@example.com"}'
//	redis-cli XADD orders '*' event '{"type":"order","total":42}'
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
	"strings"
	"syscall"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule/cron"
	"github.com/relaydev/relay/worker"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6379", "Redis address")
	streams := flag.String("streams", "signups,orders", "streams to consume, comma-separated")
	group := flag.String("group", "embed", "consumer group")
	flag.Parse()
	if err := serve(*addr, strings.Split(*streams, ","), *group); err != nil {
		fmt.Fprintln(os.Stderr, "embed:", err)
		os.Exit(1)
	}
}

// serve connects to Redis and runs until SIGINT or SIGTERM.
func serve(addr string, streams []string, group string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer rc.Close() // the Worker never closes what it did not open
	return run(ctx, rc, streams, group, "", log)
}

// shop is the example's one app, defined in Go rather than in a
// template.yaml: a rule for signups, one for orders and an hourly report.
func shop() (*app.Set, error) {
	signup, err := yamlpattern.Parse("shop", []byte(`{type: [signup], email: [{suffix: "@example.com"}]}`))
	if err != nil {
		return nil, err
	}
	order, err := yamlpattern.Parse("shop", []byte(`{type: [order], total: [{gt: 0}]}`))
	if err != nil {
		return nil, err
	}
	return app.NewSet(&app.App{
		Name: "shop",
		Rules: []app.Rule{
			{Handler: "mail.welcome", Pattern: signup, Retries: 2},
			{Handler: "orders.record", Pattern: order},
		},
		Schedules: []app.Schedule{{Name: "report", Handler: "reports.hourly", Cron: cron.MustParse("@hourly", nil)}},
	})
}

// run consumes every stream of streams as consumer of group until ctx is
// cancelled; it returns nil then, once running handlers finished. An empty
// consumer means the hostname.
func run(ctx context.Context, rc rueidis.Client, streams []string, group, consumer string, log *slog.Logger) error {
	apps, err := shop()
	if err != nil {
		return err
	}
	// Handlers are keyed "app/handler". An error fails the attempt.
	handler := func(msg string) runtime.HandlerFunc {
		return func(_ context.Context, req runtime.Request) error {
			log.Info(msg, "message_id", req.MessageID, "attempt", req.Attempt, "event", string(req.Event))
			return nil
		}
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"shop/mail.welcome":   handler("sending welcome mail"),
		"shop/orders.record":  handler("recording order"),
		"shop/reports.hourly": handler("writing hourly report"),
	})
	w, err := worker.New(worker.Config{
		Redis: rc, Streams: streams, Group: group, Consumer: consumer,
		Apps: worker.Static(apps), Runner: runner,
		Engine: relay.Config{Logger: log, MaxConcurrency: 4},
	})
	if err != nil {
		return err
	}
	return w.Run(ctx) // returns nil after SIGINT/SIGTERM, once running handlers finished
}
