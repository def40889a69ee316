package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/alecthomas/kong"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/keys"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/worker"
)

// StartCmd is `relay start`.
type StartCmd struct {
	Consumer       string `name:"consumer" env:"RELAY_CONSUMER" help:"Consumer name (default: the hostname)."`
	StateDir       string `name:"state-dir" env:"RELAY_STATE_DIR" default:"/var/lib/relay" help:"Local state directory: the schedule outbox and the python3/node bootstraps."`
	MaxConcurrency int    `name:"max-concurrency" env:"MAX_CONCURRENCY" default:"8" help:"Worker-global bound on concurrent invocations."`
	RunnerFlags    `embed:""`
	MetricsAddr    string `name:"metrics-addr" env:"METRICS_ADDR" help:"Serve /metrics, /healthz and /readyz on this address."`
	// ShutdownTimeout lets an orchestrator's grace period cover the longest
	// handler (docs/deployment.md#graceful-termination).
	ShutdownTimeout time.Duration `name:"shutdown-timeout" env:"RELAY_SHUTDOWN_TIMEOUT" default:"30s" help:"After SIGTERM, how long running handlers may finish before they are abandoned (their messages stay pending)."`
	StreamRetention time.Duration `name:"stream-retention" env:"REDIS_STREAM_RETENTION" default:"24h" help:"Trim each stream to entries younger than this, never past an entry any consumer group holds pending or has not been delivered (0: never trim)."`
	DLQRetention    `embed:""`
	MaxEventBytes   byteSize      `name:"max-event-bytes" env:"MAX_EVENT_BYTES" default:"1MiB" help:"Larger events are dead-lettered once, undecoded, with a summary (KiB, MiB or GiB)."`
	StartupWait     time.Duration `name:"startup-wait" env:"RELAY_STARTUP_WAIT" default:"1m" help:"At start, how long to wait for a Redis that refuses connections or does not answer yet, retrying with backoff, before exiting 1 (0: exit at once)."`
	DepsRetention   time.Duration `name:"deps-retention" env:"RELAY_DEPS_RETENTION" default:"168h" help:"Remove a dependency image no worker of the containerd namespace used for this long (0: keep them; else at least 1h)."`

	// InvocationRetention: docs/operations.md#redis-memory sizes it.
	InvocationRetention time.Duration `name:"invocation-retention" env:"REDIS_INVOCATION_RETENTION" default:"48h" help:"Keep a message's invocation state this long after its ack; 0 deletes it with the ack (docs/delivery.md#invocation-state)."`
}

// byteSize is a flag value in bytes, written with a KiB, MiB or GiB unit.
type byteSize int64

