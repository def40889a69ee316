package faults_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/stats/redisstats"

	ctrdclient "github.com/containerd/containerd/v2/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/workerproc"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/stream/redisstream"
	relayworker "github.com/relaydev/relay/worker"
)

// Worker-process settings, passed through the environment.
const (
	envWorker    = "FAULTS_WORKER"      // consumer name; set only in worker processes
	envRedis     = "FAULTS_REDIS"       // host:port
	envStream    = "FAULTS_STREAM"      // stream name; the group is soakGroup
	envApps      = "FAULTS_APPS"        // apps root
	envRunner    = "FAULTS_RUNNER"      // "func" (default) or "containerd"
	envSocket    = "FAULTS_SOCKET"      // containerd socket, for the containerd runner
	envNamespace = "FAULTS_NAMESPACE"   // containerd namespace, for the containerd runner
	envHelper    = "FAULTS_EXEC_HELPER" // relay-exec, for the containerd runner (optional)
	// envRetention makes the worker a worker.Worker with short retentions
	// and live reload of the apps root (TestSoakRetention): a
	// retentionSettings in its String form.
	envRetention = "FAULTS_RETENTION"
	// envEngineRedis makes the worker a worker.Worker whose parts reach
	// Redis at this host:port, a fault proxy, while the ledger keeps
	// envRedis (TestSoakNetworkFaults).
	envEngineRedis = "FAULTS_ENGINE_REDIS"
)

// soakGroup is the consumer group of every soak; soakAppName its only app.
const (
	soakGroup   = "soak"
	soakAppName = "soak"
)

// funcWorkerConfig is the Func soak's timings: handlers take milliseconds.
func funcWorkerConfig() relay.Config {
	return relay.Config{
		MinPendingIdle:    500 * time.Millisecond,
		ReclaimInterval:   100 * time.Millisecond,
		HeartbeatInterval: 100 * time.Millisecond,
		Backoff:           []time.Duration{50 * time.Millisecond},
		LeaseGrace:        300 * time.Millisecond,
		ConcurrencyWait:   time.Second,
		ShutdownTimeout:   time.Second,
	}
}

// containerdWorkerOptions are the containerd soak's timings: a container
// takes a few hundred milliseconds to set up and tear down on a loaded
// machine, which the lease grace must cover, or live attempts would look
// expired.
func containerdWorkerConfig() relay.Config {
	return relay.Config{
		MaxConcurrency:    containerdConcurrency,
		MinPendingIdle:    1500 * time.Millisecond,
		ReclaimInterval:   250 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		Backoff:           []time.Duration{200 * time.Millisecond},
		LeaseGrace:        3 * time.Second,
		ConcurrencyWait:   2 * time.Second,
		ShutdownTimeout:   2 * time.Second,
	}
}

// containerdSweepInterval is how often a soak worker sweeps its
// containerd runner's leftovers, as a worker.Worker does every minute.
const containerdSweepInterval = 500 * time.Millisecond

