package relay_test

import (
	"context"
	"log/slog"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/runtime"
)

// BenchmarkDeliver is the Engine's own cost per event, without Redis: b.N
// matching events published to relaytest's in-memory stream, each run by
// a no-op runtime.Func, until none is pending. The fakes cost a little
// (a mutex and a map each), so the figure is an upper bound of the stages,
// observers and goroutine handoffs a message pays; bench/pipeline
// measures the same path against Redis. Logging is off or at info to a
// discarded handler, the level relay start logs at. cpu-ns/op is the
// process's CPU time (all cores, GC included) per event.
func BenchmarkDeliver(b *testing.B) {
	for _, level := range []slog.Level{slog.LevelWarn, slog.LevelInfo} {
		b.Run("log="+level.String(), func(b *testing.B) { benchDeliver(b, level) })
	}
}

func benchDeliver(b *testing.B, level slog.Level) {
	pattern, err := yamlpattern.Parse("shop", []byte(`{kind: [order]}`))
	if err != nil {
		b.Fatal(err)
	}
	apps, err := app.NewSet(&app.App{Name: "shop", Concurrency: 8, Rules: []app.Rule{{
		Handler: "orders.charge", Pattern: pattern, Timeout: time.Minute, Retries: 4,
	}}})
	if err != nil {
		b.Fatal(err)
	}
	src := relaytest.NewStream()
	ctx := context.Background()
	for range b.N {
		if _, err := src.Publish(ctx, map[string]string{"event": `{"kind":"order","id":1}`}); err != nil {
			b.Fatal(err)
		}
	}
	e, err := relay.NewEngine(apps, relay.Components{
		Source: src.Consumer("c1"), State: relaytest.NewStateStore(relaytest.WithStream(src), relaytest.WithDLQ(relaytest.NewDLQ("events"))),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{"orders.charge": func(context.Context, runtime.Request) error { return nil }}),
		Stream: "events", Group: "workers", Consumer: "c1",
	}, relay.Config{
		Logger:  slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: level})),
		Metrics: prometheus.NewRegistry(),
		// As `relay start` with tracing off.
		TracerProvider: noop.NewTracerProvider(),
	})
	if err != nil {
		b.Fatal(err)
	}
	handlerCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	cpu := cpuTime(b)
	go func() { done <- e.Run(handlerCtx) }()
	for src.Lag() > 0 || len(src.Pending()) > 0 {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	// CPU time, not ns/op, is the cost: it is what the Engine takes from a
	// shared machine however busy the machine is, and counts every core.
	b.ReportMetric(float64(cpuTime(b)-cpu)/float64(b.N), "cpu-ns/op")
	cancel()
	if err := <-done; err != nil {
		b.Fatal(err)
	}
}

// discard is an io.Writer that drops everything, so that the text handler
// still formats each line.
type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// cpuTime is the user plus system CPU time the process used so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
