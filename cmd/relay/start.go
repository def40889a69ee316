package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// StartCmd is `relay start`.
type StartCmd struct {
	Consumer       string `name:"consumer" env:"RELAY_CONSUMER" help:"Consumer name (default: the hostname)."`
	StateDir       string `name:"state-dir" env:"RELAY_STATE_DIR" default:"/var/lib/relay" help:"Local state directory."`
	MaxConcurrency int    `name:"max-concurrency" env:"MAX_CONCURRENCY" default:"8" help:"Worker-global bound on concurrent invocations."`
	RunnerFlags    `embed:""`
	MetricsAddr    string `name:"metrics-addr" env:"METRICS_ADDR" help:"Serve /metrics, /healthz and /readyz on this address."`
}

// Run starts a worker and blocks until ctx is cancelled (SIGINT/SIGTERM).
func (c *StartCmd) Run(ctx context.Context, g *Globals) error {
	if err := g.requireStream(true); err != nil {
		return err
	}
	if c.MaxConcurrency <= 0 {
		return usagef("MAX_CONCURRENCY must be > 0, got %d", c.MaxConcurrency)
	}
	if c.Consumer == "" {
		c.Consumer = hostname()
	}
	log := g.logger()
	apps, err := g.loadApps()
	if err != nil {
		return err
	}
	if len(apps.List()) == 0 {
		// Every event would be acknowledged as unmatched: refuse.
		return errNoApps(g.Apps)
	}
	for _, a := range apps.List() {
		if !a.Available() {
			for _, e := range a.Errors {
				log.LogAttrs(ctx, slog.LevelError, "app unavailable: invalid template", slog.String("app", a.Name), slog.String("error", e.Error()))
			}
			continue
		}
		log.LogAttrs(ctx, slog.LevelInfo, "app loaded", slog.String("app", a.Name), slog.Int("rules", len(a.Rules)), slog.Int("schedules", len(a.Schedules)))
	}

	rc, err := g.redisClient()
	if err != nil {
		return err
	}
	defer rc.Close()

	var pingers []namedPinger
	src := stream.New(rc, g.RedisStream, g.RedisGroup, c.Consumer)
	pingers = append(pingers, namedPinger{"redis", src})
	// Containers are labelled per consumer, not per host, so the start-up
	// sweep of one worker never removes another's running handlers.
	runner, err := c.open(ctx, log, g.stdout, g.stderr, hostname()+"/"+c.Consumer)
	if err != nil {
		return err
	}
	defer runner.Close()
	if cr := runner.containerd; cr != nil {
		// The Engine sweeps leftovers at start and every minute (Sweeper).
		pingers = append(pingers, namedPinger{"containerd", cr})
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	engine, err := relay.New(apps, relay.Components{
		Source: src, State: invocation.New(rc), Runner: runner.Runner, DLQ: dlq.NewWriter(rc, g.RedisStream),
		Stream: g.RedisStream, Group: g.RedisGroup, Consumer: c.Consumer,
	}, relay.WithConcurrency(c.MaxConcurrency), relay.WithLogger(log), relay.WithMetrics(reg),
		relay.WithStats(rc))
	if err != nil {
		return err
	}
	if c.MetricsAddr != "" {
		srv, err := serveMetrics(ctx, c.MetricsAddr, reg, pingers)
		if err != nil {
			return err
		}
		defer func() {
			sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.LogAttrs(ctx, slog.LevelInfo, "metrics listening", slog.String("addr", c.MetricsAddr))
	}
	return engine.Run(ctx)
}

type namedPinger struct {
	name string
	p    relay.Pinger
}

func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, pingers []namedPinger) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("METRICS_ADDR %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		var errs []error
		for _, p := range pingers {
			if err := p.p.Ping(pctx); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", p.name, err))
			}
		}
		if err := errors.Join(errs...); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, BaseContext: func(net.Listener) context.Context { return context.WithoutCancel(ctx) }}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}

// Help is shown by relay start --help.
func (c *StartCmd) Help() string {
	return `Consumes REDIS_STREAM through REDIS_GROUP (created from id 0 if missing) and runs the matched handlers of every app under RELAY_APPS. SIGINT or SIGTERM stops reading, lets running handlers finish for up to 30s and leaves unfinished messages pending for another worker. Exits 1 at once when Redis or containerd cannot be reached, or when the apps root holds no app.

Examples:

    REDIS_URI=127.0.0.1:6379 REDIS_STREAM=events REDIS_GROUP=relay relay start --apps /apps
    relay start --redis-uri redis://user:pass@redis:6379/0 --stream events --group relay --metrics-addr :9090
    relay start --runner process --log-level debug    # handlers as local processes, for development`
}
