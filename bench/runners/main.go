// Command runners measures end-to-end latency per invocation, XADD to XACK,
// for each Runner (bench/RESULTS.md, section 2): the process runner, one-shot
// containerd and, as its floor, `ctr run --rm` of the same image and
// command; a burst of -burst events published at once to the one-shot
// runner (the app's concurrency is 8) against eight parallel `ctr run --rm`
// loops doing as many runs; then a python3 and a node app, one-shot and
// warm (warm: true), the runtimes warm containers exist for. The last table
// sets each figure beside its anchor from the same run, with the ratio and
// the target (bench/RESULTS.md).
//
// Each Runner mode runs a relay.Engine in this process on a fresh stream,
// wired as relay start wires it (MAX_CONCURRENCY 8, stats and metrics on, a
// text log at info, discarded), whose one rule runs the handler. Events are
// published one at a time: the next XADD follows the previous message's
// XACK, so every invocation finds the worker idle. A message's latency runs
// from just before its XADD to the return of the Engine's XACK of it (a
// StreamSource wrapper records it, so no polling adds to it); "run" is the
// time inside Runner.Run and "overhead" the rest: read, match, claim,
// finish and acknowledgement. The ctr mode times `ctr run --rm` from Go,
// with the event on its stdin.
//
// The busybox modes (process, oneshot, ctr) run -command, which must not
// read stdin: ctr run never closes it. The python3 and node modes run a
// function that does nothing, from -python-image and -node-image; they are
// reported as not measured when that image is not in -namespace
// (scripts/runtime-images.sh builds and imports it).
//
// The containerd modes give the Runner the exec helper, relay-exec, as relay
// start does (-exec-helper; by default the one next to this program, else
// one built with go build, so run it from the repository; "none" measures
// without it).
//
// The first -warmup events of each mode are not counted (image unpack,
// first connections, script loading, the first warm container). containerd
// modes need -containerd (default $CONTAINERD_ADDRESS) and the images in
// -namespace: scripts/bench.sh starts a private containerd and imports
// them.
//
//	go run ./bench/runners -n 100
//	go run ./bench/runners -modes process -n 500
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	ctrclient "github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/bench/internal/benchkit"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
)

const group = "bench"

// Modes.
const (
	modeProcess       = "process"
	modeOneShot       = "oneshot"
	modeCtr           = "ctr"
	modePythonOneShot = "python3-oneshot"
	modePythonWarm    = "python3-warm"
	modeNodeOneShot   = "node-oneshot"
	modeNodeWarm      = "node-warm"
	modeOneShotBurst  = "oneshot-burst"
	modeCtrBurst      = "ctr-burst"
)

var allModes = []string{modeProcess, modeOneShot, modeCtr, modeOneShotBurst, modeCtrBurst,
	modePythonOneShot, modePythonWarm, modeNodeOneShot, modeNodeWarm}

// burstConcurrency is the app's concurrency in every mode, and the number
// of parallel `ctr run --rm` loops of ctr-burst.
const burstConcurrency = 8

type config struct {
	redis       string
	containerd  string
	namespace   string
	image       string
	pythonImage string
	nodeImage   string
	command     []string
	n, warmup   int
	burst       int
	modes       []string
	dir         string
	execHelper  string // "" or "none": none
}

func main() {
	var cfg config
	flag.StringVar(&cfg.redis, "redis", "", "Redis address host:port (default: start a private redis-server)")
	flag.StringVar(&cfg.containerd, "containerd", os.Getenv("CONTAINERD_ADDRESS"), "containerd socket, for every mode but process")
	flag.StringVar(&cfg.namespace, "namespace", "relay-bench", "containerd namespace holding -image")
	flag.StringVar(&cfg.image, "image", "relay.local/busybox:latest", "image of the oneshot and ctr modes (scripts/images.sh builds it)")
	flag.StringVar(&cfg.pythonImage, "python-image", "relay.local/python3:bookworm", "image of the python3 modes (scripts/runtime-images.sh builds it)")
	flag.StringVar(&cfg.nodeImage, "node-image", "relay.local/node:bookworm", "image of the node modes (scripts/runtime-images.sh builds it)")
	flag.IntVar(&cfg.burst, "burst", 160, "events of the burst modes, published at once")
	command := flag.String("command", "/bin/true", "handler command, split at spaces; the same in every mode. It should not read stdin: ctr run never closes it")
	flag.IntVar(&cfg.n, "n", 100, "events per mode, published one at a time")
	flag.IntVar(&cfg.warmup, "warmup", 3, "events per mode run first and not counted")
	modes := flag.String("modes", strings.Join(allModes, ","), "modes to measure, comma-separated")
	flag.StringVar(&cfg.execHelper, "exec-helper", "", "relay-exec for the one-shot modes, as relay start uses it (docs/runtimes.md \"One-shot containers\"); default: the one next to this program, else built with go build; \"none\": without")
	flag.Parse()
	cfg.command = strings.Fields(*command)
	cfg.modes = strings.Split(*modes, ",")
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "runners:", err)
		os.Exit(1)
	}
}

