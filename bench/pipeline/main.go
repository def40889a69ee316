// Command pipeline measures how fast Relay drains a stream, in events per
// second, against the physical limit of its design: a minimal loop of
// XREADGROUP COUNT k and one XACK of the k ids, over the same Redis, in the
// same run (bench/RESULTS.md, section 1). Every speed figure it prints is
// also given as a ratio against that anchor.
//
// For each mode and worker count it creates a fresh stream and consumer
// group, appends -events events that the benchmark rule matches, starts the
// workers, and times them from the moment they are told to go until the
// group has delivered every entry and none is pending.
//
//   - raw: the minimal loop, Batch = -batch (default 2 × -concurrency, the
//     most an Engine reads at once), over -raw-events (default 5 × -events,
//     so that the anchor runs for about a second, not a fifth of one).
//   - engine: a relay.Engine wired as relay start wires it (stream source,
//     Lua invocation state, DLQ writer, cluster stats, Prometheus registry,
//     a text log at info written to a file, MAX_CONCURRENCY -concurrency)
//     whose one rule runs a no-op runtime.Func handler, so the figures are
//     Relay's own cost per event: read, match, claim, run, settle (record
//     the outcome and XACK), retain. At 1 worker it runs once per
//     -retentions (default 48h and 0), at more workers once per
//     -multi-retentions (default 48h).
//
// Every worker is a separate process (this program re-executed), each with
// its own Redis client, as relay start workers are; the producer and the
// measuring loop run in this process. Besides the rate and its share of
// the raw loop's at the same worker count, each row reports, per event:
// Redis's reads (INFO stats total_reads_processed, less the measuring
// loop's own, calibrated first: about one per round trip of a client),
// Redis's CPU time (INFO cpu used_cpu_sys + used_cpu_user) and the
// workers' (rusage), both also as × raw, the workers' heap allocations
// (runtime.MemStats.Mallocs, counted in the workers) and the Redis memory
// left; then the Redis commands per event (INFO commandstats deltas,
// commands run inside scripts included), which is where the optimisations
// of section 4 of bench/RESULTS.md come from, and the targets,
// met or not (never asserted: the machine's load moves every figure).
//
// Then, with -trickle n, the latency at a trickle: a raw worker and an
// engine worker, idle, get one event each every -trickle-interval (1 s),
// and each event's time from its XADD to the return of its acknowledgement
// in the worker is summarised (p50, p99).
//
// Without -redis it starts a private redis-server (no persistence) and
// stops it at the end:
//
//	go run ./bench/pipeline
//	go run ./bench/pipeline -events 50000 -workers 1,2,3 -runs 5 -trickle 0
//	go run ./bench/pipeline -redis 127.0.0.1:6390 -profile /tmp/prof
//
// -profile DIR writes a CPU profile and an allocations profile of every
// engine worker. Against an existing server it uses streams named
// bench-pipeline-<run>-… and deletes them, their invocation hashes, DLQ and
// stats afterwards; the reads per event are only the workers' when no other
// client uses that server.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stream/redisstream"
)

const group = "bench"

// modeReclaim measures the recovery path: every event is pending on a
// consumer that died, idle past MinPendingIdle, and engine workers take
// them over by reclaiming (XAUTOCLAIM) instead of reading.
const modeReclaim = "reclaim"

// reclaimIdle is the MinPendingIdle of the reclaim mode: the default is a
// minute, which would only add a wait.
const reclaimIdle = time.Second

