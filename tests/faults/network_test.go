package faults_test

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/netfault"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
	relayworker "github.com/relaydev/relay/worker"
)

// TestSoakNetworkFaults puts a fault proxy (internal/netfault) between each
// of three worker processes and Redis, and throws at one worker at a time,
// while events flow: latency of 0–2 s with jitter, black holes (nothing
// flows, nothing is closed; what was sent is delivered when the path
// heals), and a partition that outlives the lease of a handler the worker
// is running; all the while every connection of every worker is reset
// every few seconds. The ledger (record_test.go) lives on a connection of
// its own, outside the faults. Besides the ledger's promises (nothing lost,
// no early acknowledgement, attempts = runs), it checks that each worker
// processes again within 10 s of each fault's end, that its readiness
// (worker.Worker.Ready, what /readyz serves) said not ready during each
// black hole, and that a partitioned worker's late outcome is refused by
// the fence. RELAY_SOAK_NETWORK_DURATION sets how long faults are thrown
// (make soak: black holes of 5–90 s); make test runs 40 s with black holes
// of a few seconds.
func TestSoakNetworkFaults(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	long := false
	dur := 40 * time.Second
	if v, err := time.ParseDuration(os.Getenv("RELAY_SOAK_NETWORK_DURATION")); err == nil && v > 0 {
		dur, long = v, v > 5*time.Minute
	}
	addr := redistest.Addr(t)
	rc, streamName, appsRoot, src := newSoakStream(t, addr, networkApp)
	names := []string{"w1", "w2", "w3"}
	proxies := map[string]*netfault.Proxy{}
	for _, n := range names {
		p, err := netfault.Start(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { p.Close() })
		proxies[n] = p
	}
	s := newSoak(t, envRedis+"="+addr, envStream+"="+streamName, envApps+"="+appsRoot, envRunner+"=func")
	s.workerEnv = func(name string) []string { return []string{envEngineRedis + "=" + proxies[name].Addr()} }
	s.startWorkers(names...)

	// Publish steadily until the faults end, so that every worker always
	// has work to show that it processes.
	published := map[string]event{}
	var pubMu sync.Mutex
	var newest string
	stopPub, pubDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(pubDone)
		for i := 0; ; i++ {
			select {
			case <-stopPub:
				return
			case <-time.After(25 * time.Millisecond):
			}
			kind, fail := "ok", 0
			switch r := rand.IntN(20); {
			case r < 3:
				kind, fail = "flaky", 1+rand.IntN(3)
			case r < 4:
				kind = "bad"
			case r < 6:
				kind = "slow"
			}
			id := publish(t, rc, src, fmt.Sprintf(`{"kind":%q,"fail":%d,"n":%d}`, kind, fail, i))
			pubMu.Lock()
			published[id], newest = event{kind: kind, fail: fail}, id
			pubMu.Unlock()
		}
	}()

	// Resets of every connection of every worker, every 2–4 s.
	var resets int
	stopResets := testutil.Every(2*time.Second, 2*time.Second, func() {
		for _, p := range proxies {
			resets += p.ResetAll()
		}
	})

	nf := &networkFaults{t: t, s: s, rc: rc, stream: streamName, proxies: proxies}
	end := time.Now().Add(dur)
	for i := 0; time.Now().Before(end); i++ {
		victim := names[i%len(names)]
		switch i % 3 {
		case 0:
			nf.latency(victim, 4*time.Second)
		case 1:
			hole := 3*time.Second + rand.N(3*time.Second)
			if long {
				hole = 5*time.Second + rand.N(85*time.Second)
			}
			nf.blackhole(victim, hole)
		case 2:
			nf.partitionMidHandler(victim)
		}
		time.Sleep(time.Second)
	}
	stopResets()
	close(stopPub)
	<-pubDone
	waitQuiet(t, rc, src, newest, 3*time.Minute)
	s.stopAll()
	s.checkCrashes()

	// What a fault can cost, as in the other soaks, with every black hole
	// and partition counted as a fault of every worker it cut off: lost
	// attempts (a success whose record could not reach Redis before its
	// lease ended is charged and run again), and their DLQ entries.
	faults := nf.holes + nf.partitions
	f := checkLedger(t, ledgerInput{
		rc: rc, stream: streamName, rules: networkRules, events: published,
		strandBudget:  faults,
		attemptBudget: faults * 2 * relay.DefaultConcurrency,
	})
	logFigures(t, t.Name()+": ledger", f, s)
	refused := s.countLogLines("attempt's lease taken over by another delivery") + s.countLogLines("a retried write found the attempt's lease gone") +
		s.countLogLines("the message is no longer pending in the consumer group")
	given := s.countLogLines("claim whose outcome was not learnt given back")
	healthFailed, healthDetail := healthSummary(nf.health)
	t.Logf("%s: network faults\n"+
		"  latency spells (0–2 s each way)       %d\n"+
		"  black holes                           %d (%v .. %v)\n"+
		"  partitions past a running handler's lease  %d\n"+
		"  connections reset                     %d\n"+
		"  worker back to processing after a fault  max %v (each: %v)\n"+
		"  not ready during every black hole     %d of %d (worst: unready %v after it began, ready %v after it healed)\n"+
		"  late outcomes refused by the fence    %d\n"+
		"  claims given back after a lost reply  %d\n"+
		"  relay health started in a black hole  %d unhealthy of %d (%s)",
		t.Name(), nf.latencies, nf.holes, nf.minHole, nf.maxHole, nf.partitions, resets,
		slices.Max(append(nf.recoveries, 0)), nf.recoveries, nf.unreadySeen, nf.holes+nf.partitions, nf.worstUnready, nf.worstReady,
		refused, given, healthFailed, len(nf.health), healthDetail)
	if m := slices.Max(append(nf.recoveries, 0)); m > 10*time.Second {
		t.Errorf("a worker took %v to process again after a fault ended, want at most 10s", m)
	}
	if nf.unreadySeen != nf.holes+nf.partitions {
		t.Errorf("readiness said not ready during %d of %d black holes", nf.unreadySeen, nf.holes+nf.partitions)
	}
	if nf.partitions > 0 && refused == 0 {
		t.Errorf("no late outcome refused by the fence after %d partitions past a handler's lease", nf.partitions)
	}
}

