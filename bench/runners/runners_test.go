package main

import (
	"os"
	"testing"

	"github.com/relaydev/relay/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestProcessModeMeasuresEveryEvent publishes a few events through the
// process runner: each one is counted once its XACK returned, and the
// time inside the runner is part of it.
func TestProcessModeMeasuresEveryEvent(t *testing.T) {
	if testing.Short() {
		t.Skip("runs handler processes")
	}
	cfg := config{command: []string{"/bin/true"}, n: 5, warmup: 1, dir: t.TempDir()}
	if _, err := os.Stat("/bin/true"); err != nil {
		t.Skip("no /bin/true")
	}
	r, err := measure(t.Context(), cfg, redistest.Client(t), nil, modeProcess)
	if err != nil {
		t.Fatal(err)
	}
	if r.e2e.N != cfg.n || r.run.N != cfg.n {
		t.Fatalf("%d latencies and %d run times, want %d each", r.e2e.N, r.run.N, cfg.n)
	}
	if r.run.Min <= 0 || r.e2e.Min < r.run.Min || r.overhead.Min < 0 {
		t.Errorf("latency %+v, run %+v: the run must be a positive part of the latency", r.e2e, r.run)
	}
}

// TestUnknownModeIsRefused: a typo in -modes is an error naming the modes.
func TestUnknownModeIsRefused(t *testing.T) {
	err := run(config{command: []string{"/bin/true"}, modes: []string{"warm"}})
	if err == nil {
		t.Fatal("run accepted mode warm")
	}
}