func main() {
	if benchkit.IsWorker() {
		benchkit.WorkerMain()
	}
	var cfg config
	flag.StringVar(&cfg.redis, "redis", "", "Redis address host:port (default: start a private redis-server)")
	flag.IntVar(&cfg.events, "events", 20000, "events per measurement")
	flag.IntVar(&cfg.rawEvents, "raw-events", 0, "events per measurement of the raw loop (default 5 × -events: the anchor of every ratio drains 20,000 events in about 0.2 s, where one scheduling hiccup moves its rate by tens of percent)")
	workers := flag.String("workers", "1,3", "worker counts to measure, comma-separated")
	modes := flag.String("modes", "raw,engine", "modes to measure: raw, engine, reclaim (engine workers taking over events pending on a dead consumer)")
	retentions := flag.String("retentions", "48h,0", "invocation state retentions the engine and reclaim modes run with at 1 worker, comma-separated, a row each (REDIS_INVOCATION_RETENTION; 0 deletes the state with the acknowledgement)")
	multiRetentions := flag.String("multi-retentions", "48h", "the retentions of the engine and reclaim rows with more than one worker")
	flag.IntVar(&cfg.trickle, "trickle", 40, "events of the trickle latency, per pipeline (raw, and engine at the first of -retentions), one every -trickle-interval; 0 skips it")
	flag.DurationVar(&cfg.trickleInterval, "trickle-interval", time.Second, "the interval between a pipeline's trickle events")
	flag.IntVar(&cfg.concurrency, "concurrency", 8, "each engine worker's MAX_CONCURRENCY")
	flag.IntVar(&cfg.batch, "batch", 0, "the raw loop's XREADGROUP COUNT (default 2 × -concurrency, an Engine's largest read)")
	flag.IntVar(&cfg.unmatched, "unmatched", 0, "percent of the events that match no rule (0-100); the engine acknowledges those without running anything")
	flag.IntVar(&cfg.runs, "runs", 3, "runs per row; the row shows the run with the median rate")
	flag.StringVar(&cfg.logLevel, "log-level", "info", "engine log level, as LOG_LEVEL (the log is written to a file in the work directory)")
	flag.StringVar(&cfg.profile, "profile", "", "write a CPU profile of every engine worker into this directory")
	flag.Parse()
	if cfg.batch == 0 {
		cfg.batch = 2 * cfg.concurrency
	}
	if cfg.rawEvents == 0 {
		cfg.rawEvents = 5 * cfg.events
	}
	var err error
	if cfg.workers, err = ints(*workers); err == nil {
		cfg.modes = strings.Split(*modes, ",")
		if cfg.retentions, err = durations(*retentions); err == nil {
			if cfg.multiRetentions, err = durations(*multiRetentions); err == nil {
				err = run(cfg)
			}
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pipeline:", err)
		os.Exit(1)
	}
}

type config struct {
	redis      string
	events     int
	rawEvents  int // of the raw mode; 0: events
	workers    []int
	modes      []string
	retentions []retention
	// multiRetentions are the retentions of the rows with more than one
	// worker.
	multiRetentions []retention
	// trickle is the count of trickle latency events per pipeline, one
	// every trickleInterval.
	trickle         int
	trickleInterval time.Duration
	// reads is the measuring loop's own share of Redis's reads.
	reads       benchkit.ReadOverhead
	concurrency int
	batch       int
	unmatched   int
	runs        int
	logLevel    string
	profile     string
	// dir holds the apps root and the workers' logs.
	dir  string
	apps string
}

func ints(s string) ([]int, error) {
	var out []int
	for f := range strings.SplitSeq(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q: want a comma list of positive numbers", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// retention is an invocation state retention as given and as the
// Engine takes it.
type retention struct {
	text string
	d    time.Duration
}

func durations(s string) ([]retention, error) {
	var out []retention
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		d, err := time.ParseDuration(f)
		if err != nil || d < 0 {
			return nil, fmt.Errorf("retentions: %q: want a comma list of durations >= 0", s)
		}
		if d == 0 {
			d = relay.DeleteOnAck
		}
		out = append(out, retention{text: f, d: d})
	}
	return out, nil
}

// retentionName is a retention as the file names of profiles give it.
func retentionName(d time.Duration) string {
	switch d {
	case 0:
		return "default"
	case relay.DeleteOnAck:
		return "0"
	}
	return d.String()
}

func run(cfg config) error {
	for _, m := range cfg.modes {
		if m != benchkit.KindRaw && m != benchkit.KindEngine && m != modeReclaim {
			return fmt.Errorf("-modes: unknown mode %q (want raw, engine, reclaim)", m)
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "relay-bench-pipeline-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.dir = dir
	if cfg.apps, err = benchkit.WriteApps(dir, benchkit.AppSpec{Concurrency: 10000}); err != nil {
		return err
	}
	if cfg.profile != "" {
		if err := os.MkdirAll(cfg.profile, 0o755); err != nil {
			return err
		}
	}
	var admin rueidis.Client
	var closeRedis func()
	if cfg.redis, admin, closeRedis, err = benchkit.OpenRedis(cfg.redis, dir); err != nil {
		return err
	}
	defer closeRedis()

	fmt.Printf("pipeline: %s\n", benchkit.Machine())
	fmt.Printf("pipeline: redis %s, %d events per run (%d%% matching no rule; %d for the raw loop), %d runs per row, engine MAX_CONCURRENCY %d, raw COUNT %d, workers are processes\n",
		cfg.redis, cfg.events, cfg.unmatched, cfg.eventsOf(benchkit.KindRaw), cfg.runs, cfg.concurrency, cfg.batch)
	runID := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)
	if cfg.reads, err = calibrateReads(ctx, admin, "bench-pipeline-"+runID+"-calibrate"); err != nil {
		return err
	}
	raw := map[int]*result{}
	var rows []row
	for _, nw := range cfg.workers {
		for _, mode := range cfg.modes {
			rets := cfg.retentions
			if nw > 1 {
				rets = cfg.multiRetentions
			}
			if mode == benchkit.KindRaw {
				rets = []retention{{text: "-"}}
			}
			for ri, ret := range rets {
				var results []result
				for i := range cfg.runs {
					name := fmt.Sprintf("bench-pipeline-%s-%s-%d-%d-%d", runID, mode, ri, nw, i)
					r, err := measure(ctx, cfg, admin, mode, ret.d, name, nw)
					cleanup(context.WithoutCancel(ctx), admin, name)
					if err != nil {
						return fmt.Errorf("%s, retention %s, %d workers: %w", mode, ret.text, nw, err)
					}
					fmt.Fprintf(os.Stderr, "pipeline: %s retention=%s workers=%d run=%d %.0f events/s in %.2fs (load %.2f)\n",
						mode, ret.text, nw, i+1, r.rate(), r.elapsed.Seconds(), r.load)
					results = append(results, r)
				}
				slices.SortFunc(results, func(a, b result) int { return cmp.Compare(a.rate(), b.rate()) })
				rw := row{mode: mode, retention: ret.text, workers: nw, r: results[len(results)/2]}
				if mode == benchkit.KindRaw {
					raw[nw] = &rw.r
				} else {
					rw.raw = raw[nw]
				}
				rows = append(rows, rw)
			}
		}
	}
	if err := printRows(rows); err != nil {
		return err
	}
	if cfg.trickle > 0 {
		return trickle(ctx, cfg, admin, "bench-pipeline-"+runID+"-trickle")
	}
	return nil
}

// row is one line of the table: the run with the median rate of its
// mode, retention and worker count, beside the raw loop's at that count.
type row struct {
	mode, retention string
	workers         int
	r               result
	raw             *result // nil for the raw rows and without a raw row
}

// The targets of the issue the table answers, shown beside it and never
// asserted: the machine's load moves every figure.
const (
	targetReads     = 0.25 // Redis reads per event, 1 worker
	targetRedisCPU  = 3.0  // × the raw loop's Redis CPU per event
	targetWorkerCPU = 3.0  // × the raw loop's worker CPU per event
	targetShare1    = 40.0 // % of raw, 1 worker
	targetShareN    = 30.0 // % of raw, more workers
)

func printRows(rows []row) error {
	t := benchkit.Table{
		Title: "pipeline throughput (XREADGROUP → match → claim → run no-op → settle: record + XACK → retain); ratios against the raw loop of the same run and worker count",
		Header: []string{"MODE", "WORKERS", "RETENTION", "EVENTS", "EVENTS/S", "% OF RAW", "REDIS READS/EV",
			"REDIS CPU µs/EV", "× RAW", "WORKER CPU µs/EV", "× RAW", "ALLOCS/EV", "REDIS BYTES/EV", "LOAD"},
	}
	targets := benchkit.Table{
		Title:  "the issue's targets (not asserted)",
		Header: []string{"ROW", "TARGET", "VALUE", "MET"},
	}
	anyTarget := false
	for _, rw := range rows {
		r := rw.r
		pct, redisX, workerX := "-", "-", "-"
		if rw.raw != nil {
			pct = fmt.Sprintf("%.1f%%", rw.share())
			redisX = fmt.Sprintf("%.1f", ratio(r.server.CPU, rw.raw.server.CPU, r.events, rw.raw.events))
			workerX = fmt.Sprintf("%.1f", ratio(r.workerCPU, rw.raw.workerCPU, r.events, rw.raw.events))
		}
		t.Add(rw.mode, rw.workers, rw.retention, r.events, fmt.Sprintf("%.0f", r.rate()), pct,
			fmt.Sprintf("%.3f", r.readsPerEvent()), perEvent(r.server.CPU, r.events), redisX,
			perEvent(r.workerCPU, r.events), workerX, fmt.Sprintf("%.1f", float64(r.mallocs)/float64(r.events)),
			fmt.Sprintf("%.0f", float64(r.bytes)/float64(r.events)), fmt.Sprintf("%.2f", r.load))
		if rw.mode == benchkit.KindRaw || rw.raw == nil {
			continue
		}
		anyTarget = true
		name := fmt.Sprintf("%s %dw %s", rw.mode, rw.workers, rw.retention)
		if rw.workers == 1 {
			targets.Add(name, fmt.Sprintf("Redis reads/event ≤ %.2f", targetReads), fmt.Sprintf("%.3f", r.readsPerEvent()), met(r.readsPerEvent() <= targetReads))
			targets.Add(name, fmt.Sprintf("≥ %.0f%% of raw", targetShare1), fmt.Sprintf("%.1f%%", rw.share()), met(rw.share() >= targetShare1))
		} else {
			targets.Add(name, fmt.Sprintf("≥ %.0f%% of raw", targetShareN), fmt.Sprintf("%.1f%%", rw.share()), met(rw.share() >= targetShareN))
		}
		rx := ratio(r.server.CPU, rw.raw.server.CPU, r.events, rw.raw.events)
		wx := ratio(r.workerCPU, rw.raw.workerCPU, r.events, rw.raw.events)
		targets.Add(name, fmt.Sprintf("Redis CPU/event ≤ %.0f× raw", targetRedisCPU), fmt.Sprintf("%.1f×", rx), met(rx <= targetRedisCPU))
		targets.Add(name, fmt.Sprintf("worker CPU/event ≤ %.0f× raw", targetWorkerCPU), fmt.Sprintf("%.1f×", wx), met(wx <= targetWorkerCPU))
	}
	if err := t.Print(os.Stdout); err != nil {
		return err
	}
	fmt.Println("\nREDIS READS/EV: INFO stats total_reads_processed delta per event (a read(2) of a client connection, about a round trip),")
	fmt.Println("less the measuring loop's own (calibrated before the rows). REDIS CPU: INFO cpu used_cpu_sys+used_cpu_user delta.")
	fmt.Println("WORKER CPU: the worker processes' rusage user+sys from go to drained; ALLOCS: their runtime.MemStats Mallocs delta, the same span.")
	fmt.Println("REDIS BYTES/EV is used_memory after the run less before the events were added, per event: the stream entry,")
	fmt.Println("and the invocation state a retention keeps (none with 0; the raw loop keeps only the entry).")
	fmt.Println("\nRedis commands per event (INFO commandstats, commands run inside scripts included) and time per event by command")
	fmt.Println("(a script's time includes the commands it calls):")
	for _, rw := range rows {
		fmt.Printf("  %s, retention %s, %d workers: %s\n    %s\n", rw.mode, rw.retention, rw.workers,
			rw.r.server.PerEvent(rw.r.events), rw.r.server.TimePerEvent(rw.r.events))
	}
	if anyTarget {
		return targets.Print(os.Stdout)
	}
	return nil
}

func (rw row) share() float64 { return 100 * rw.r.rate() / rw.raw.rate() }

// ratio is a per event over b per event.
func ratio(a, b time.Duration, aEvents, bEvents int) float64 {
	if b <= 0 {
		return 0
	}
	return (float64(a) / float64(aEvents)) / (float64(b) / float64(bEvents))
}

func met(ok bool) string {
	if ok {
		return "met"
	}
	return "not met"
}

func perEvent(d time.Duration, events int) string {
	return fmt.Sprintf("%.1f", float64(d.Microseconds())/float64(events))
}

// calibrateReads measures the reads the measuring loop's own polls and
// snapshots add (benchkit.CalibrateReads) on a stream of one entry that
// no worker reads, before any worker runs.
func calibrateReads(ctx context.Context, admin rueidis.Client, name string) (benchkit.ReadOverhead, error) {
	defer cleanup(context.WithoutCancel(ctx), admin, name)
	if err := redisstream.New(admin, name, group, "bench").EnsureGroup(ctx); err != nil {
		return benchkit.ReadOverhead{}, err
	}
	last, err := benchkit.Fill(ctx, admin, name, 0, 1)
	if err != nil {
		return benchkit.ReadOverhead{}, err
	}
	o, err := benchkit.CalibrateReads(ctx, admin, name, group, last)
	if err == nil {
		fmt.Printf("pipeline: the measuring loop's own Redis reads: %.2f per snapshot, %.2f per poll (subtracted)\n", o.Snapshot, o.PerPoll)
	}
	return o, err
}

// result is one measurement.
type result struct {
	events  int
	elapsed time.Duration
	// bytes is used_memory after the run less before the events were
	// added: the stream's entries and the state left with them.
	bytes int64
	// workerCPU and mallocs are the workers' CPU time and heap
	// allocations from go until the stream was drained, summed.
	workerCPU time.Duration
	mallocs   uint64
	server    benchkit.ServerStats
	load      float64
}

func (r result) rate() float64 { return float64(r.events) / r.elapsed.Seconds() }

func (r result) readsPerEvent() float64 { return float64(r.server.Reads) / float64(r.events) }

// eventsOf is the count of events of one measurement of mode.
func (c config) eventsOf(mode string) int {
	if mode == benchkit.KindRaw && c.rawEvents > 0 {
		return c.rawEvents
	}
	return c.events
}

// measure fills stream name with cfg.eventsOf(mode) events, runs nw workers of
// mode until the group has delivered and acknowledged all of them, and
// returns how long that took and what it cost.
func measure(ctx context.Context, cfg config, admin rueidis.Client, mode string, retention time.Duration, name string, nw int) (result, error) {
	if err := redisstream.New(admin, name, group, "bench").EnsureGroup(ctx); err != nil {
		return result{}, err
	}
	events := cfg.eventsOf(mode)
	usedBefore, err := benchkit.UsedMemory(ctx, admin)
	if err != nil {
		return result{}, err
	}
	last, err := benchkit.FillMix(ctx, admin, name, 0, events, cfg.unmatched)
	if err != nil {
		return result{}, err
	}
	kind, minIdle := mode, time.Duration(0)
	if mode == modeReclaim {
		kind, minIdle = benchkit.KindEngine, reclaimIdle
		if err := orphan(ctx, admin, name, events); err != nil {
			return result{}, err
		}
	}
	var workers []*benchkit.Worker
	defer func() {
		for _, w := range workers {
			w.Kill()
		}
	}()
	for i := range nw {
		spec := benchkit.WorkerSpec{
			Kind: kind, Redis: cfg.redis, Stream: name, Group: group, Consumer: fmt.Sprintf("w%d", i+1),
			Apps: cfg.apps, Concurrency: cfg.concurrency, Batch: cfg.batch, Handler: benchkit.HandlerNoop,
			LogFile: filepath.Join(cfg.dir, name+fmt.Sprintf("-w%d.log", i+1)), LogLevel: cfg.logLevel,
			MinPendingIdle: minIdle, Retention: retention,
		}
		if cfg.profile != "" && kind == benchkit.KindEngine {
			base := fmt.Sprintf("%s-%s-%dw-w%d", mode, retentionName(retention), nw, i+1)
			spec.CPUProfile = filepath.Join(cfg.profile, base+".pprof")
			spec.AllocProfile = filepath.Join(cfg.profile, base+".allocs.pprof")
		}
		w, err := benchkit.StartWorker(ctx, spec)
		if err != nil {
			return result{}, err
		}
		workers = append(workers, w)
	}

	before, err := benchkit.ReadServerStats(ctx, admin)
	if err != nil {
		return result{}, err
	}
	load := benchkit.LoadAverage()
	start := time.Now()
	for _, w := range workers {
		if err := w.Go(); err != nil {
			return result{}, err
		}
	}
	polls := 0
	for {
		polls++
		done, err := benchkit.Settled(ctx, admin, name, group, last)
		if err != nil {
			return result{}, err
		}
		if done {
			break
		}
		if time.Since(start) > 10*time.Minute {
			return result{}, fmt.Errorf("stream %s not drained after 10 minutes", name)
		}
		// A short poll interval bounds the error of the end time; one
		// poll costs the server two cheap commands.
		if !ctxtime.Sleep(ctx, 5*time.Millisecond) {
			return result{}, ctx.Err()
		}
	}
	elapsed := time.Since(start)
	after, err := benchkit.ReadServerStats(ctx, admin)
	if err != nil {
		return result{}, err
	}
	r := result{events: events, elapsed: elapsed, load: load,
		server: after.Sub(before).Without(benchkit.SettledCommands, polls).WithoutReads(cfg.reads, polls)}
	// The workers' cost up to the drain, not their shutdown's.
	for _, w := range workers {
		rep, err := w.Sample()
		if err != nil {
			return result{}, err
		}
		r.workerCPU += rep.CPU
		r.mallocs += rep.Mallocs
	}
	usedAfter, err := benchkit.UsedMemory(ctx, admin)
	if err != nil {
		return result{}, err
	}
	r.bytes = usedAfter - usedBefore
	var handled int64
	for _, w := range workers {
		rep, err := w.Stop()
		if err != nil {
			return result{}, err
		}
		handled += rep.Handled
	}
	workers = nil
	want := int64(0)
	for i := range events {
		if mode == benchkit.KindRaw || benchkit.Matches(i, cfg.unmatched) {
			want++
		}
	}
	if handled != want {
		return result{}, fmt.Errorf("workers handled %d events, want %d", handled, want)
	}
	return r, nil
}

// orphan delivers the first n entries of name to consumer "dead", which
// never acknowledges them, and waits until they are idle past reclaimIdle.
func orphan(ctx context.Context, c rueidis.Client, name string, n int) error {
	cmd := c.B().Xreadgroup().Group(group, "dead").Count(int64(n)).Streams().Key(name).Id(">").Build()
	if err := c.Do(ctx, cmd).Error(); err != nil {
		return fmt.Errorf("deliver to the dead consumer: %w", err)
	}
	if !ctxtime.Sleep(ctx, reclaimIdle+100*time.Millisecond) {
		return ctx.Err()
	}
	return nil
}

// cleanup deletes the stream, its DLQ and stats and its invocation hashes.
func cleanup(ctx context.Context, c rueidis.Client, name string) {
	for _, k := range []string{name, keys.DLQ(name), keys.Stats(name, group)} {
		if err := c.Do(ctx, c.B().Unlink().Key(k).Build()).Error(); err != nil {
			fmt.Fprintf(os.Stderr, "pipeline: delete %s: %v\n", k, err)
		}
	}
	// Stream names here hold no glob characters, so the prefix is literal.
	prefix := keys.Invocation(name, group, "")
	cursor := uint64(0)
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(prefix+"*").Count(1000).Build()).AsScanEntry()
		if err != nil {
			fmt.Fprintf(os.Stderr, "pipeline: scan %s*: %v\n", prefix, err)
			return
		}
		if len(e.Elements) > 0 {
			if err := c.Do(ctx, c.B().Unlink().Key(e.Elements...).Build()).Error(); err != nil {
				fmt.Fprintf(os.Stderr, "pipeline: delete invocation hashes: %v\n", err)
				return
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			return
		}
	}
}