const networkApp = soakApp + `  - {handler: slow.run, pattern: {kind: [slow]}, timeout: 3s, retries: 4}
`

// networkRules are the network soak's expectations, matching networkApp.
var networkRules = map[string]rule{
	"ok":    funcRules["ok"],
	"flaky": funcRules["flaky"],
	"bad":   funcRules["bad"],
	"slow":  {handler: "slow.run", attempts: 5},
}

// slowRunTime is how long a slow.run handler takes.
const slowRunTime = 1500 * time.Millisecond

// networkFaults throws the network soak's faults, one at a time, and
// measures what each did.
type networkFaults struct {
	t       *testing.T
	s       *soak
	rc      rueidis.Client
	stream  string
	proxies map[string]*netfault.Proxy

	latencies, holes, partitions int
	minHole, maxHole             time.Duration
	// recoveries holds, per fault, how long after it ended its victim
	// logged a success again.
	recoveries []time.Duration
	// unreadySeen counts the black holes (partitions included) during
	// which the victim's readiness said not ready.
	unreadySeen              int
	worstUnready, worstReady time.Duration
	// health holds, per black hole, what relay health's Redis check
	// found when started as it began.
	health []healthCheck
}

// healthCheck is the outcome of one relay health Redis check: its error
// (nil: healthy) and how long it took.
type healthCheck struct {
	err  error
	took time.Duration
}

