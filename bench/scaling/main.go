// Command scaling measures how Relay's throughput grows with workers and
// streams on a 3-master Redis Cluster (docs/deployment.md#scaling-figures).
//
// For each number of streams (-streams) and of workers (-workers) it fills
// the streams with -events events in total, starts the workers, and times
// them until every message is acknowledged; of -runs such runs it reports
// the median, with the CPU the workers and the masters spent per event.
// A worker is what relay start runs: one Engine per stream
// (MAX_CONCURRENCY split among them, stats on),
// here with its own cluster client and an in-process no-op handler, so the
// figures are Relay's own cost per event — stream read, claim, finish and
// retain scripts, acknowledgement — not a handler's. Streams carry hash
// tags chosen to spread over the masters.
//
// Without -seeds it starts a private cluster with scripts/cluster.sh under
// a temporary directory and stops it at the end:
//
//	go run ./bench/scaling
//	go run ./bench/scaling -events 40000 -workers 1,2,4,8 -streams 1,4 -runs 5
//	go run ./bench/scaling -seeds 10.0.0.1:6379,10.0.0.2:6379   # an existing cluster
//
// Against an existing cluster it writes streams named {bench-<run>-...}
// and deletes them and their stats afterwards; invocation hashes expire
// after a minute.
package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/topology"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

const group = "bench"

// maxConcurrency is each worker's MAX_CONCURRENCY, as in relay start.
const maxConcurrency = 8

