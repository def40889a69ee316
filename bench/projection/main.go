// Command projection checks the memory projection of relay stats against
// the memory Redis really reaches (bench/RESULTS.md, section 9). A worker
// trims its streams every RetentionInterval, removing what is older than
// the retention: just before a trim a stream holds retention + interval of
// entries, and that peak, not the mean, is what hits maxmemory. The
// projection is meant to be that peak (docs/operations.md#memory-budget).
//
// One worker (worker.Worker in this process, wired as relay start wires
// it, with a no-op runtime.Func handler that fails every -fail-every-th
// event into the dead-letter queue, no retries) consumes a stream fed at
// -rate events/s, with the stream and dead-letter retentions and the trim
// interval of the flags. used_memory is sampled every -sample; the
// projection is measured as relay stats measures it
// (redisstats.MeasureMemory with the worker's retentions) every
// -measure. After -warmup (a retention and an interval by default, so
// that both streams trim in their steady cycle) the highest used_memory
// is compared with the median projection, each as growth over the
// used_memory before the first event. The check passes when the projected
// growth is within -tolerance (25 %) of the measured peak growth; it exits 1
// otherwise.
//
//	go run ./bench/projection
//	go run ./bench/projection -rate 200 -stream-retention 10s -interval 20s -duration 1m
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/worker"
)

const (
	streamName = "bench-projection"
	group      = "bench"
)

type config struct {
	redis                             string
	rate, failEvery                   int
	streamRetention, dlqRetention     time.Duration
	interval                          time.Duration
	warmup, duration, sample, measure time.Duration
	tolerance                         float64
}

func main() {
	var cfg config
	flag.StringVar(&cfg.redis, "redis", "", "Redis address host:port (default: start a private redis-server; the server must hold no other keys)")
	flag.IntVar(&cfg.rate, "rate", 100, "events published per second, all matched")
	flag.IntVar(&cfg.failEvery, "fail-every", 50, "every n-th event fails and is dead-lettered (50: 2/s at 100 events/s)")
	flag.DurationVar(&cfg.streamRetention, "stream-retention", 30*time.Second, "the worker's stream retention")
	flag.DurationVar(&cfg.dlqRetention, "dlq-retention", 30*time.Second, "the worker's dead-letter retention")
	flag.DurationVar(&cfg.interval, "interval", time.Minute, "the worker's RetentionInterval: how often it trims")
	flag.DurationVar(&cfg.warmup, "warmup", 0, "feeding before the comparison starts (default: the longer retention + interval)")
	flag.DurationVar(&cfg.duration, "duration", 3*time.Minute, "how long the comparison runs, after the warm-up")
	flag.DurationVar(&cfg.sample, "sample", 250*time.Millisecond, "the interval between used_memory samples")
	flag.DurationVar(&cfg.measure, "measure", 10*time.Second, "the interval between projections")
	flag.Float64Var(&cfg.tolerance, "tolerance", 0.25, "how far the projected growth may be from the measured peak growth, as a share of the latter")
	flag.Parse()
	if cfg.warmup == 0 {
		cfg.warmup = max(cfg.streamRetention, cfg.dlqRetention) + cfg.interval
	}
	ok, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "projection:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

func run(cfg config) (bool, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "relay-bench-projection-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	apps, err := benchkit.WriteApps(dir, benchkit.AppSpec{Concurrency: 10000, Retries: "0"})
	if err != nil {
		return false, err
	}
	addr, admin, closeRedis, err := benchkit.OpenRedis(cfg.redis, dir)
	if err != nil {
		return false, err
	}
	defer closeRedis()
	if n, err := admin.Do(ctx, admin.B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		return false, fmt.Errorf("the server must hold no keys: DBSIZE %d, %v", n, err)
	}
	fmt.Printf("projection: %s\n", benchkit.Machine())
	fmt.Printf("projection: redis %s, %d events/s, every %d-th dead-lettered, stream retention %s, dead-letter retention %s, trimmed every %s, invocation state deleted at the ack\n",
		addr, cfg.rate, cfg.failEvery, cfg.streamRetention, cfg.dlqRetention, cfg.interval)

	var handled atomic.Int64
	fail := errors.New("fails by design")
	w, err := worker.New(worker.Config{
		Redis: admin, Streams: []string{streamName}, Group: group, Consumer: "w1",
		Apps: template.Dir(apps), StateDir: filepath.Join(dir, "state"), DisableStats: true,
		Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{benchkit.AppName + "/" + benchkit.HandlerName: func(context.Context, runtime.Request) error {
			if handled.Add(1)%int64(cfg.failEvery) == 1 {
				return runtime.Permanent(fail)
			}
			return nil
		}}),
		StreamRetention: cfg.streamRetention, DLQRetention: cfg.dlqRetention, RetentionInterval: cfg.interval,
		Engine: relay.Config{Retention: relay.DeleteOnAck, Logger: slog.New(slog.DiscardHandler)},
	})
	if err != nil {
		return false, err
	}
	wctx, stopWorker := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- w.Run(wctx) }()
	defer func() { stopWorker(); <-stopped }()
	if !ctxtime.Sleep(ctx, time.Second) { // the worker creates the group and trims once
		return false, ctx.Err()
	}
	baseline, err := benchkit.UsedMemory(ctx, admin)
	if err != nil {
		return false, err
	}

	feedCtx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	fed := make(chan error, 1)
	start := time.Now()
	go func() { fed <- benchkit.Feed(feedCtx, admin, streamName, cfg.rate, start, nil) }()

	ret := stats.Retentions{Stream: cfg.streamRetention, DLQ: cfg.dlqRetention, TrimInterval: cfg.interval}
	var peak int64
	var peakAt time.Duration
	var used []int64
	var projections []stats.Memory
	compareFrom := start.Add(cfg.warmup)
	end := compareFrom.Add(cfg.duration)
	nextMeasure := compareFrom
	for now := time.Now(); now.Before(end); now = time.Now() {
		select {
		case err := <-fed:
			return false, fmt.Errorf("feeding: %w", err)
		case err := <-stopped:
			return false, fmt.Errorf("the worker stopped: %v", err)
		default:
		}
		if now.After(compareFrom) {
			u, err := benchkit.UsedMemory(ctx, admin)
			if err != nil {
				return false, err
			}
			used = append(used, u)
			if u > peak {
				peak, peakAt = u, now.Sub(start)
			}
			if !now.Before(nextMeasure) {
				m, err := redisstats.MeasureMemory(ctx, admin, streamName, group, ret, stats.Budget{})
				if err != nil {
					return false, fmt.Errorf("measuring memory: %w", err)
				}
				projections = append(projections, m)
				fmt.Fprintf(os.Stderr, "projection: %3.0fs used %s, stream %d entries, dead letters %d, projected %s\n",
					now.Sub(start).Seconds(), stats.FormatBytes(u), m.Stream.Items, m.DLQ.Items, stats.FormatBytes(m.Projected))
				nextMeasure = nextMeasure.Add(cfg.measure)
			}
		}
		if !ctxtime.Sleep(ctx, cfg.sample) {
			return false, ctx.Err()
		}
	}
	load := benchkit.LoadAverage()
	stopFeed()
	if err := <-fed; err != nil {
		return false, fmt.Errorf("feeding: %w", err)
	}
	return report(cfg, baseline, used, peak, peakAt, projections, load), nil
}

