package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
)

// TestSignalsStopGracefully: SIGINT and SIGTERM each stop relay start
// gracefully, exit 0 with the worker's "worker stopped", instead of killing
// it mid-handler with its warm containers and presence label left behind.
// SIGHUP reloads the apps and leaves the worker running.
func TestSignalsStopGracefully(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs relay")
	}
	bin := buildRelay(t)
	apps, err := filepath.Abs("../../examples/apps")
	if err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t, redistest.Options{})
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		stopSig := sig
		if sig == syscall.SIGHUP {
			stopSig = syscall.SIGTERM
		}
		t.Run(sig.String(), func(t *testing.T) {
			cmd := exec.Command(bin, "start", "--runner", "process")
			cmd.Env = append(os.Environ(), "REDIS_URI="+srv.Addr, "REDIS_STREAM=signals", "REDIS_GROUP=relay",
				"RELAY_APPS="+apps, "RELAY_CONSUMER=signals", "RELAY_STATE_DIR="+t.TempDir())
			out := &testutil.Buffer{}
			cmd.Stdout, cmd.Stderr = out, out
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			defer func() {
				_ = cmd.Process.Kill()
				if t.Failed() {
					t.Logf("output:\n%s", out)
				}
			}()
			testutil.WaitFor(t, 30*time.Second, "the worker started", func() bool { return strings.Contains(out.String(), "worker started") })
			if sig == syscall.SIGHUP {
				if err := cmd.Process.Signal(sig); err != nil {
					t.Fatal(err)
				}
				testutil.WaitFor(t, 30*time.Second, "the reload", func() bool { return strings.Contains(out.String(), "SIGHUP: reloading the apps") })
				if strings.Contains(out.String(), "engine stopping") {
					t.Fatalf("SIGHUP stopped the worker:\n%s", out)
				}
			}
			if err := cmd.Process.Signal(stopSig); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("relay start after %v: %v, want exit 0", sig, err)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("relay start did not stop after %v", sig)
			}
			if !strings.Contains(out.String(), "worker stopped") {
				t.Errorf("no graceful stop logged after %v", sig)
			}
		})
	}
}
