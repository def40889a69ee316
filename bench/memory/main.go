// Command memory measures the memory of one worker while 10,000 messages are
// pending for it (bench/RESULTS.md, section 3). The worker is a separate
// process (this program re-executed) running a relay.Engine wired as relay
// start wires it, with an in-process handler that blocks until released, so
// that what is pending stays pending while it is measured. Each scenario gets
// a fresh stream and a fresh worker process:
//
//   - idle: the worker started and read nothing; the baseline.
//   - backlog: -messages new entries wait in the stream. The reader takes a
//     message slot before it reads, so the worker holds at most
//     2 × MAX_CONCURRENCY messages whatever the backlog: memory should not
//     grow with it.
//   - reclaim: -messages entries sit in the PEL of a consumer that died,
//     idle past MinPendingIdle (shrunk to 1s here, the only timing changed).
//     The worker's reclaim loop takes them over (XAUTOCLAIM): how many it
//     holds in memory, beyond the ones it can run, shows whether reclaiming
//     is bounded by free slots.
//   - in flight: MAX_CONCURRENCY is raised to -messages and every message
//     is in a running handler at once: the per-message cost of the Engine
//     (goroutine, delivery, spans, lease) at its most expensive.
//
// The table gives the worker's RSS (VmRSS), Go heap and goroutine stacks in
// use after a forced GC, handlers started, the entries the worker owns in
// the group's PEL, and heap plus stack bytes per message over the idle
// baseline.
//
//	go run ./bench/memory
//	go run ./bench/memory -messages 20000 -redis 127.0.0.1:6390
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stream/redisstream"
)

const group = "bench"

func main() {
	if benchkit.IsWorker() {
		benchkit.WorkerMain()
	}
	redis := flag.String("redis", "", "Redis address host:port (default: start a private redis-server)")
	messages := flag.Int("messages", 10000, "messages pending for the worker")
	concurrency := flag.Int("concurrency", 8, "the worker's MAX_CONCURRENCY (except in the in-flight scenario)")
	flag.Parse()
	if err := run(*redis, *messages, *concurrency); err != nil {
		fmt.Fprintln(os.Stderr, "memory:", err)
		os.Exit(1)
	}
}

// scenario is one measurement.
type scenario struct {
	name string
	// concurrency is the worker's MAX_CONCURRENCY.
	concurrency int
	// prepare puts n messages in stream name before the worker starts.
	prepare func(ctx context.Context, c rueidis.Client, name string, n int) error
	// expectStarted is how many handlers must have started before the
	// worker is measured.
	expectStarted func(n, concurrency int) int
	// maxOwned, when set, is how many PEL entries the worker should own
	// at most: what it can start.
	maxOwned func(n, concurrency int) int
	// minIdle is the worker's MinPendingIdle (0: default).
	minIdle time.Duration
	note    string
}

// scenarios are the measurements, in order; the first is the baseline.
func scenarios(concurrency int) []scenario {
	none := func(context.Context, rueidis.Client, string, int) error { return nil }
	backlog := func(ctx context.Context, c rueidis.Client, name string, n int) error {
		_, err := benchkit.Fill(ctx, c, name, 0, n)
		return err
	}
	// orphaned delivers the entries to a consumer that then "dies": they
	// stay in the PEL, owned by it, until their idle time passes minIdle.
	orphaned := func(ctx context.Context, c rueidis.Client, name string, n int) error {
		if err := backlog(ctx, c, name, n); err != nil {
			return err
		}
		cmd := c.B().Xreadgroup().Group(group, "dead").Count(int64(n)).Streams().Key(name).Id(">").Build()
		if err := c.Do(ctx, cmd).Error(); err != nil {
			return fmt.Errorf("deliver to the dead consumer: %w", err)
		}
		time.Sleep(1100 * time.Millisecond) // idle past the 1s MinPendingIdle
		return nil
	}
	// What a worker can start: its message slots, plus the one reclaimed
	// entry that may wait for a slot.
	slots := func(_, c int) int { return 2*c + 1 }
	return []scenario{
		{name: "idle", concurrency: concurrency, prepare: none,
			expectStarted: func(int, int) int { return 0 }, note: "baseline"},
		{name: "backlog", concurrency: concurrency, prepare: backlog, maxOwned: slots,
			expectStarted: func(_, c int) int { return c }, note: "new entries in the stream"},
		{name: "reclaim", concurrency: concurrency, prepare: orphaned, minIdle: time.Second, maxOwned: slots,
			expectStarted: func(_, c int) int { return c }, note: "entries of a dead consumer, reclaimable"},
		{name: "in flight", concurrency: 0, prepare: backlog,
			expectStarted: func(n, _ int) int { return n }, note: "every message in a running handler"},
	}
}