// checkHealth runs what relay health's Redis check runs (cmd/relay
// health.go): a new client of addr and redisstream.Source.Ping within 10 s.
func checkHealth(addr, streamName string) healthCheck {
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err == nil {
		defer c.Close()
		err = redisstream.New(c, streamName, soakGroup, "relay-health").Ping(ctx)
	}
	return healthCheck{err: err, took: time.Since(start)}
}

// healthSummary says how many relay health checks failed, and how the
// others ended.
func healthSummary(hs []healthCheck) (failed int, detail string) {
	var parts []string
	for _, h := range hs {
		if h.err != nil {
			failed++
			parts = append(parts, fmt.Sprintf("failed after %v", h.took.Round(100*time.Millisecond)))
		} else {
			parts = append(parts, fmt.Sprintf("answered after %v", h.took.Round(100*time.Millisecond)))
		}
	}
	return failed, strings.Join(parts, ", ")
}

// latency delays every chunk each way by 0–1 s plus a jitter of up to 1 s
// on victim's connections for d.
func (nf *networkFaults) latency(victim string, d time.Duration) {
	p := nf.proxies[victim]
	p.SetLatency(rand.N(time.Second), time.Second)
	time.Sleep(d)
	p.SetLatency(0, 0)
	nf.latencies++
	nf.recovered(victim, time.Now())
}

// blackhole cuts victim off for d, then checks its readiness and
// recovery.
func (nf *networkFaults) blackhole(victim string, d time.Duration) {
	p := nf.proxies[victim]
	began := time.Now()
	p.Blackhole()
	start := time.Now()
	health := make(chan healthCheck, 1)
	go func() { health <- checkHealth(p.Addr(), nf.stream) }()
	time.Sleep(d)
	p.Heal()
	healed := time.Now()
	nf.holes++
	h := <-health
	if h.err == nil && start.Add(h.took).Before(healed) {
		nf.t.Errorf("relay health's Redis check said healthy during a black hole of %s", victim)
	}
	nf.health = append(nf.health, h)
	if nf.minHole == 0 || d < nf.minHole {
		nf.minHole = d
	}
	nf.maxHole = max(nf.maxHole, d)
	nf.readiness(victim, began, healed)
	nf.recovered(victim, healed)
}