// findExecHelper returns relay-exec next to this program, or one built
// into dir with go build (run from the repository), or "none".
func findExecHelper(dir string) string {
	if exe, err := os.Executable(); err == nil {
		if p := containerd.ExecHelperNextTo(exe); p != "" {
			return p
		}
	}
	p := dir + "/" + containerd.ExecHelperName
	build := exec.Command("go", "build", "-o", p, "github.com/relaydev/relay/cmd/relay-exec")
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "runners: no relay-exec next to this program and go build failed (%v): %s", err, out)
		return "none"
	}
	return p
}

// row is the outcome of one mode.
type row struct {
	mode     string
	e2e, run benchkit.Summary
	overhead benchkit.Summary
	// rate is the runs per second of a burst mode.
	rate float64
	// skipped says why the mode was not measured.
	skipped string
}

func run(cfg config) error {
	if len(cfg.command) == 0 {
		return errors.New("-command is empty")
	}
	for _, m := range cfg.modes {
		if !slices.Contains(allModes, m) {
			return fmt.Errorf("-modes: unknown mode %q (want some of %s)", m, strings.Join(allModes, ", "))
		}
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "relay-bench-runners-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg.dir = dir
	var rc rueidis.Client
	var closeRedis func()
	if cfg.redis, rc, closeRedis, err = benchkit.OpenRedis(cfg.redis, dir); err != nil {
		return err
	}
	defer closeRedis()

	var cc *ctrclient.Client
	needsContainerd := false
	for _, m := range cfg.modes {
		needsContainerd = needsContainerd || m != modeProcess
	}
	if needsContainerd {
		if cfg.containerd == "" {
			return errors.New("every mode but process needs containerd: set -containerd or CONTAINERD_ADDRESS (scripts/bench.sh starts one), or pass -modes process")
		}
		cc, err = ctrclient.New(cfg.containerd, ctrclient.WithDefaultNamespace(cfg.namespace), ctrclient.WithTimeout(10*time.Second))
		if err != nil {
			return fmt.Errorf("connect to containerd at %s: %w", cfg.containerd, err)
		}
		defer cc.Close()
		if _, err := cc.GetImage(namespaces.WithNamespace(ctx, cfg.namespace), cfg.image); err != nil {
			return fmt.Errorf("image %s in namespace %s: %w (import it: scripts/images.sh STATE_DIR %s %s)", cfg.image, cfg.namespace, err, cfg.containerd, cfg.namespace)
		}
	}

	if needsContainerd && cfg.execHelper == "" {
		cfg.execHelper = findExecHelper(dir)
	}
	fmt.Printf("runners: %s\n", benchkit.Machine())
	fmt.Printf("runners: exec helper %s\n", orNone(cfg.execHelper))
	fmt.Printf("runners: redis %s, containerd %s (namespace %s), images %s, %s and %s, command %q, %d events per mode after %d warm-up, one at a time; bursts of %d\n",
		cfg.redis, orNone(cfg.containerd), cfg.namespace, cfg.image, cfg.pythonImage, cfg.nodeImage, strings.Join(cfg.command, " "), cfg.n, cfg.warmup, cfg.burst)
	var rows []row
	for _, m := range cfg.modes {
		r, err := measure(ctx, cfg, rc, cc, m)
		var skip skipError
		if errors.As(err, &skip) {
			r = row{mode: m, skipped: skip.reason}
		} else if err != nil {
			return fmt.Errorf("%s: %w", m, err)
		}
		rows = append(rows, r)
		fmt.Fprintf(os.Stderr, "runners: %s done (load %.2f)\n", m, benchkit.LoadAverage())
	}
	if err := printRows(rows); err != nil {
		return err
	}
	return printTargets(rows)
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

func printRows(rows []row) error {
	t := benchkit.Table{
		Title: "end-to-end latency per invocation, XADD → XACK, ms",
		Header: []string{"MODE", "N", "P50", "P90", "P99", "MAX", "RUN P50", "OVERHEAD P50", "OVERHEAD P99",
			"TARGET"},
	}
	var floor time.Duration
	for _, r := range rows {
		if r.mode == modeCtr && r.skipped == "" {
			floor = r.e2e.P50
		}
	}
	for _, r := range rows {
		if r.skipped != "" {
			t.Add(r.mode, 0, "-", "-", "-", "-", "-", "-", "-", "not measured: "+r.skipped)
			continue
		}
		target := "-"
		switch {
		case r.mode == modeOneShot && floor > 0:
			ratio := float64(r.e2e.P50) / float64(floor)
			target = fmt.Sprintf("p50 ≤ 0.5× ctr p50: %.2fx, %s", ratio, verdict(ratio <= 0.5))
		case r.mode == modePythonWarm:
			target = fmt.Sprintf("p50 ≤ 1 ms: %s", verdict(r.e2e.P50 <= time.Millisecond))
		case r.rate > 0:
			target = fmt.Sprintf("%.1f runs/s", r.rate)
		}
		runP50, ovP50, ovP99 := benchkit.Ms(r.run.P50), benchkit.Ms(r.overhead.P50), benchkit.Ms(r.overhead.P99)
		if r.mode == modeCtr || r.mode == modeCtrBurst {
			runP50, ovP50, ovP99 = "-", "-", "-"
		}
		t.Add(r.mode, r.e2e.N, benchkit.Ms(r.e2e.P50), benchkit.Ms(r.e2e.P90), benchkit.Ms(r.e2e.P99), benchkit.Ms(r.e2e.Max),
			runP50, ovP50, ovP99, target)
	}
	return t.Print(os.Stdout)
}

// printTargets prints the runtime targets: each figure, its anchor from
// this run, the ratio and the target.
func printTargets(rows []row) error {
	by := map[string]row{}
	for _, r := range rows {
		if r.skipped == "" {
			by[r.mode] = r
		}
	}
	t := benchkit.Table{
		Title:  "runtime targets: each figure beside its anchor from the same run",
		Header: []string{"WHAT", "RELAY", "ANCHOR", "ANCHOR VALUE", "RATIO", "TARGET", "MET"},
	}
	// ratio adds a row comparing mode a to anchor b by p50 (lower is
	// better) or, for bursts, by runs per second (higher is better).
	ratio := func(what, a, b, anchor string, want float64, higher bool) {
		ra, oka := by[a]
		rb, okb := by[b]
		if !oka || !okb {
			t.Add(what, "-", anchor, "-", "-", targetText(want, higher), "not measured")
			return
		}
		if higher {
			x := ra.rate / rb.rate
			t.Add(what, fmt.Sprintf("%.1f runs/s", ra.rate), anchor, fmt.Sprintf("%.1f runs/s", rb.rate),
				fmt.Sprintf("%.2fx", x), targetText(want, higher), verdict(x >= want))
			return
		}
		x := float64(ra.e2e.P50) / float64(rb.e2e.P50)
		t.Add(what, benchkit.Ms(ra.e2e.P50)+" ms", anchor, benchkit.Ms(rb.e2e.P50)+" ms",
			fmt.Sprintf("%.2fx", x), targetText(want, higher), verdict(x <= want))
	}
	ratio("one-shot busybox, p50", modeOneShot, modeCtr, "ctr run --rm, p50", 0.5, false)
	ratio(fmt.Sprintf("burst at concurrency %d", burstConcurrency), modeOneShotBurst, modeCtrBurst,
		fmt.Sprintf("%d parallel ctr run --rm loops", burstConcurrency), 1.5, true)
	ratio("python3 one-shot, p50", modePythonOneShot, modeOneShot, "busybox one-shot, p50", 1.5, false)
	ratio("node one-shot, p50", modeNodeOneShot, modeOneShot, "busybox one-shot, p50", 1.5, false)
	for _, m := range []string{modePythonWarm, modeNodeWarm} {
		what := strings.Replace(m, "-", " ", 1) + ", p50"
		r, ok := by[m]
		switch {
		case !ok:
			t.Add(what, "-", "-", "-", "-", "≤ 1 ms", "not measured")
		default:
			t.Add(what, benchkit.Ms(r.e2e.P50)+" ms", "-", "-", "-", "≤ 1 ms", verdict(r.e2e.P50 <= time.Millisecond))
		}
	}
	return t.Print(os.Stdout)
}

func targetText(want float64, higher bool) string {
	if higher {
		return fmt.Sprintf("≥ %.1fx", want)
	}
	return fmt.Sprintf("≤ %.1fx", want)
}

func verdict(met bool) string {
	if met {
		return "met"
	}
	return "not met"
}

func measure(ctx context.Context, cfg config, rc rueidis.Client, cc *ctrclient.Client, mode string) (row, error) {
	spec := benchkit.AppSpec{Concurrency: burstConcurrency, Image: cfg.image, Command: cfg.command, Timeout: "60s"}
	switch mode {
	case modeCtr:
		return measureCtr(ctx, cfg)
	case modeCtrBurst:
		return measureCtrBurst(ctx, cfg)
	case modeProcess:
		runner, err := runtime.NewProcess(runtime.WithOutput(io.Discard, io.Discard))
		if err != nil {
			return row{}, err
		}
		return measureEngine(ctx, cfg, rc, mode, spec, runner)
	case modePythonOneShot, modePythonWarm, modeNodeOneShot, modeNodeWarm:
		rt, image := "python3", cfg.pythonImage
		if mode == modeNodeOneShot || mode == modeNodeWarm {
			rt, image = "node", cfg.nodeImage
		}
		if _, err := cc.GetImage(namespaces.WithNamespace(ctx, cfg.namespace), image); err != nil {
			return row{}, skipError{fmt.Sprintf("no image %s in namespace %s (scripts/runtime-images.sh STATE_DIR SOCKET %s %s)", image, cfg.namespace, rt, cfg.namespace)}
		}
		spec = benchkit.AppSpec{Concurrency: burstConcurrency, Runtime: rt, Image: image, Warm: mode == modePythonWarm || mode == modeNodeWarm, Timeout: "60s"}
	}
	// One Runner per mode, as one worker has one; Close removes its warm
	// containers afterwards.
	r, err := containerd.New(cc, containerd.WithNamespace(cfg.namespace), containerd.WithOutput(io.Discard, io.Discard),
		containerd.WithHostID(fmt.Sprintf("relay-bench-runners-%d", os.Getpid())), containerd.WithPull(false),
		containerd.WithStateDir(cfg.dir+"/containerd-state"), containerd.WithLogger(quietLog()),
		containerd.WithExecHelper(strings.TrimPrefix(cfg.execHelper, "none")))
	if err != nil {
		return row{}, err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		defer cancel()
		if err := r.Close(cctx); err != nil {
			fmt.Fprintf(os.Stderr, "runners: %s: close runner: %v\n", mode, err)
		}
	}()
	return measureEngine(ctx, cfg, rc, mode, spec, r)
}

// skipError marks a mode that cannot be measured here, and why.
type skipError struct{ reason string }

func (e skipError) Error() string { return e.reason }

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// measureEngine publishes warmup+n events one at a time to an Engine that
// runs the app of spec with runner, and returns their latencies.
func measureEngine(ctx context.Context, cfg config, rc rueidis.Client, mode string, spec benchkit.AppSpec, runner relay.Runner) (row, error) {
	name := fmt.Sprintf("bench-runners-%s-%d", mode, time.Now().UnixNano()%1e9)
	defer cleanup(context.WithoutCancel(ctx), rc, name)
	appsRoot, err := benchkit.WriteApps(fmt.Sprintf("%s/%s", cfg.dir, mode), spec)
	if err != nil {
		return row{}, err
	}
	apps, err := benchkit.LoadApps(appsRoot)
	if err != nil {
		return row{}, err
	}
	src := &timedSource{Source: redisstream.New(rc, name, group, "bench"), waits: map[string]chan time.Time{}}
	timed := &timedRunner{r: runner, took: map[string]time.Duration{}, failed: make(chan error, 1)}
	e, err := relay.NewEngine(apps, relay.Components{
		Source: src, State: &timedState{Store: redisstate.New(rc), src: src}, Runner: timed,
		Stream: name, Group: group, Consumer: "bench",
	}, relay.Config{Logger: quietLog(), Metrics: prometheus.NewRegistry(), Stats: redisstats.NewRecorder(rc, name, group)})
	if err != nil {
		return row{}, err
	}
	if err := src.EnsureGroup(ctx); err != nil {
		return row{}, err
	}
	ectx, stopEngine := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- e.Run(ectx) }()
	defer func() { stopEngine(); <-done }()

	var e2e, runs, overhead []time.Duration
	n := cfg.n
	if mode == modeOneShotBurst {
		n = 0 // after the warm-up, one burst
	}
	for i := range cfg.warmup + n {
		// Register before publishing: the ack can come before XADD returns.
		ch := make(chan time.Time, 1)
		start := time.Now()
		id, err := src.publishAwaited(ctx, benchkit.Event(i), ch)
		if err != nil {
			return row{}, err
		}
		var at time.Time
		select {
		case at = <-ch:
		case err := <-done:
			return row{}, fmt.Errorf("engine stopped: %v", err)
		case err := <-timed.failed:
			return row{}, fmt.Errorf("message %s: the handler did not succeed: %w", id, err)
		case <-time.After(2 * time.Minute):
			return row{}, fmt.Errorf("message %s not acknowledged within 2 minutes (is the runner working? try relay app invoke)", id)
		}
		if i < cfg.warmup {
			continue
		}
		d := at.Sub(start)
		took := timed.get(id)
		e2e, runs, overhead = append(e2e, d), append(runs, took), append(overhead, d-took)
	}
	if mode == modeOneShotBurst {
		return measureBurst(ctx, cfg, src, timed, done)
	}
	return row{mode: mode, e2e: benchkit.Summarize(e2e), run: benchkit.Summarize(runs), overhead: benchkit.Summarize(overhead)}, nil
}

// measureBurst publishes cfg.burst events at once and waits for every
// XACK: the rate counts from the first XADD to the last XACK.
func measureBurst(ctx context.Context, cfg config, src *timedSource, timed *timedRunner, done <-chan error) (row, error) {
	chans := make([]chan time.Time, cfg.burst)
	ids := make([]string, cfg.burst)
	start := time.Now()
	for i := range chans {
		chans[i] = make(chan time.Time, 1)
		id, err := src.publishAwaited(ctx, benchkit.Event(cfg.warmup+i), chans[i])
		if err != nil {
			return row{}, err
		}
		ids[i] = id
	}
	var e2e, runs, overhead []time.Duration
	var last time.Time
	timeout := time.After(5 * time.Minute)
	for i, ch := range chans {
		var at time.Time
		select {
		case at = <-ch:
		case err := <-done:
			return row{}, fmt.Errorf("engine stopped: %v", err)
		case err := <-timed.failed:
			return row{}, fmt.Errorf("burst: a handler did not succeed: %w", err)
		case <-timeout:
			return row{}, fmt.Errorf("burst: message %s not acknowledged within 5 minutes", ids[i])
		}
		if at.After(last) {
			last = at
		}
		d, took := at.Sub(start), timed.get(ids[i])
		e2e, runs, overhead = append(e2e, d), append(runs, took), append(overhead, d-took)
	}
	return row{mode: modeOneShotBurst, e2e: benchkit.Summarize(e2e), run: benchkit.Summarize(runs), overhead: benchkit.Summarize(overhead),
		rate: float64(cfg.burst) / last.Sub(start).Seconds()}, nil
}

// measureCtr times `ctr run --rm` of the image and command, warmup+n
// times, each with the event on stdin.
func measureCtr(ctx context.Context, cfg config) (row, error) {
	if _, err := exec.LookPath("ctr"); err != nil {
		return row{}, fmt.Errorf("ctr not found in PATH (it comes with containerd): %w", err)
	}
	var lat []time.Duration
	for i := range cfg.warmup + cfg.n {
		id := fmt.Sprintf("relay-bench-ctr-%d-%d", os.Getpid(), i)
		args := append([]string{"-a", cfg.containerd, "-n", cfg.namespace, "run", "--rm", cfg.image, id}, cfg.command...)
		cmd := exec.CommandContext(ctx, "ctr", args...)
		cmd.Stdin = strings.NewReader(benchkit.Event(i))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		start := time.Now()
		err := cmd.Run()
		d := time.Since(start)
		if err != nil {
			return row{}, fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out.String())
		}
		if i >= cfg.warmup {
			lat = append(lat, d)
		}
	}
	s := benchkit.Summarize(lat)
	return row{mode: modeCtr, e2e: s, run: s}, nil
}

