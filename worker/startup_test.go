package worker_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/worker"
)

// lateRedis is a private redis-server that is not running: its address
// refuses connections until the test starts it.
func lateRedis(t *testing.T) *redistest.Server {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	srv.Stop()
	return srv
}

func dial(addr string, tries *atomic.Int32) func(context.Context) (rueidis.Client, error) {
	return func(context.Context) (rueidis.Client, error) {
		tries.Add(1)
		return rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	}
}

// TestConnectWaitsForALateRedis: a service started before its Redis makes
// its client with worker.Connect, which retries while the connection is
// refused and returns once Redis answers; the Worker then runs on it
// (docs/embedding.md#starting-before-redis).
func TestConnectWaitsForALateRedis(t *testing.T) {
	srv := lateRedis(t)
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	var tries atomic.Int32
	type result struct {
		c   rueidis.Client
		err error
	}
	done := make(chan result, 1)
	start := time.Now()
	go func() {
		c, err := worker.Connect(t.Context(), dial(srv.Addr, &tries), time.Minute, log)
		done <- result{c, err}
	}()
	testutil.WaitFor(t, 10*time.Second, "Connect to say it waits", func() bool {
		return strings.Contains(logs.String(), "Redis does not answer yet; waiting for it") && tries.Load() >= 3
	})
	if err := srv.TryRestart(); err != nil {
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Connect = %v", r.err)
	}
	defer r.c.Close()
	waited := time.Since(start)
	if n, most := strings.Count(logs.String(), "waiting for it"), int(waited/(10*time.Second))+1; n > most {
		t.Errorf("%d waiting lines in %s for %d tries, want at most one per 10s:\n%s", n, waited, tries.Load(), logs)
	}
	if !strings.Contains(logs.String(), "Redis answers; starting") || !strings.Contains(logs.String(), "connection refused") {
		t.Errorf("log:\n%s", logs)
	}

	// The Worker runs on the client Connect made.
	h := newWorkerHarness(t, "events")
	h.cfg.Redis = r.c
	_, stop := h.run()
	defer stop()
	if err := r.c.Do(t.Context(), r.c.B().Xadd().Key(h.streams[0]).Id("*").FieldValue().FieldValue("event", `{"event_name":"INSERT"}`).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the handler run", func() bool { return h.calls.Count("users/events.created") == 1 })
}

// TestConnectGivesUp: past the wait Connect fails naming the wait and the
// last error, after many tries logged in one line; an error that is not
// Redis being unreachable fails the first try, and without a wait the
// first unreachable error is returned as it is.
func TestConnectGivesUp(t *testing.T) {
	srv := lateRedis(t)
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	var tries atomic.Int32
	_, err := worker.Connect(t.Context(), dial(srv.Addr, &tries), 1500*time.Millisecond, log)
	if !errors.Is(err, worker.ErrRedisUnreachable) || !strings.Contains(err.Error(), "within the start-up wait of 1.5s") ||
		!strings.Contains(err.Error(), "connection refused") {
		t.Errorf("Connect = %v, want ErrRedisUnreachable naming the wait and the refusal", err)
	}
	if n := strings.Count(logs.String(), "waiting for it"); tries.Load() < 3 || n != 1 {
		t.Errorf("%d tries, %d log lines; want several tries and one line:\n%s", tries.Load(), n, logs)
	}

	bad := errors.New("WRONGPASS invalid username-password pair")
	calls := 0
	_, err = worker.Connect(t.Context(), func(context.Context) (rueidis.Client, error) { calls++; return nil, bad }, time.Minute, log)
	if !errors.Is(err, bad) || calls != 1 {
		t.Errorf("Connect with a refused login = %v after %d calls, want it at once", err, calls)
	}
	tries.Store(0)
	if _, err := worker.Connect(t.Context(), dial(srv.Addr, &tries), 0, log); err == nil || errors.Is(err, worker.ErrRedisUnreachable) || tries.Load() != 1 {
		t.Errorf("Connect without a wait = %v after %d tries, want the first error", err, tries.Load())
	}
}

// TestRunWaitsForRedis: with StartupWait, a Worker whose Redis went away
// before Run waits for it instead of failing, and consumes once it is
// back; without, Run fails at once.
func TestRunWaitsForRedis(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	srv.Stop()

	h := newWorkerHarness(t, "events")
	h.cfg.Redis = c
	w, err := worker.New(h.cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := w.Run(t.Context()); !errors.Is(err, worker.ErrRedisUnreachable) || !strings.Contains(err.Error(), "Config.StartupWait is 0") {
		t.Fatalf("Run without StartupWait on a stopped Redis = %v, want ErrRedisUnreachable at once", err)
	}

	h = newWorkerHarness(t, "events")
	h.cfg.Redis, h.cfg.StartupWait = c, time.Minute
	_, stop := h.run()
	defer stop()
	testutil.WaitFor(t, 10*time.Second, "Run to say it waits", func() bool {
		return strings.Contains(h.logs.String(), "Redis does not answer yet; waiting for it")
	})
	if err := srv.TryRestart(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the worker to start", func() bool { return strings.Contains(h.logs.String(), "worker started") })
	if err := c.Do(t.Context(), c.B().Xadd().Key(h.streams[0]).Id("*").FieldValue().FieldValue("event", `{"event_name":"INSERT"}`).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the handler run", func() bool { return h.calls.Count("users/events.created") == 1 })
}
