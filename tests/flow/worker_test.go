package flow_test

import (
	"encoding/json"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/workerproc"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/worker"
)

// Worker-process settings, passed through the environment.
const (
	envWorker  = "FLOW_WORKER"  // consumer name; set only in worker processes
	envRedis   = "FLOW_REDIS"   // host:port
	envStream  = "FLOW_STREAM"  // stream name; the group is flowGroup
	envApps    = "FLOW_APPS"    // apps root
	envTimings = "FLOW_TIMINGS" // a timings, as JSON
)

// flowGroup is every test's consumer group.
const flowGroup = "flow"

// probeHandler is the one handler name every rule of the tests' templates
// uses; what a run does is said by its event (probeEvent).
const probeHandler = "probe.run"

// timings are the library options a test shrinks so that it runs in
// seconds: relay.Config's, the ones faults' soaks shrink too. ProbeKey is
// the field path whose value (app.KeyOf) the probe counts overlapping runs
// of, the rule's limit key.
type timings struct {
	MinPendingIdle    time.Duration
	ReclaimInterval   time.Duration
	HeartbeatInterval time.Duration
	LeaseGrace        time.Duration
	ThrottlePoll      time.Duration
	Backoff           time.Duration
	ShutdownTimeout   time.Duration
	ProbeKey          string
}

// baseTimings are short timings most tests take: a dead worker's messages
// are reclaimed a second after it stopped heartbeating them.
func baseTimings() timings {
	return timings{
		MinPendingIdle:    time.Second,
		ReclaimInterval:   100 * time.Millisecond,
		HeartbeatInterval: 250 * time.Millisecond,
		LeaseGrace:        2 * time.Second,
		ThrottlePoll:      relay.DefaultThrottlePoll,
		Backoff:           100 * time.Millisecond,
		ShutdownTimeout:   time.Second,
	}
}

func (tm timings) engineConfig() relay.Config {
	return relay.Config{
		MinPendingIdle:    tm.MinPendingIdle,
		ReclaimInterval:   tm.ReclaimInterval,
		HeartbeatInterval: tm.HeartbeatInterval,
		LeaseGrace:        tm.LeaseGrace,
		ThrottlePoll:      tm.ThrottlePoll,
		Backoff:           []time.Duration{tm.Backoff},
		ShutdownTimeout:   tm.ShutdownTimeout,
	}
}

// probeEvent is what the probe handler reads of an event.
type probeEvent struct {
	// SleepMS is how long the run takes.
	SleepMS int `json:"sleep_ms"`
	// Block, when > 0, makes attempt Block run until its context ends
	// (its timeout, or the worker stopping): a run to kill mid-way.
	Block int `json:"block"`
}

// TestWorkerProcess is not a test: the tests run the test binary again
// with FLOW_WORKER set to a consumer name, making this a worker process. It
// runs a worker.Worker over the apps root, with the probe as the handler
// of every rule, until SIGKILL, or until SIGTERM stops it gracefully.
func TestWorkerProcess(t *testing.T) {
	consumer, ctx := workerproc.Worker(t, envWorker)
	var tm timings
	if err := json.Unmarshal([]byte(os.Getenv(envTimings)), &tm); err != nil {
		t.Fatalf("%s: %v", envTimings, err)
	}
	rc := redistest.Connect(t, os.Getenv(envRedis))
	streamName := os.Getenv(envStream)
	p := &probe{rc: rc, stream: streamName, group: flowGroup, key: app.FieldPath(tm.ProbeKey), pid: os.Getpid()}
	cfg := tm.engineConfig()
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	w, err := worker.New(worker.Config{
		Redis: rc, Streams: []string{streamName}, Group: flowGroup, Consumer: consumer,
		Apps:   template.Dir(os.Getenv(envApps)),
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{probeHandler: p.run}),
		// Nothing the tests read is trimmed while they run.
		StreamRetention: worker.Disabled, DLQRetention: worker.Disabled,
		Engine: cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(ctx); err != nil {
		t.Error(err)
	}
}
