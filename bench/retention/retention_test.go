package main

import (
	"os/exec"
	"testing"
	"time"

	"github.com/relaydev/relay/bench/internal/benchkit"
)

// TestMain serves as a worker when run starts this test binary as one.
func TestMain(m *testing.M) {
	if benchkit.IsWorker() {
		benchkit.WorkerMain()
	}
	m.Run()
}

// TestRunDeadLettersWithoutKeys runs the check briefly on a private
// redis-server: every failing event is dead-lettered once, and the keys
// left are only the streams and the per-stream ones.
func TestRunDeadLettersWithoutKeys(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server and a worker process")
	}
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Skip("no redis-server in PATH")
	}
	cfg := config{rate: 100, failEvery: 10, warmup: 2 * time.Second, duration: 2 * time.Second, sample: time.Second, concurrency: 4, logLevel: "info"}
	ok, err := run(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !ok {
		t.Error("the check failed (see its output)")
	}
}