// report prints the comparison and the verdict, and returns it.
func report(cfg config, baseline int64, used []int64, peak int64, peakAt time.Duration, ms []stats.Memory, load float64) bool {
	if len(ms) == 0 || len(used) == 0 {
		fmt.Println("FAIL: nothing measured")
		return false
	}
	slices.SortFunc(ms, func(a, b stats.Memory) int { return cmp.Compare(a.Projected, b.Projected) })
	med := ms[len(ms)/2]
	var sum float64
	for _, u := range used {
		sum += float64(u)
	}
	mean := int64(sum / float64(len(used)))
	t := benchkit.Table{
		Title: fmt.Sprintf("relay stats' projection against used_memory: %d events/s, stream retention %s, dead-letter retention %s, trimmed every %s, after %s of feeding, over %s; load %.2f",
			cfg.rate, cfg.streamRetention, cfg.dlqRetention, cfg.interval, cfg.warmup, cfg.duration, load),
		Header: []string{"", "USED_MEMORY", "GROWTH OVER BASELINE", "STREAM", "DEAD LETTERS"},
	}
	t.Add("baseline (no event yet)", baseline, "-", "-", "-")
	t.Add(fmt.Sprintf("measured peak (at %.0fs)", peakAt.Seconds()), peak, peak-baseline, "-", "-")
	t.Add("measured mean", mean, mean-baseline, "-", "-")
	t.Add(fmt.Sprintf("projected (median of %d)", len(ms)), med.Projected, med.Projected-baseline, med.Stream.Projected, med.DLQ.Projected)
	noCadence := med
	noCadence.Project(stats.Retentions{Stream: cfg.streamRetention, DLQ: cfg.dlqRetention})
	t.Add("projected without the trim interval", noCadence.Projected, noCadence.Projected-baseline, noCadence.Stream.Projected, noCadence.DLQ.Projected)
	_ = t.Print(os.Stdout)
	grew, projected := float64(peak-baseline), float64(med.Projected-baseline)
	off := (projected - grew) / grew
	if math.Abs(off) <= cfg.tolerance {
		fmt.Printf("OK: the projected growth is %+.0f%% of the measured peak growth (within %.0f%%)\n", 100*off, 100*cfg.tolerance)
		return true
	}
	fmt.Printf("FAIL: the projected growth is %+.0f%% of the measured peak growth (over %.0f%%)\n", 100*off, 100*cfg.tolerance)
	return false
}