// partitionMidHandler waits until victim starts a slow.run handler and
// cuts it off at once, for partitionFor: past that handler's lease (its
// 3 s timeout plus the 2 s lease grace), so that another worker, once the
// message idled for the reclaim's 3 s twice (the first finds the lease
// still running), charges the attempt as lost and runs the next one while
// the victim's handler runs on; the path heals while the victim still
// retries the record of its success, which the fence then refuses.
func (nf *networkFaults) partitionMidHandler(victim string) {
	key := ledgerKey(nf.stream, "slow_started:"+victim)
	started := func() int64 {
		n, _ := nf.rc.Do(context.Background(), nf.rc.B().Get().Key(key).Build()).AsInt64()
		return n
	}
	before := started()
	deadline := time.Now().Add(20 * time.Second)
	for started() == before {
		if time.Now().After(deadline) {
			nf.t.Logf("%s started no slow handler for 20s; partition skipped", victim)
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	p := nf.proxies[victim]
	began := time.Now()
	p.Blackhole()
	time.Sleep(partitionFor)
	p.Heal()
	healed := time.Now()
	nf.partitions++
	nf.readiness(victim, began, healed)
	nf.recovered(victim, healed)
}

// partitionFor is how long partitionMidHandler cuts its victim off: the
// takeover comes about 6.2 s after the handler started (two reclaims 3 s
// apart, the second after the lease of 5 s), and the victim retries the
// record of its success until the lease plus the reclaim idle time, 8 s.
const partitionFor = 7200 * time.Millisecond

// readiness reads the readiness victim recorded around a black hole from
// began to healed: it must have said not ready when it healed, and ready
// again after.
func (nf *networkFaults) readiness(victim string, began, healed time.Time) {
	// The worker is ready again once a read of the stream succeeded, which
	// its read loop's backoff may delay by a few seconds.
	var marks []string
	for wait := time.Now().Add(15 * time.Second); time.Now().Before(wait); time.Sleep(200 * time.Millisecond) {
		var err error
		marks, err = nf.rc.Do(context.Background(), nf.rc.B().Lrange().Key(ledgerKey(nf.stream, "ready:"+victim)).Start(0).Stop(-1).Build()).AsStrSlice()
		if err != nil {
			nf.t.Errorf("read %s's readiness: %v", victim, err)
			return
		}
		if len(marks) > 0 {
			ms, state, _ := strings.Cut(marks[len(marks)-1], " ")
			if n, _ := strconv.ParseInt(ms, 10, 64); state == "ready" && n > healed.UnixMilli() {
				break
			}
		}
	}
	// The readiness as the black hole ended: the last mark before the heal
	// must say unready (its spell may have begun just before the black
	// hole, at a reset); the first mark after it, ready.
	var unready, ready time.Time
	for _, m := range marks {
		ms, state, _ := strings.Cut(m, " ")
		n, _ := strconv.ParseInt(ms, 10, 64)
		at := time.UnixMilli(n)
		switch {
		case !at.After(healed) && state == "unready":
			unready = at
		case !at.After(healed):
			unready = time.Time{}
		case ready.IsZero() && state == "ready":
			ready = at
		}
	}
	if unready.IsZero() {
		nf.t.Logf("%s: readiness did not say not ready as the black hole %v..%v: %v", victim, began.Format(time.TimeOnly), healed.Format(time.TimeOnly), marks)
		return
	}
	if ready.IsZero() {
		nf.t.Errorf("%s: readiness did not say ready again after the black hole healed at %v", victim, healed.Format(time.TimeOnly))
		return
	}
	nf.unreadySeen++
	nf.worstUnready = max(nf.worstUnready, unready.Sub(began)) // <= 0 when a reset made it unready first
	nf.worstReady = max(nf.worstReady, ready.Sub(healed))
}

// recovered waits until victim logs a success after ended and records
// how long that took; 30 s at most.
func (nf *networkFaults) recovered(victim string, ended time.Time) {
	deadline := ended.Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if at, ok := nf.firstSuccessAfter(victim, ended); ok {
			nf.recoveries = append(nf.recoveries, at.Sub(ended).Round(10*time.Millisecond))
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	nf.recoveries = append(nf.recoveries, 30*time.Second)
	nf.t.Errorf("%s processed nothing within 30s after a fault ended at %v", victim, ended.Format(time.TimeOnly))
}

// firstSuccessAfter is the time of victim's first "invocation succeeded"
// log line after t.
func (nf *networkFaults) firstSuccessAfter(victim string, t time.Time) (time.Time, bool) {
	w := nf.s.procs.Proc(victim)
	if w == nil {
		return time.Time{}, false
	}
	f, err := os.Open(w.Log)
	if err != nil {
		return time.Time{}, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="invocation succeeded"`) || !strings.HasPrefix(line, "time=") {
			continue
		}
		ts, _, _ := strings.Cut(strings.TrimPrefix(line, "time="), " ")
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err == nil && at.After(t) {
			return at, true
		}
	}
	return time.Time{}, false
}

// The network soak's worker timings: a lease grace that covers claims
// slowed by 2 s of latency each way, and a reclaim idle time that
// heartbeats slowed as much still beat.
const (
	networkLeaseGrace     = 2 * time.Second
	networkMinPendingIdle = 3 * time.Second
)

func networkWorkerConfig() relay.Config {
	return relay.Config{
		MinPendingIdle:    networkMinPendingIdle,
		ReclaimInterval:   200 * time.Millisecond,
		HeartbeatInterval: 300 * time.Millisecond,
		Backoff:           []time.Duration{50 * time.Millisecond},
		LeaseGrace:        networkLeaseGrace,
		ConcurrencyWait:   time.Second,
		ShutdownTimeout:   2 * time.Second,
		WriteTimeout:      3 * time.Second,
	}
}

// networkWorker runs what relay start runs, a worker.Worker, with every
// part on engineRC (through the worker's fault proxy) and the ledger
// wrapped around the Engine's parts; the ledger's own writes, and the
// readiness it records every 200 ms (Worker.Ready, what /readyz serves),
// go on rec's connection, outside the faults.
func networkWorker(ctx context.Context, t *testing.T, engineRC rueidis.Client, rec *recorder, runner relay.Runner, log *slog.Logger, consumer string) {
	cfg := networkWorkerConfig()
	cfg.Logger = log
	reg := prometheus.NewRegistry()
	cfg.Metrics = reg
	w, err := relayworker.New(relayworker.Config{
		Redis: engineRC, Streams: []string{rec.stream}, Group: soakGroup, Consumer: consumer,
		Apps: template.Dir(os.Getenv(envApps)), Runner: runner,
		StreamRetention: relayworker.Disabled, DLQRetention: relayworker.Disabled, ConsumerIdle: relayworker.Disabled,
		DisableStats: true,
		WrapComponents: func(c relay.Components) relay.Components {
			c.Source = ledgerSource{c.Source.(*redisstream.Source), rec}
			c.State = ledgerState{c.State, rec}
			c.Runner = ledgerRunner{c.Runner, rec}
			return c
		},
		Engine: cfg,
	})
	if err != nil {
		t.Fatal(err)
	}
	probeCtx, stopProbe := context.WithCancel(context.WithoutCancel(ctx))
	probed := make(chan struct{})
	go func() { defer close(probed); recordReadiness(probeCtx, w, rec) }()
	pushCtx, stopPush := context.WithCancel(context.WithoutCancel(ctx))
	pushed := make(chan struct{})
	go func() { defer close(pushed); rec.pushMissingMetric(pushCtx, reg) }()
	if err := w.Run(ctx); err != nil {
		t.Error(err)
	}
	stopProbe()
	<-probed
	stopPush()
	<-pushed
}

// recordReadiness asks w.Ready every 200 ms, with the 1 s budget of a
// probe, and appends each change to the ledger list ready:<consumer> as
// "<unix ms> ready|unready".
func recordReadiness(ctx context.Context, w *relayworker.Worker, rec *recorder) {
	last := ""
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		state := "ready"
		if w.Ready(pctx) != nil {
			state = "unready"
		}
		cancel()
		if state != last && ctx.Err() == nil {
			mark := fmt.Sprintf("%d %s", time.Now().UnixMilli(), state)
			if persistently(ctx, func(ctx context.Context) error {
				return rec.rc.Do(ctx, rec.rc.B().Rpush().Key(ledgerKey(rec.stream, "ready:"+rec.consumer)).Element(mark).Build()).Error()
			}) == nil {
				last = state
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// slowRun is the slow.run handler: it runs slowRunTime, and counts its
// starts in the ledger's slow_started:<consumer>, so the soak can cut its
// worker off mid-run.
func slowRun(rec *recorder, start runtime.HandlerFunc) runtime.HandlerFunc {
	return func(ctx context.Context, req runtime.Request) error {
		if err := start(ctx, req); err != nil {
			return err
		}
		_ = rec.rc.Do(ctx, rec.rc.B().Incr().Key(ledgerKey(rec.stream, "slow_started:"+rec.consumer)).Build()).Error()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(slowRunTime):
			return nil
		}
	}
}

// Void keeps the store's relay.ClaimVoider capability visible to the
// engine, as a wrapper must (relay.go).
func (s ledgerState) Void(ctx context.Context, l invocation.Lease) error {
	if v, ok := s.StateStore.(relay.ClaimVoider); ok {
		return v.Void(ctx, l)
	}
	return fmt.Errorf("faults: the state store cannot void claims")
}
