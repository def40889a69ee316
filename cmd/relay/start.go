package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// StartCmd is `relay start`.
type StartCmd struct {
	Consumer       string `name:"consumer" env:"RELAY_CONSUMER" help:"Consumer name (default: the hostname)."`
	StateDir       string `name:"state-dir" env:"RELAY_STATE_DIR" default:"/var/lib/relay" help:"Local state directory: the schedule outbox and the python3/node bootstraps."`
	MaxConcurrency int    `name:"max-concurrency" env:"MAX_CONCURRENCY" default:"8" help:"Worker-global bound on concurrent invocations."`
	RunnerFlags    `embed:""`
	MetricsAddr    string `name:"metrics-addr" env:"METRICS_ADDR" help:"Serve /metrics, /healthz and /readyz on this address."`
	// ShutdownTimeout lets an orchestrator's grace period cover the longest
	// handler (docs/deployment.md "Graceful termination").
	ShutdownTimeout time.Duration `name:"shutdown-timeout" env:"RELAY_SHUTDOWN_TIMEOUT" default:"30s" help:"After SIGTERM, how long running handlers may finish before they are abandoned (their messages stay pending)."`
}

// Run starts a worker and blocks until ctx is cancelled (SIGINT/SIGTERM).
func (c *StartCmd) Run(ctx context.Context, g *Globals) error {
	streams, err := g.startStreams()
	if err != nil {
		return err
	}
	if c.MaxConcurrency <= 0 {
		return usagef("MAX_CONCURRENCY must be > 0, got %d", c.MaxConcurrency)
	}
	if c.ShutdownTimeout <= 0 {
		return usagef("RELAY_SHUTDOWN_TIMEOUT must be > 0, got %s", c.ShutdownTimeout)
	}
	if c.Consumer == "" {
		c.Consumer = hostname()
	}
	log := g.logger()
	// Spans go to the global provider, which the Engines default to.
	_, stopTracing, err := startTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()
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
	if err := checkLayout(ctx, log, rc, streams, g.RedisGroup); err != nil {
		return err
	}

	// Containers are labelled per consumer, not per host, so the start-up
	// sweep of one worker never removes another's running handlers.
	c.RunnerFlags.stateDir = c.StateDir
	runner, err := c.open(ctx, log, g.stdout, g.stderr, hostname()+"/"+c.Consumer)
	if err != nil {
		return err
	}
	defer runner.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	engines, pingers, err := c.engines(apps, rc, runner.Runner, streams, g.RedisGroup, log, reg)
	if err != nil {
		return err
	}
	if cr := runner.containerd; cr != nil {
		// The Engine sweeps leftovers at start and every minute (Sweeper).
		pingers = append(pingers, namedPinger{"containerd", cr})
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
	sched, err := c.scheduler(apps, rc, streams[0], log, reg)
	if err != nil {
		return err
	}
	return runWithScheduler(ctx, sched, engines)
}

// startStreams checks the settings of relay start and returns the streams
// of REDIS_STREAM, which may be a comma list.
func (g *Globals) startStreams() ([]string, error) {
	if err := g.requireRedis(true); err != nil {
		return nil, err
	}
	return g.streamNames()
}

// checkLayout applies the hash-tag rule when the client turned out to be
// connected to a Redis Cluster, whatever the settings said (one address
// of a cluster node is enough for rueidis to go cluster-wide), and logs
// the rule's warnings.
func checkLayout(ctx context.Context, log *slog.Logger, rc rueidis.Client, streams []string, group string) error {
	if rc.Mode() != rueidis.ClientModeCluster {
		return nil
	}
	warnings, err := checkClusterLayout(streams, group)
	if err != nil {
		return usageError{err}
	}
	for _, w := range warnings {
		log.LogAttrs(ctx, slog.LevelWarn, "streams share a cluster hash slot", slog.String("detail", w))
	}
	return nil
}

// engines builds one Engine per stream: each consumes its stream through
// the same group name and consumer name, and all share runner, rc and one
// relay.Limiter, so MAX_CONCURRENCY and each app's concurrency bound the
// worker as a whole whatever the number of streams. With several streams,
// metrics carry a stream label; only the first engine sweeps the runner's
// leftovers, so the shared runner is swept once per interval.
func (c *StartCmd) engines(apps *relay.Apps, rc rueidis.Client, runner relay.Runner, streams []string, group string,
	log *slog.Logger, reg *prometheus.Registry) ([]*relay.Engine, []namedPinger, error) {
	n := len(streams)
	limiter, err := relay.NewLimiter(c.MaxConcurrency)
	if err != nil {
		return nil, nil, err
	}
	var engines []*relay.Engine
	var pingers []namedPinger
	for i, name := range streams {
		src := stream.New(rc, name, group, c.Consumer)
		r, mreg, pingName := runner, prometheus.Registerer(reg), "redis"
		if n > 1 {
			mreg = prometheus.WrapRegistererWith(prometheus.Labels{"stream": name}, reg)
			pingName = "redis " + name
			if i > 0 {
				r = runOnly{runner}
			}
		}
		e, err := relay.New(apps, relay.Components{
			Source: src, State: invocation.New(rc), Runner: r, DLQ: dlq.NewWriter(rc, name),
			Stream: name, Group: group, Consumer: c.Consumer,
		}, relay.WithConcurrency(c.MaxConcurrency), relay.WithLimiter(limiter), relay.WithLogger(log), relay.WithMetrics(mreg), relay.WithStats(rc),
			relay.WithShutdownTimeout(c.ShutdownTimeout))
		if err != nil {
			return nil, nil, fmt.Errorf("stream %s: %w", name, err)
		}
		engines = append(engines, e)
		pingers = append(pingers, namedPinger{pingName, src}, namedPinger{strings.Replace(pingName, "redis", "consuming", 1), e})
	}
	return engines, pingers, nil
}

// runOnly hides a Runner's optional capabilities (Sweeper) from an Engine.
type runOnly struct{ r relay.Runner }

func (o runOnly) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	return o.r.Run(ctx, req)
}