// measureCtrBurst runs cfg.burst `ctr run --rm` of the image and command
// in burstConcurrency parallel loops, after cfg.warmup runs one at a time.
// A run's latency counts from the start of the burst, as in measureBurst.
func measureCtrBurst(ctx context.Context, cfg config) (row, error) {
	if _, err := exec.LookPath("ctr"); err != nil {
		return row{}, fmt.Errorf("ctr not found in PATH (it comes with containerd): %w", err)
	}
	runCtr := func(i int) error {
		id := fmt.Sprintf("relay-bench-ctr-burst-%d-%d", os.Getpid(), i)
		args := append([]string{"-a", cfg.containerd, "-n", cfg.namespace, "run", "--rm", cfg.image, id}, cfg.command...)
		cmd := exec.CommandContext(ctx, "ctr", args...)
		cmd.Stdin = strings.NewReader(benchkit.Event(i))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, out.String())
		}
		return nil
	}
	for i := range cfg.warmup {
		if err := runCtr(i); err != nil {
			return row{}, err
		}
	}
	var (
		mu   sync.Mutex
		next = cfg.warmup
		lat  []time.Duration
		errs []error
		wg   sync.WaitGroup
	)
	start := time.Now()
	for range burstConcurrency {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= cfg.warmup+cfg.burst {
					return
				}
				err := runCtr(i)
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				}
				lat = append(lat, time.Since(start))
				mu.Unlock()
				if err != nil {
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return row{}, err
	}
	s := benchkit.Summarize(lat)
	return row{mode: modeCtrBurst, e2e: s, run: s, rate: float64(cfg.burst) / elapsed.Seconds()}, nil
}

