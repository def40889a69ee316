// Command retention checks that, with the invocation state deleted at the
// acknowledgement (REDIS_INVOCATION_RETENTION=0), Redis's key count does
// not grow with the rate of dead letters (bench/RESULTS.md, section 8).
// The retention issue's item 6 found it did: at 100 matched events/s of
// which 2/s failed into the DLQ, the key count grew 187 → 345 in 4
// minutes, because each dead-lettered invocation kept its state (the
// DLQ-written marker) for 48 hours. Now the dead-letter entry's id lives
// in the message's invocation hash and is deleted with it at the ack.
//
// One engine worker (a separate process, wired as relay start wires it,
// retention 0) consumes a stream fed at -rate events/s whose rule allows no
// retries and whose no-op runtime.Func handler fails every -fail-every-th
// event, so each of those is dead-lettered at its first attempt. After
// -warmup of feeding, the key count is sampled every -sample for
// -duration: DBSIZE, less the stream and its dead-letter stream, split into
// invocation hashes (the messages in flight), dead-letter markers (the
// layout before the redesign) and the rest (stats, status and feed: a few
// per stream, whatever the traffic). Then feeding stops, the stream is
// drained and a last sample is taken. The check passes when the key count
// at the end of -duration exceeds that at its start by at most
// max(10, 5 % of the dead letters written in between); it exits 1
// otherwise.
//
//	go run ./bench/retention
//	go run ./bench/retention -duration 4m -rate 100 -fail-every 50
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stream/redisstream"
)

const (
	streamName = "bench-retention"
	group      = "bench"
)

type config struct {
	redis        string
	rate         int
	failEvery    int
	warmup       time.Duration
	duration     time.Duration
	sample       time.Duration
	concurrency  int
	logLevel     string
	dir, appsDir string
}

func main() {
	if benchkit.IsWorker() {
		benchkit.WorkerMain()
	}
	var cfg config
	flag.StringVar(&cfg.redis, "redis", "", "Redis address host:port (default: start a private redis-server; the server must hold no other keys)")
	flag.IntVar(&cfg.rate, "rate", 100, "events published per second, all matched")
	flag.IntVar(&cfg.failEvery, "fail-every", 50, "every n-th event fails and is dead-lettered (50: 2/s at 100 events/s)")
	flag.DurationVar(&cfg.warmup, "warmup", 5*time.Second, "feeding before the first sample")
	flag.DurationVar(&cfg.duration, "duration", time.Minute, "from the first sample to the last one while feeding")
	flag.DurationVar(&cfg.sample, "sample", 10*time.Second, "the interval between samples")
	flag.IntVar(&cfg.concurrency, "concurrency", 8, "the worker's MAX_CONCURRENCY")
	flag.StringVar(&cfg.logLevel, "log-level", "info", "the worker's log level (its log goes to a file)")
	flag.Parse()
	ok, err := run(cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "retention:", err)
		os.Exit(1)
	}
	if !ok {
		os.Exit(1)
	}
}

// sample is the key count at one time.
type sample struct {
	label                 string
	published, deadLetter int64
	dbsize                int64
	streams               int // the stream and its DLQ
	invocations, markers  int
	rest                  []string
}

func (s sample) others() int64 { return s.dbsize - int64(s.streams) }