func run(addr string, n, concurrency int) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "relay-bench-memory-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	apps, err := benchkit.WriteApps(dir, benchkit.AppSpec{Concurrency: 10000, Timeout: "15m"})
	if err != nil {
		return err
	}
	addr, admin, closeRedis, err := benchkit.OpenRedis(addr, dir)
	if err != nil {
		return err
	}
	defer closeRedis()

	scenarios := scenarios(concurrency)
	fmt.Printf("memory: %s\n", benchkit.Machine())
	fmt.Printf("memory: redis %s, %d messages, worker is a process; RSS is VmRSS, heap and stacks are HeapInuse and StackInuse after a forced GC\n", addr, n)
	t := benchkit.Table{
		Title:  fmt.Sprintf("worker memory with %d pending messages", n),
		Header: []string{"SCENARIO", "MAX_CONCURRENCY", "RSS MiB", "HEAP MiB", "STACKS MiB", "GOROUTINES", "HANDLERS RUNNING", "OWNED IN PEL", "HEAP+STACK B/MSG OVER IDLE", "WHAT IS PENDING"},
	}
	runID := fmt.Sprintf("%d", time.Now().UnixNano()%1e9)
	var idle benchkit.Report
	for i, sc := range scenarios {
		if sc.concurrency == 0 {
			sc.concurrency = n // in flight: room for every message
		}
		name := fmt.Sprintf("bench-memory-%s-%d", runID, i)
		rep, owned, err := measure(ctx, addr, apps, admin, name, n, sc)
		if err == nil && sc.maxOwned != nil && owned > int64(sc.maxOwned(n, sc.concurrency)) {
			sc.note += fmt.Sprintf(" (owns more than the %d it can start)", sc.maxOwned(n, sc.concurrency))
		}
		cleanup(context.WithoutCancel(ctx), admin, name)
		if err != nil {
			return fmt.Errorf("%s: %w", sc.name, err)
		}
		if i == 0 {
			idle = rep
		}
		perMsg := "-"
		if i > 0 {
			used := rep.HeapInuse + rep.StackInuse - idle.HeapInuse - idle.StackInuse
			perMsg = fmt.Sprintf("%.0f", float64(used)/float64(n))
		}
		t.Add(sc.name, sc.concurrency, benchkit.MiB(rep.RSS), benchkit.MiB(rep.HeapInuse), benchkit.MiB(rep.StackInuse), rep.Goroutines,
			rep.Started, owned, perMsg, sc.note)
	}
	return t.Print(os.Stdout)
}

// measure prepares the stream, starts a worker, waits until it has started
// the expected handlers and claimed what it will claim, and returns its
// memory report and how many PEL entries it owns.
func measure(ctx context.Context, addr, apps string, admin rueidis.Client, name string, n int, sc scenario) (benchkit.Report, int64, error) {
	if err := redisstream.New(admin, name, group, "bench").EnsureGroup(ctx); err != nil {
		return benchkit.Report{}, 0, err
	}
	if err := sc.prepare(ctx, admin, name, n); err != nil {
		return benchkit.Report{}, 0, err
	}
	w, err := benchkit.StartWorker(ctx, benchkit.WorkerSpec{
		Kind: benchkit.KindEngine, Redis: addr, Stream: name, Group: group, Consumer: "worker",
		Apps: apps, Concurrency: sc.concurrency, Handler: benchkit.HandlerBlock, LogLevel: "info",
		MinPendingIdle: sc.minIdle,
	})
	if err != nil {
		return benchkit.Report{}, 0, err
	}
	defer w.Kill()
	if err := w.Go(); err != nil {
		return benchkit.Report{}, 0, err
	}
	want := int64(sc.expectStarted(n, sc.concurrency))
	deadline := time.Now().Add(5 * time.Minute)
	var rep benchkit.Report
	var owned, prevOwned int64 = 0, -1
	// Settled: the handlers are running and the PEL share stopped moving
	// (the reclaim pass is over) for two polls in a row.
	for stable := 0; stable < 2; {
		if time.Now().After(deadline) {
			return rep, owned, fmt.Errorf("%d of %d handlers started after 5 minutes", rep.Started, want)
		}
		time.Sleep(500 * time.Millisecond) // poll interval
		if rep, err = w.Mem(); err != nil {
			return rep, 0, err
		}
		if owned, err = benchkit.PendingOf(ctx, admin, name, group, "worker"); err != nil {
			return rep, 0, err
		}
		if rep.Started >= want && owned == prevOwned {
			stable++
		} else {
			stable = 0
		}
		prevOwned = owned
	}
	if err := w.Release(); err != nil {
		return rep, owned, err
	}
	if _, err := w.Stop(); err != nil {
		return rep, owned, err
	}
	return rep, owned, nil
}

func cleanup(ctx context.Context, c rueidis.Client, name string) {
	for _, k := range []string{name, keys.DLQ(name), keys.Stats(name, group)} {
		if err := c.Do(ctx, c.B().Unlink().Key(k).Build()).Error(); err != nil {
			fmt.Fprintf(os.Stderr, "memory: delete %s: %v\n", k, err)
		}
	}
}