// runEngines runs every engine until ctx is done. When one cannot start,
// the others are stopped gracefully and its error is returned: a worker
// never runs with some of its streams silently left out.
func runEngines(ctx context.Context, engines []*relay.Engine) error {
	if len(engines) == 1 {
		return engines[0].Run(ctx)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	errs := make([]error, len(engines))
	var wg sync.WaitGroup
	for i, e := range engines {
		wg.Go(func() {
			err := e.Run(ctx)
			if err != nil && ctx.Err() != nil && errors.Is(err, context.Canceled) {
				err = nil // stopped while starting, because another failed or on a signal
			}
			if err != nil {
				errs[i] = err
				stop()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
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
	return `Consumes REDIS_STREAM through REDIS_GROUP (created from id 0 if missing) and runs the matched handlers of every app under RELAY_APPS. REDIS_STREAM may be a comma list: one consumer group per stream, MAX_CONCURRENCY shared by all. Under Redis Cluster every stream needs a hash tag ({orders}). SIGINT or SIGTERM stops reading, lets running handlers finish for up to RELAY_SHUTDOWN_TIMEOUT (30s) and leaves unfinished messages pending for another worker. Exits 1 at once when Redis or containerd cannot be reached, or when the apps root holds no app.

Examples:

    REDIS_URI=127.0.0.1:6379 REDIS_STREAM=events REDIS_GROUP=relay relay start --apps /apps
    relay start --redis-uri redis://user:pass@redis:6379/0 --stream events --group relay --metrics-addr :9090
    relay start --runner process --log-level debug    # handlers as local processes, for development
    REDIS_URI=redis://10.0.0.1:6379,10.0.0.2:6379 REDIS_STREAM='{orders},{payments}' REDIS_GROUP=relay relay start   # Redis Cluster, two streams
    REDIS_URI=redis://10.0.0.1:26379,10.0.0.2:26379,10.0.0.3:26379 REDIS_SENTINEL_MASTER=main relay start           # through Sentinel`
}