func run(cfg config) (bool, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "relay-bench-retention-")
	if err != nil {
		return false, err
	}
	defer os.RemoveAll(dir)
	cfg.dir = dir
	if cfg.appsDir, err = benchkit.WriteApps(dir, benchkit.AppSpec{Concurrency: 10000, Retries: "0"}); err != nil {
		return false, err
	}
	addr, admin, closeRedis, err := benchkit.OpenRedis(cfg.redis, dir)
	if err != nil {
		return false, err
	}
	defer closeRedis()
	cfg.redis = addr
	if n, err := admin.Do(ctx, admin.B().Dbsize().Build()).AsInt64(); err != nil || n != 0 {
		return false, fmt.Errorf("the server must hold no keys: DBSIZE %d, %v", n, err)
	}
	fmt.Printf("retention: %s\n", benchkit.Machine())
	fmt.Printf("retention: redis %s, %d events/s, every %d-th failing with no retries (%.1f dead letters/s), invocation retention 0, 1 worker, MAX_CONCURRENCY %d\n",
		addr, cfg.rate, cfg.failEvery, float64(cfg.rate)/float64(cfg.failEvery), cfg.concurrency)

	if err := redisstream.New(admin, streamName, group, "bench").EnsureGroup(ctx); err != nil {
		return false, err
	}
	w, err := benchkit.StartWorker(ctx, benchkit.WorkerSpec{
		Kind: benchkit.KindEngine, Redis: addr, Stream: streamName, Group: group, Consumer: "w1",
		Apps: cfg.appsDir, Concurrency: cfg.concurrency, Handler: benchkit.HandlerFailEvery, FailEvery: cfg.failEvery,
		LogFile: filepath.Join(dir, "w1.log"), LogLevel: cfg.logLevel, Retention: relay.DeleteOnAck,
	})
	if err != nil {
		return false, err
	}
	defer w.Kill()
	if err := w.Go(); err != nil {
		return false, err
	}

	// The feeder publishes event i at start + i/rate, from one goroutine.
	feedCtx, stopFeed := context.WithCancel(ctx)
	defer stopFeed()
	var published atomic.Int64
	fed := make(chan error, 1)
	start := time.Now()
	go func() {
		fed <- benchkit.Feed(feedCtx, admin, streamName, cfg.rate, start, &published)
	}()
	var samples []sample
	take := func(label string) error {
		s, err := count(ctx, admin)
		if err != nil {
			return err
		}
		s.label, s.published = label, published.Load()
		samples = append(samples, s)
		fmt.Fprintf(os.Stderr, "retention: %s: %d published, %d dead-lettered, DBSIZE %d (%d other than the streams)\n",
			label, s.published, s.deadLetter, s.dbsize, s.others())
		return nil
	}
	first := start.Add(cfg.warmup)
	for t := time.Duration(0); t <= cfg.duration; t += cfg.sample {
		if !ctxtime.Sleep(ctx, time.Until(first.Add(t))) {
			return false, ctx.Err()
		}
		select {
		case err := <-fed:
			return false, fmt.Errorf("feeding: %w", err)
		default:
		}
		if err := take(fmt.Sprintf("%ds", int(t.Seconds()))); err != nil {
			return false, err
		}
	}
	load := benchkit.LoadAverage()
	stopFeed()
	if err := <-fed; err != nil {
		return false, fmt.Errorf("feeding: %w", err)
	}
	last, err := lastID(ctx, admin)
	if err != nil {
		return false, err
	}
	for {
		done, err := benchkit.Settled(ctx, admin, streamName, group, last)
		if err != nil {
			return false, err
		}
		if done {
			break
		}
		if !ctxtime.Sleep(ctx, 50*time.Millisecond) {
			return false, ctx.Err()
		}
	}
	if err := take("drained"); err != nil {
		return false, err
	}
	rep, err := w.Stop()
	if err != nil {
		return false, err
	}
	total := published.Load()
	if rep.Handled != total {
		return false, fmt.Errorf("the worker ran %d handlers for %d events", rep.Handled, total)
	}
	wantDL := (total + int64(cfg.failEvery) - 1) / int64(cfg.failEvery) // ids 0, n, 2n, ... below total
	return report(cfg, samples, total, wantDL, load), nil
}

