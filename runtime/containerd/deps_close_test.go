package containerd_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/depstest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// hangingIndex listens on a loopback port and never answers: an index
// that a build waits on until its own timeout.
func hangingIndex(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		l.Close()
		<-done
		for _, c := range conns {
			c.Close()
		}
	})
	return "http://" + l.Addr().String() + "/simple"
}

// TestDepsCloseEndsBuild: closing a Runner (a worker's graceful stop)
// while a dependency build waits on an index that never answers ends the
// build, releases its lease and removes its build container, instead of
// leaving the lease to hold off every other worker's build of that
// manifest until it expires (docs/runtimes.md "Dependencies").
func TestDepsCloseEndsBuild(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.WriteFiles(t, f.app, map[string]string{
		"requirements.txt": "--index-url " + hangingIndex(t) + "\n--trusted-host 127.0.0.1\nnosuchpackage==1.0\n",
		"handlers.py":      "def hello(event):\n    pass\n",
	})
	r, log := depsRunner(t, f)
	req := f.request("handlers.hello")
	req.Spec.Deps = depsOf(t, f.app, runtime.RuntimePython3)

	// The caller gives up once the build runs; the build goes on.
	pctx, cancel := context.WithCancel(t.Context())
	go func() {
		for !strings.Contains(log.String(), "building dependency image") {
			time.Sleep(20 * time.Millisecond)
		}
		time.Sleep(2 * time.Second) // the installer is waiting on the index
		cancel()
	}()
	if err := r.Prepare(pctx, "app", req.Spec); !errors.Is(err, context.Canceled) {
		t.Fatalf("Prepare: %v, want context.Canceled", err)
	}
	ctx := namespaces.WithNamespace(t.Context(), f.client.DefaultNamespace())
	held, err := f.client.LeasesService().List(ctx, "id~=^relay-deps-")
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 1 {
		t.Fatalf("%d build leases while the build runs, want 1", len(held))
	}

	cctx, ccancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer ccancel()
	if err := r.Close(cctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	held, err = f.client.LeasesService().List(ctx, "id~=^relay-deps-")
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 0 {
		t.Errorf("build lease %s left after Close; other workers wait for it to expire", held[0].ID)
	}
	if left := containerdtest.Leftovers(ctx, f.client); len(left) != 0 {
		t.Errorf("left after Close: %v", left)
	}
	if _, err := r.Run(t.Context(), req); !errors.Is(err, runtime.ErrUnavailable) {
		t.Errorf("Run after Close: %v, want ErrUnavailable (no new build)", err)
	}
	if n := strings.Count(log.String(), "building dependency image"); n != 1 {
		t.Errorf("%d builds, want 1:\n%s", n, log)
	}
}

// TestDepsBuildTimeout: a build killed at the build timeout (here pip
// waiting on an index that never answers) is a failed build of that
// manifest: the app is unavailable with a reason that says so and points
// at the index, and the next Prepare within the retry interval returns the
// same reason without building again, instead of starting another build
// at once (each of which a worker's reload waits for).
func TestDepsBuildTimeout(t *testing.T) {
	f := newRuntimeFixture(t, runtime.RuntimePython3, envPythonArchive, pythonImage, nil)
	depstest.WriteFiles(t, f.app, map[string]string{
		"requirements.txt": "--index-url " + hangingIndex(t) + "\n--trusted-host 127.0.0.1\nnosuchpackage==1.0\n",
		"handlers.py":      "def hello(event):\n    pass\n",
	})
	r, log := depsRunner(t, f, containerd.WithBuildTimeout(5*time.Second))
	spec := f.request("handlers.hello").Spec
	spec.Deps = depsOf(t, f.app, runtime.RuntimePython3)
	for i := range 2 {
		err := r.Prepare(t.Context(), "app", spec)
		if !errors.Is(err, runtime.ErrUnavailable) || !strings.Contains(err.Error(), "timed out") || !strings.Contains(err.Error(), "package index") {
			t.Fatalf("Prepare %d: %v, want ErrUnavailable saying the build timed out", i, err)
		}
	}
	if n := strings.Count(log.String(), "building dependency image"); n != 1 {
		t.Errorf("%d builds, want 1 (the timed-out build is remembered for the retry interval):\n%s", n, log)
	}
	containerdtest.AssertClean(t, f.client)
}