func (b *byteSize) Decode(ctx *kong.DecodeContext) error {
	var s string
	if err := ctx.Scan.PopValueInto("size", &s); err != nil {
		return err
	}
	// kong prefixes the flag, and the variable when the value came from it.
	n, err := app.ParseSize("size", s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

// Run starts a worker and blocks until ctx is cancelled (SIGINT/SIGTERM).
// It turns the flags into a worker.Config; the Worker does the rest.
func (c *StartCmd) Run(ctx context.Context, g *Globals) error {
	streams, err := g.startStreams()
	if err != nil {
		return err
	}
	if c.MaxConcurrency <= 0 {
		return usagef("MAX_CONCURRENCY must be > 0, got %d", c.MaxConcurrency)
	}
	if c.StartupWait < 0 {
		return usagef("RELAY_STARTUP_WAIT must be >= 0 (0: exit at once), got %s", c.StartupWait)
	}
	if c.ShutdownTimeout <= 0 {
		return usagef("RELAY_SHUTDOWN_TIMEOUT must be > 0, got %s", c.ShutdownTimeout)
	}
	if c.StreamRetention < 0 {
		return usagef("REDIS_STREAM_RETENTION must be >= 0 (0: never trim), got %s", c.StreamRetention)
	}
	if err := c.DLQRetention.check(); err != nil {
		return err
	}
	if c.InvocationRetention < 0 || (c.InvocationRetention > 0 && c.InvocationRetention < time.Millisecond) {
		return usagef("REDIS_INVOCATION_RETENTION must be 0 (delete with the ack) or at least 1ms, got %s", c.InvocationRetention)
	}
	if c.DepsRetention != 0 && c.DepsRetention < time.Hour {
		return usagef("RELAY_DEPS_RETENTION (--deps-retention) must be 0 (keep them) or at least 1h, got %s", c.DepsRetention)
	}
	if c.Consumer == "" {
		c.Consumer = hostname()
	}
	log := g.logger()
	// Spans go to the provider tracing built, a noop one when it is off.
	tp, stopTracing, err := startTracing(ctx, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	// A worker started with its Redis (a pod beside it, a host at boot)
	// waits for it rather than exiting into a restart loop.
	rc, err := worker.Connect(ctx, func(context.Context) (rueidis.Client, error) { return g.redisClient() }, c.StartupWait, log)
	if err != nil {
		return err
	}
	defer rc.Close()

	// Containers are labelled per consumer, not per host, so the start-up
	// sweep of one worker never removes another's running handlers.
	c.RunnerFlags.stateDir = c.StateDir
	runner, err := c.open(ctx, log, g.stdout, g.stderr, hostname()+"/"+c.Consumer,
		append(execHelper(c.Runner, log), ctrd.WithDepsRetention(c.DepsRetention))...)
	if err != nil {
		return err
	}
	defer runner.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	w, err := worker.New(worker.Config{
		Redis: rc, Streams: streams, Group: g.RedisGroup, Consumer: c.Consumer,
		Apps: template.Dir(g.Apps), Runner: runner.Runner, StateDir: c.StateDir, StartupWait: c.StartupWait,
		StreamRetention: orDisabled(c.StreamRetention), DLQRetention: orDisabled(c.DLQRetention.Retention),
		Engine: relay.Config{
			MaxConcurrency: c.MaxConcurrency, ShutdownTimeout: c.ShutdownTimeout,
			MaxEventBytes: int(c.MaxEventBytes), Logger: log, Metrics: reg, Retention: orDeleteOnAck(c.InvocationRetention),
			TracerProvider: tp,
		},
	})
	if err != nil {
		return err
	}
	defer reloadOnHangup(ctx, log, w)()
	if c.MetricsAddr != "" {
		srv, err := serveMetrics(ctx, c.MetricsAddr, reg, w)
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
	return runError(g, w.Run(ctx))
}

// check checks the flags of relay start and returns the streams to
// consume; it names the consumer after the host when none is set.
func (c *StartCmd) check(g *Globals) ([]string, error) {
	streams, err := g.startStreams()
	if err != nil {
		return nil, err
	}
	if c.MaxConcurrency <= 0 {
		return nil, usagef("MAX_CONCURRENCY must be > 0, got %d", c.MaxConcurrency)
	}
	if c.ShutdownTimeout <= 0 {
		return nil, usagef("RELAY_SHUTDOWN_TIMEOUT must be > 0, got %s", c.ShutdownTimeout)
	}
	if c.StreamRetention < 0 {
		return nil, usagef("REDIS_STREAM_RETENTION must be >= 0 (0: never trim), got %s", c.StreamRetention)
	}
	if err := c.DLQRetention.check(); err != nil {
		return nil, err
	}
	if c.DepsRetention != 0 && c.DepsRetention < time.Hour {
		return nil, usagef("RELAY_DEPS_RETENTION (--deps-retention) must be 0 (keep them) or at least 1h, got %s", c.DepsRetention)
	}
	if c.Consumer == "" {
		c.Consumer = hostname()
	}
	return streams, nil
}

// reloadOnHangup reloads w's apps on every SIGHUP, as nginx or Prometheus
// reload their configuration (SIGINT and SIGTERM stop the worker), until
// the function it returns is called.
func reloadOnHangup(ctx context.Context, log *slog.Logger, w *worker.Worker) (stop func()) {
	hangups := make(chan os.Signal, 1)
	signal.Notify(hangups, syscall.SIGHUP)
	go func() {
		for range hangups {
			log.LogAttrs(ctx, slog.LevelInfo, "SIGHUP: reloading the apps")
			w.Reload()
		}
	}()
	return func() { signal.Stop(hangups) }
}

// runError is the error relay start exits with for the error of
// Worker.Run.
func runError(g *Globals, err error) error {
	switch {
	case errors.Is(err, worker.ErrNoApps):
		return errNoApps(g.Apps)
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Errorf("%w (set RELAY_APPS or --apps to the directory holding your apps)", err)
	case errors.Is(err, keys.ErrClusterLayout):
		return usageError{err}
	default:
		return err
	}
}

// orDisabled maps a retention flag's 0 (never trim) to worker.Disabled.
func orDisabled(d time.Duration) time.Duration {
	if d == 0 {
		return worker.Disabled
	}
	return d
}

// orDeleteOnAck maps REDIS_INVOCATION_RETENTION's 0 to relay.DeleteOnAck.
func orDeleteOnAck(d time.Duration) time.Duration {
	if d == 0 {
		return relay.DeleteOnAck
	}
	return d
}

// startStreams checks the settings of relay start and returns the streams
// of REDIS_STREAM, which may be a comma list.
func (g *Globals) startStreams() ([]string, error) {
	if err := g.requireRedis(true); err != nil {
		return nil, err
	}
	return g.streamNames()
}

// serveMetrics serves /metrics of reg, /healthz, and /readyz from the
// Worker's readiness, on addr.
func serveMetrics(ctx context.Context, addr string, reg *prometheus.Registry, w *worker.Worker) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("METRICS_ADDR %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(rw http.ResponseWriter, r *http.Request) { fmt.Fprintln(rw, "ok") })
	mux.HandleFunc("/readyz", func(rw http.ResponseWriter, r *http.Request) {
		pctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := w.Ready(pctx); err != nil {
			http.Error(rw, err.Error(), http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(rw, "ready")
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