// report prints the samples and the verdict, and returns it.
func report(cfg config, samples []sample, total, wantDL int64, load float64) bool {
	t := benchkit.Table{
		Title: fmt.Sprintf("Redis keys with invocation retention 0 under dead letters: %d events/s, %.1f/s dead-lettered, samples every %s after %s of feeding; load %.2f",
			cfg.rate, float64(cfg.rate)/float64(cfg.failEvery), cfg.sample, cfg.warmup, load),
		Header: []string{"T", "PUBLISHED", "DEAD-LETTERED", "DBSIZE", "− STREAM+DLQ", "INVOCATION HASHES", "DLQ MARKERS", "REST"},
	}
	for _, s := range samples {
		t.Add(s.label, s.published, s.deadLetter, s.dbsize, s.others(), s.invocations, s.markers, len(s.rest))
	}
	_ = t.Print(os.Stdout)
	fmt.Println("(The split is from a SCAN right after DBSIZE: a message in flight may be counted in one and not the other.)")
	start, end, drained := samples[0], samples[len(samples)-2], samples[len(samples)-1]
	growth := end.others() - start.others()
	dl := end.deadLetter - start.deadLetter
	allowed := max(10, dl/20)
	ok := growth <= allowed
	fmt.Printf("\nkeys other than the streams: %d at %s, %d at %s (%+d) while %d messages were dead-lettered (%.2f keys per dead letter); %d once drained\n",
		start.others(), start.label, end.others(), end.label, growth, dl, float64(growth)/float64(max(dl, 1)), drained.others())
	fmt.Printf("the rest once drained: %s\n", restText(drained.rest))
	fmt.Printf("dead-letter entries: %d written for %d events, %d expected\n", drained.deadLetter, total, wantDL)
	if drained.deadLetter != wantDL {
		fmt.Printf("FAIL: the DLQ holds %d entries, want %d\n", drained.deadLetter, wantDL)
		ok = false
	}
	if ok {
		fmt.Printf("OK: the key count does not grow with the failure rate (growth %+d ≤ %d allowed)\n", growth, allowed)
	} else if growth > allowed {
		fmt.Printf("FAIL: the key count grows with the failure rate (growth %+d > %d allowed)\n", growth, allowed)
	}
	return ok
}

func restText(rest []string) string {
	if len(rest) == 0 {
		return "-"
	}
	return fmt.Sprintf("%d: %s", len(rest), strings.Join(rest, ", "))
}

// count samples the key count and sorts every key into its kind.
func count(ctx context.Context, c rueidis.Client) (sample, error) {
	var s sample
	res := c.DoMulti(ctx, c.B().Dbsize().Build(), c.B().Xlen().Key(keys.DLQ(streamName)).Build())
	var err error
	if s.dbsize, err = res[0].AsInt64(); err != nil {
		return s, fmt.Errorf("dbsize: %w", err)
	}
	if s.deadLetter, err = res[1].AsInt64(); err != nil {
		return s, fmt.Errorf("xlen: %w", err)
	}
	inv := keys.Invocation(streamName, group, "")
	// The dead-letter markers of the layout before the redesign:
	// relay:<stream>:dlq:written:<group>:<message-id>:<app>/<handler>.
	marker := keys.DLQ(streamName) + ":written:"
	cursor := uint64(0)
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return s, fmt.Errorf("scan: %w", err)
		}
		for _, k := range e.Elements {
			switch {
			case k == streamName || k == keys.DLQ(streamName):
				s.streams++
			case strings.HasPrefix(k, inv):
				s.invocations++
			case strings.HasPrefix(k, marker):
				s.markers++
			default:
				s.rest = append(s.rest, k)
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	slices.Sort(s.rest)
	s.rest = slices.Compact(s.rest) // SCAN may return a key twice
	return s, nil
}

func lastID(ctx context.Context, c rueidis.Client) (string, error) {
	e, err := c.Do(ctx, c.B().Xrevrange().Key(streamName).End("+").Start("-").Count(1).Build()).AsXRange()
	if err != nil || len(e) == 0 {
		return "", fmt.Errorf("last entry of %s: %d, %w", streamName, len(e), err)
	}
	return e[0].ID, nil
}