func main() {
	seeds := flag.String("seeds", "", "comma-separated cluster seed nodes (default: start a private cluster)")
	events := flag.Int("events", 20000, "events per measurement, spread evenly over the streams")
	workerList := flag.String("workers", "1,2,4", "worker counts to measure")
	streamList := flag.String("streams", "1,4", "stream counts to measure")
	runs := flag.Int("runs", 3, "runs per measurement; the median (by wall time) is reported")
	flag.Parse()
	if *runs < 1 || *events < 1 {
		fmt.Fprintln(os.Stderr, "scaling: -runs and -events must be at least 1")
		os.Exit(2)
	}
	workers, err := ints(*workerList)
	if err == nil {
		var streams []int
		if streams, err = ints(*streamList); err == nil {
			err = run(*seeds, *events, *runs, workers, streams)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scaling:", err)
		os.Exit(1)
	}
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

func run(seeds string, events, runs int, workers, streamCounts []int) error {
	ctx := context.Background()
	opt := rueidis.ClientOption{InitAddress: strings.Split(seeds, ","), DisableCache: true}
	if seeds == "" {
		dir, err := os.MkdirTemp("", "relay-scaling-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		fmt.Fprintln(os.Stderr, "scaling: starting a 3-master cluster with scripts/cluster.sh")
		c, err := topology.StartCluster(ctx, dir)
		if err != nil {
			return err
		}
		defer func() { _ = c.Stop(context.WithoutCancel(ctx)) }()
		opt = c.ClientOption()
	}
	admin, err := rueidis.NewClient(opt)
	if err != nil {
		return err
	}
	defer admin.Close()
	if admin.Mode() != rueidis.ClientModeCluster {
		return fmt.Errorf("%s is not a Redis Cluster", seeds)
	}
	apps, err := benchApps()
	if err != nil {
		return err
	}
	runID := strconv.FormatInt(time.Now().UnixNano()%1e9, 36)

	var rows []string
	for _, ns := range streamCounts {
		var base float64
		for wi, nw := range workers {
			// The median of several runs by wall time: a shared machine
			// makes single runs noisy.
			var ms []measurement
			var masters int
			for r := range runs {
				names, n, err := spreadStreams(ctx, admin, fmt.Sprintf("bench-%s-%d-%d-%d", runID, ns, nw, r), ns)
				if err != nil {
					return err
				}
				m, err := measure(ctx, opt, admin, apps, names, nw, events)
				cleanup(ctx, admin, names)
				if err != nil {
					return err
				}
				ms, masters = append(ms, m), n
			}
			slices.SortFunc(ms, func(a, b measurement) int { return cmp.Compare(a.elapsed, b.elapsed) })
			m := ms[len(ms)/2]
			rate := float64(events) / m.elapsed.Seconds()
			if wi == 0 {
				base = rate / float64(nw)
			}
			perEvent := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(events) }
			row := fmt.Sprintf("%d\t%d\t%d\t%d\t%.2f\t%.0f\t%.2fx\t%.0f\t%.0f", ns, masters, nw, events, m.elapsed.Seconds(), rate, rate/base,
				perEvent(m.workerCPU), perEvent(m.redisCPU))
			fmt.Fprintf(os.Stderr, "scaling: %s\n", strings.ReplaceAll(row, "\t", " "))
			rows = append(rows, row)
		}
	}
	// SPEEDUP compares with the first worker count of the same stream
	// count, scaled per worker (1.00x for one worker). The CPU columns are
	// microseconds of CPU per event, in the workers (this process) and in
	// the masters (INFO cpu): unlike the rate, they do not depend on
	// whatever else competes for the machine.
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "STREAMS\tMASTERS\tWORKERS\tEVENTS\tSECONDS\tEVENTS/S\tSPEEDUP\tWORKER µs/EV\tREDIS µs/EV")
	for _, r := range rows {
		fmt.Fprintln(tw, r)
	}
	return tw.Flush()
}

// benchApps is one app whose single rule matches every benchmark event.
func benchApps() (*app.Set, error) {
	dir, err := os.MkdirTemp("", "relay-scaling-apps-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	if err := os.MkdirAll(dir+"/bench", 0o755); err != nil {
		return nil, err
	}
	tmpl := "image: unused\nconcurrency: 64\nevents:\n  - {handler: noop.run, pattern: {kind: [bench]}, timeout: 10s}\n"
	if err := os.WriteFile(dir+"/bench/"+app.TemplateFile, []byte(tmpl), 0o644); err != nil {
		return nil, err
	}
	return template.LoadDir(dir)
}

// spreadStreams returns n stream names {prefix-i} whose slots cover as many
// masters as possible, and how many masters they cover.
func spreadStreams(ctx context.Context, c rueidis.Client, prefix string, n int) ([]string, int, error) {
	owners, err := slotOwners(ctx, c)
	if err != nil {
		return nil, 0, err
	}
	perMaster := map[string]int{}
	var names []string
	// Take, round by round, a stream for each master that has fewer than
	// the round number, so n streams spread as evenly as the masters allow.
	for round := 1; len(names) < n; round++ {
		for i := 0; len(names) < n && i < 10000; i++ {
			name := fmt.Sprintf("{%s-%d}", prefix, i)
			if slices.Contains(names, name) {
				continue
			}
			slot, err := c.Do(ctx, c.B().ClusterKeyslot().Key(name).Build()).AsInt64()
			if err != nil {
				return nil, 0, err
			}
			if m := owners(slot); perMaster[m] < round {
				perMaster[m]++
				names = append(names, name)
			}
		}
	}
	return names, len(perMaster), nil
}

func slotOwners(ctx context.Context, c rueidis.Client) (func(int64) string, error) {
	ranges, err := c.Do(ctx, c.B().ClusterSlots().Build()).ToArray()
	if err != nil {
		return nil, err
	}
	type span struct {
		lo, hi int64
		node   string
	}
	var spans []span
	for _, r := range ranges {
		parts, err := r.ToArray()
		if err != nil || len(parts) < 3 {
			return nil, fmt.Errorf("CLUSTER SLOTS: unexpected entry: %v", err)
		}
		lo, _ := parts[0].AsInt64()
		hi, _ := parts[1].AsInt64()
		node, _ := parts[2].ToArray()
		host, _ := node[0].ToString()
		port, _ := node[1].AsInt64()
		spans = append(spans, span{lo, hi, fmt.Sprintf("%s:%d", host, port)})
	}
	return func(slot int64) string {
		for _, s := range spans {
			if slot >= s.lo && slot <= s.hi {
				return s.node
			}
		}
		return ""
	}, nil
}

// measurement is one run's wall time and the CPU the workers and the
// masters spent in it.
type measurement struct {
	elapsed, workerCPU, redisCPU time.Duration
}

// measure fills the streams, runs nw workers until every message is
// acknowledged and returns what that took.
func measure(ctx context.Context, opt rueidis.ClientOption, admin rueidis.Client, apps *app.Set, names []string, nw, events int) (measurement, error) {
	last := map[string]string{}
	for i, name := range names {
		if err := redisstream.New(admin, name, group, "bench").EnsureGroup(ctx); err != nil {
			return measurement{}, err
		}
		n := events / len(names)
		if i < events%len(names) {
			n++
		}
		id, err := fill(ctx, admin, name, n)
		if err != nil {
			return measurement{}, err
		}
		last[name] = id
	}

	redis0, err := redisCPU(ctx, admin)
	if err != nil {
		return measurement{}, err
	}
	self0 := selfCPU()
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	var wg sync.WaitGroup
	errs := make(chan error, nw*len(names))
	start := time.Now()
	for w := range nw {
		rc, err := rueidis.NewClient(opt)
		if err != nil {
			return measurement{}, err
		}
		defer rc.Close()
		wk, err := newWorker(apps, rc, names, fmt.Sprintf("w%d", w+1))
		if err != nil {
			return measurement{}, err
		}
		wg.Go(func() {
			if err := wk.Run(wctx); err != nil {
				errs <- err
			}
		})
	}
	for {
		done := true
		for _, name := range names {
			ok, err := settled(ctx, admin, name, last[name])
			if err != nil {
				return measurement{}, err
			}
			done = done && ok
		}
		if done {
			break
		}
		select {
		case err := <-errs:
			return measurement{}, err
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 10*time.Minute {
			return measurement{}, fmt.Errorf("not every message acknowledged after 10 minutes")
		}
	}
	m := measurement{elapsed: time.Since(start), workerCPU: selfCPU() - self0}
	redis1, err := redisCPU(ctx, admin)
	if err != nil {
		return measurement{}, err
	}
	m.redisCPU = redis1 - redis0
	stop()
	wg.Wait()
	return m, nil
}

// newWorker builds what relay start builds for names: a worker.Worker, one
// Engine per stream on one client, sharing MAX_CONCURRENCY slots.
func newWorker(apps *app.Set, rc rueidis.Client, names []string, consumer string) (*worker.Worker, error) {
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"bench/noop.run": func(context.Context, runtime.Request) error { return nil },
	})
	return worker.New(worker.Config{
		Redis: rc, Streams: names, Group: group, Consumer: consumer,
		Apps: worker.Static(apps), Runner: runner,
		Engine: relay.Config{
			MaxConcurrency: maxConcurrency, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
			Retention: time.Minute, ShutdownTimeout: 5 * time.Second,
		},
	})
}