// timedSource records when the Engine's XACK of an awaited message
// returned (timedState tells it). Embedding keeps every optional
// capability of *redisstream.Source (GroupEnsurer, PendingReporter, Pinger)
// visible to the Engine.
type timedSource struct {
	*redisstream.Source
	mu    sync.Mutex
	waits map[string]chan time.Time
	// early holds acks of ids not registered yet: XADD's reply may arrive
	// after the Engine already acknowledged the entry.
	early map[string]time.Time
}

func (s *timedSource) publishAwaited(ctx context.Context, event string, ch chan time.Time) (string, error) {
	id, err := s.Publish(ctx, map[string]string{"event": event})
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if at, ok := s.early[id]; ok {
		delete(s.early, id)
		ch <- at
		return id, nil
	}
	s.waits[id] = ch
	return id, nil
}

// timedState tells src when a settlement acknowledged its message.
// Embedding keeps the optional capabilities of *redisstate.Store
// (ClaimVoider) visible to the Engine.
type timedState struct {
	*redisstate.Store
	src *timedSource
}

func (s *timedState) Settle(ctx context.Context, ss []invocation.Settlement) []invocation.SettleResult {
	res := s.Store.Settle(ctx, ss)
	var ids []string
	for i, st := range ss {
		if st.Ack && res[i].Err == nil {
			ids = append(ids, st.Key.MessageID)
		}
	}
	s.src.acked(ids...)
	return res
}