// TestWorkerProcess is not a test: the soaks run the test binary again with
// FAULTS_WORKER set to a consumer name, making this a worker process. It
// runs one Engine until SIGKILL, or until SIGTERM stops it gracefully.
// Around the engine's real components it keeps the ledger (record_test.go).
func TestWorkerProcess(t *testing.T) {
	consumer, ctx := workerproc.Worker(t, envWorker)
	rc := redistest.Connect(t, os.Getenv(envRedis))
	streamName := os.Getenv(envStream)
	apps, err := template.LoadDir(os.Getenv(envApps))
	if err != nil {
		t.Fatal(err)
	}
	level := slog.LevelInfo
	if os.Getenv("FAULTS_LOG_LEVEL") == "debug" {
		level = slog.LevelDebug
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	rec := newRecorder(rc, streamName, soakGroup, consumer, os.Getpid())
	var runner relay.Runner
	var cfg relay.Config
	switch os.Getenv(envRunner) {
	case "containerd":
		runner = containerdWorkerRunner(ctx, t, rec, log, consumer)
		cfg = containerdWorkerConfig()
	default:
		runner = funcWorkerRunner(rec)
		cfg = funcWorkerConfig()
	}
	if a := os.Getenv(envEngineRedis); a != "" {
		networkWorker(ctx, t, redistest.Connect(t, a), rec, runner, log, consumer)
		return
	}
	reg := prometheus.NewRegistry()
	if v := os.Getenv(envRetention); v != "" {
		rs, err := parseRetentionSettings(v)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Logger, cfg.Metrics = log, reg
		retentionWorker(ctx, t, rc, rec, runner, cfg, rs, consumer)
		return
	}
	src := redisstream.New(rc, streamName, soakGroup, consumer, redisstream.WithBlock(100*time.Millisecond))
	cfg.Logger, cfg.Metrics, cfg.Stats = log, reg, redisstats.NewRecorder(rc, streamName, soakGroup)
	// The ledger wraps each component, so the soak builds the Engine that a
	// worker.Worker would, and sweeps its runner as the Worker does.
	e, err := relay.NewEngine(apps, relay.Components{
		Source: ledgerSource{src, rec}, State: ledgerState{redisstate.New(rc), rec},
		Runner: ledgerRunner{runner, rec},
		Stream: streamName, Group: soakGroup, Consumer: consumer,
	}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	pushCtx, stopPush := context.WithCancel(context.WithoutCancel(ctx))
	pushed := make(chan struct{})
	go func() { defer close(pushed); rec.pushMissingMetric(pushCtx, reg) }()
	if sw, ok := runner.(relay.Sweeper); ok {
		swept := make(chan struct{})
		defer func() { <-swept }()
		go func() { defer close(swept); sweepEvery(ctx, sw, containerdSweepInterval, log) }()
	}
	if err := e.Run(ctx); err != nil {
		t.Error(err)
	}
	stopPush() // after a graceful stop: one last push of the final count
	<-pushed
}

// retentionSettings are the retentions and intervals of a retention soak's
// workers.
type retentionSettings struct {
	stream, dlq, state time.Duration // the retentions
	interval           time.Duration // retention, janitor and reload rescan interval
}

func (r retentionSettings) String() string {
	return fmt.Sprintf("%s,%s,%s,%s", r.stream, r.dlq, r.state, r.interval)
}

func parseRetentionSettings(v string) (retentionSettings, error) {
	var d [4]time.Duration
	parts := strings.Split(v, ",")
	if len(parts) != len(d) {
		return retentionSettings{}, fmt.Errorf("%s=%q: want 4 durations", envRetention, v)
	}
	for i, p := range parts {
		var err error
		if d[i], err = time.ParseDuration(p); err != nil {
			return retentionSettings{}, fmt.Errorf("%s=%q: %w", envRetention, v, err)
		}
	}
	return retentionSettings{stream: d[0], dlq: d[1], state: d[2], interval: d[3]}, nil
}

// retentionWorker runs what relay start runs, a worker.Worker over the apps
// root with live reload, retention and the janitor, with the ledger
// wrapped around the Engine's parts, until ctx ends.
func retentionWorker(ctx context.Context, t *testing.T, rc rueidis.Client, rec *recorder, runner relay.Runner, cfg relay.Config, rs retentionSettings, consumer string) {
	rec.keepAcked = true
	cfg.Retention = rs.state
	if rs.state == 0 {
		cfg.Retention = relay.DeleteOnAck
	}
	w, err := relayworker.New(relayworker.Config{
		Redis: rc, Streams: []string{rec.stream}, Group: soakGroup, Consumer: consumer,
		Apps: template.Dir(os.Getenv(envApps)), Runner: runner,
		StreamRetention: rs.stream, DLQRetention: rs.dlq,
		RetentionInterval: rs.interval, JanitorInterval: rs.interval, ReloadInterval: rs.interval,
		// Restarted workers come back under new names, like pods.
		ConsumerIdle: rs.stream,
		WrapComponents: func(c relay.Components) relay.Components {
			c.Source = ledgerSource{c.Source.(*redisstream.Source), rec}
			c.State = ledgerState{c.State, rec}
			c.Runner = ledgerRunner{c.Runner, rec}
			return c
		},
		Engine: cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	pushCtx, stopPush := context.WithCancel(context.WithoutCancel(ctx))
	pushed := make(chan struct{})
	go func() { defer close(pushed); rec.pushMissingMetric(pushCtx, cfg.Metrics.(*prometheus.Registry)) }()
	if err := w.Run(ctx); err != nil {
		t.Error(err)
	}
	stopPush()
	<-pushed
}

// funcWorkerRunner runs the Func soak's handlers in process. Each records
// its run before doing anything else.
func funcWorkerRunner(rec *recorder) relay.Runner {
	start := func(ctx context.Context, req runtime.Request) error {
		if err := rec.run(ctx, req.MessageID, req.App, req.Handler, req.Attempt); err != nil {
			return err
		}
		// A short random pause widens the window for a kill mid-handler.
		time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
		return nil
	}
	return runtime.NewFunc(map[string]runtime.HandlerFunc{
		soakAppName + "/ok.run": start,
		soakAppName + "/flaky.run": func(ctx context.Context, req runtime.Request) error {
			if err := start(ctx, req); err != nil {
				return err
			}
			var ev struct{ Fail int }
			if err := json.Unmarshal(req.Event, &ev); err != nil {
				return err
			}
			if req.Attempt <= ev.Fail {
				return fmt.Errorf("planned failure %d of %d", req.Attempt, ev.Fail)
			}
			return nil
		},
		soakAppName + "/slow.run": slowRun(rec, start),
		soakAppName + "/bad.run": func(ctx context.Context, req runtime.Request) error {
			if err := start(ctx, req); err != nil {
				return err
			}
			return fmt.Errorf("always fails")
		},
	})
}

// containerdWorkerRunner is the real containerd runner, labelled per
// consumer like relay start does, with handler output going to a
// markerWriter. Connecting is retried: a worker restarted while the soak
// restarts containerd must not give up.
func containerdWorkerRunner(ctx context.Context, t *testing.T, rec *recorder, log *slog.Logger, consumer string) relay.Runner {
	socket, ns := os.Getenv(envSocket), os.Getenv(envNamespace)
	var cc *ctrdclient.Client
	var err error
	for range 60 {
		cc, err = ctrdclient.New(socket, ctrdclient.WithDefaultNamespace(ns), ctrdclient.WithTimeout(5*time.Second))
		if err == nil {
			break
		}
		select {
		case <-ctx.Done():
			t.Skip("stopped while connecting")
		case <-time.After(500 * time.Millisecond):
		}
	}
	if err != nil {
		t.Fatalf("connect to containerd at %s: %v", socket, err)
	}
	t.Cleanup(func() { cc.Close() })
	out := &markerWriter{ctx: context.WithoutCancel(ctx), rec: rec}
	r, err := ctrd.New(cc, ctrd.WithNamespace(ns), ctrd.WithHostID("faults/"+consumer),
		ctrd.WithOutput(out, out), ctrd.WithLogger(log), ctrd.WithCleanupTimeout(10*time.Second),
		// Short, so the end-of-run leftover check need not wait 30s.
		ctrd.WithTaskCreationGrace(2*time.Second),
		// As relay start has it: prepared containers with their tasks.
		ctrd.WithExecHelper(os.Getenv(envHelper)))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Markers the containerd soak's handler script prints, each on a line of
// its own: "<marker> <message id> <attempt>".
const (
	markerStart = "FAULTS-START"
	markerEnd   = "FAULTS-END"
)

// markerWriter receives every forwarded handler line ("[app/handler] text",
// one line per Write, serialised by the runner) and records the markers in
// the ledger; everything else (megabytes, for the big handler) is dropped.
// The record is written before Write returns, so before the runner returns
// and the engine records the outcome.
type markerWriter struct {
	ctx context.Context
	rec *recorder
}

func (w *markerWriter) Write(p []byte) (int, error) {
	n := len(p)
	if !bytes.Contains(p, []byte("FAULTS-")) || p[0] != '[' {
		return n, nil
	}
	end := bytes.Index(p, []byte("] "))
	if end < 0 {
		return n, nil
	}
	app, handler, ok := bytes.Cut(p[1:end], []byte("/"))
	fields := bytes.Fields(p[end+2:])
	if !ok || len(fields) != 3 {
		return n, nil
	}
	id := string(fields[1])
	attempt, err := strconv.Atoi(string(fields[2]))
	if err != nil {
		return n, nil
	}
	switch string(fields[0]) {
	case markerStart:
		_ = w.rec.run(w.ctx, id, string(app), string(handler), attempt)
	case markerEnd:
		name := invocationName(id, string(app), string(handler)) + "/" + strconv.Itoa(attempt)
		_ = persistently(w.ctx, func(ctx context.Context) error {
			rc := w.rec.rc
			return rc.Do(ctx, rc.B().Hset().Key(ledgerKey(w.rec.stream, keyEnds)).FieldValue().FieldValue(name, "1").Build()).Error()
		})
	}
	return n, nil
}

// sweepEvery sweeps sw now and every d until ctx ends.
func sweepEvery(ctx context.Context, sw relay.Sweeper, d time.Duration, log *slog.Logger) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		if err := sw.Sweep(ctx); err != nil && ctx.Err() == nil {
			log.Warn("sweeping leftovers failed", "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