// fill appends n events to name in pipelined batches and returns the last id.
func fill(ctx context.Context, c rueidis.Client, name string, n int) (string, error) {
	var last string
	for done := 0; done < n; {
		batch := min(500, n-done)
		cmds := make(rueidis.Commands, 0, batch)
		for i := range batch {
			cmds = append(cmds, c.B().Xadd().Key(name).Id("*").FieldValue().
				FieldValue("event", fmt.Sprintf(`{"kind":"bench","n":%d}`, done+i)).Build())
		}
		for _, res := range c.DoMulti(ctx, cmds...) {
			id, err := res.ToString()
			if err != nil {
				return "", fmt.Errorf("fill %s: %w", name, err)
			}
			last = id
		}
		done += batch
	}
	return last, nil
}

// settled reports whether the group delivered everything up to last and
// nothing is pending.
func settled(ctx context.Context, c rueidis.Client, name, last string) (bool, error) {
	n, _, err := redisstream.New(c, name, group, "bench").Pending(ctx)
	if err != nil || n != 0 {
		return false, err
	}
	info, err := c.Do(ctx, c.B().XinfoGroups().Key(name).Build()).ToArray()
	if err != nil {
		return false, err
	}
	for _, g := range info {
		m, err := g.AsMap()
		if err != nil {
			return false, err
		}
		gname, delivered := m["name"], m["last-delivered-id"]
		if s, _ := gname.ToString(); s != group {
			continue
		}
		l, _ := delivered.ToString()
		return stream.CompareID(l, last) >= 0, nil
	}
	return false, nil
}

// selfCPU is the CPU time this process has used (the workers, plus the
// little the polling costs).
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// redisCPU sums used_cpu_user and used_cpu_sys (INFO cpu) over the masters.
func redisCPU(ctx context.Context, c rueidis.Client) (time.Duration, error) {
	var total float64
	for addr, node := range c.Nodes() {
		info, err := node.Do(ctx, node.B().Info().Section("cpu").Build()).ToString()
		if err != nil {
			return 0, fmt.Errorf("INFO cpu on %s: %w", addr, err)
		}
		for line := range strings.SplitSeq(info, "\n") {
			k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
			if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
				f, err := strconv.ParseFloat(v, 64)
				if err != nil {
					return 0, fmt.Errorf("INFO cpu on %s: %s: %w", addr, line, err)
				}
				total += f
			}
		}
	}
	return time.Duration(total * float64(time.Second)), nil
}

// cleanup deletes the benchmark's streams, DLQs and stats hashes.
func cleanup(ctx context.Context, c rueidis.Client, names []string) {
	for _, name := range names {
		for _, k := range []string{name, keys.DLQ(name), keys.Stats(name, group)} {
			if err := c.Do(ctx, c.B().Del().Key(k).Build()).Error(); err != nil {
				fmt.Fprintf(os.Stderr, "scaling: delete %s: %v\n", k, err)
			}
		}
	}
}