// acked records that ids were acknowledged now.
func (s *timedSource) acked(ids ...string) {
	if len(ids) == 0 {
		return
	}
	at := time.Now()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range ids {
		if ch, ok := s.waits[id]; ok {
			delete(s.waits, id)
			ch <- at
			continue
		}
		if s.early == nil {
			s.early = map[string]time.Time{}
		}
		s.early[id] = at
	}
}

// timedRunner records how long Runner.Run took per message, and reports
// the first failure: a failed handler is retried only after a minute, so
// the benchmark stops instead of waiting for it.
type timedRunner struct {
	r      relay.Runner
	mu     sync.Mutex
	took   map[string]time.Duration
	failed chan error
}

func (t *timedRunner) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	start := time.Now()
	res, err := t.r.Run(ctx, req)
	d := time.Since(start)
	t.mu.Lock()
	t.took[req.MessageID] = d
	t.mu.Unlock()
	if err != nil && ctx.Err() == nil {
		select {
		case t.failed <- err:
		default:
		}
	}
	return res, err
}

func (t *timedRunner) get(id string) time.Duration {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.took[id]
}

func cleanup(ctx context.Context, c rueidis.Client, name string) {
	for _, k := range []string{name, keys.DLQ(name), keys.Stats(name, group)} {
		if err := c.Do(ctx, c.B().Unlink().Key(k).Build()).Error(); err != nil {
			fmt.Fprintf(os.Stderr, "runners: delete %s: %v\n", k, err)
		}
	}
}
