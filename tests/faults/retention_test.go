package faults_test

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
)

// The retention soak's settings. Its length is RELAY_SOAK_RETENTION_DURATION
// for each retention setting (make soak: 10m; make test: 1m).
const (
	retentionRate = 60 // events published per second
	// retentionHold bounds how long a message stays unsettled in this
	// soak: a kill leaves it pending for MinPendingIdle, a flaky or bad
	// event retries with backoff, and a worker restarted while the
	// template is broken acknowledges nothing until its next reload.
	// The bounds below allow for it; none depends on how fast the
	// machine is, only on the retentions and the publishing rate.
	retentionHold = 15 * time.Second
	// retentionSlack allows for whole stream nodes kept by an
	// approximate trim and for entries trimmed at the next round.
	retentionSlack = 200
	// dlqShare bounds the share of events dead-lettered: a tenth are
	// "bad", a few flaky ones are exhausted by kills.
	dlqShare = 0.2
	// killEvery is the least time between two kills.
	killEvery = 2 * time.Second
)

// The retention soak's settings: invocation state kept 10 s after the
// acknowledgement, or deleted with it.
var (
	retentionSettingsShort  = retentionSettings{stream: 5 * time.Second, dlq: 5 * time.Second, state: 10 * time.Second, interval: time.Second}
	retentionSettingsDelete = retentionSettings{stream: 5 * time.Second, dlq: 5 * time.Second, state: 0, interval: time.Second}
)

// projectionTolerance is how far the memory the parts level off at may be
// from what redisstats.MeasureMemory projected earlier in the run.
const projectionTolerance = 0.25

func retentionSoakDuration() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("RELAY_SOAK_RETENTION_DURATION")); err == nil && d > 0 {
		return d
	}
	return time.Minute
}

// Templates the soak edits while it runs. Every valid version of the soak
// app has the same rules as soakApp (the ledger's expectations); the aux
// app matches events that are never published.
const (
	soakAppEdited = soakApp + `
# edited: same rules, a longer timeout for ok.run would not change them
`
	soakAppBroken = `
image: unused
events:
  - {handler: ok.run, pattern: {kind: [ok]}, timeout: 1s
`
	auxAppName = "aux"
	auxApp     = `
image: unused
events:
  - {handler: aux.run, pattern: {kind: [never]}}
`
	auxAppEdited = `
image: unused
events:
  - {handler: aux.run, pattern: {kind: [never, nor-this]}}
`
)

// retentionSample is one look at the soak's Redis.
type retentionSample struct {
	at                      time.Duration
	published               int
	usedMemory, ledgerBytes int64
	// engineBytes is MEMORY USAGE summed over every key but the
	// ledger's: what the retentions must bound.
	engineBytes int64
	// unattributed is used_memory_dataset minus MEMORY USAGE summed over
	// every key: memory Redis holds for data that no key reports.
	unattributed          int64
	streamLen, dlqLen     int64
	hashes, hashesNoTTL   int
	markers, markersNoTTL int
	otherKeys             int
	consumers             int
	// mem is what redisstats.MeasureMemory measured and projected at the
	// soak's retentions; measured is false when it failed.
	mem      stats.Memory
	measured bool
}

// relayParts is what the retentions bound in m: the stream, the
// dead-letter stream and the invocation state, as they are now and as
// projected.
func relayParts(m stats.Memory) (now, projected int64) {
	return m.Stream.Bytes + m.DLQ.Bytes + m.Invocations.Bytes, m.Stream.Projected + m.DLQ.Projected + m.Invocations.Projected
}

// engineMemory is used_memory without the ledger's keys, which grow with
// every event by design.
func (s retentionSample) engineMemory() int64 { return s.usedMemory - s.ledgerBytes }

// TestSoakRetention runs the retention soak with the invocation state kept
// 10 s after the acknowledgement, and deleted with it.
func TestSoakRetention(t *testing.T) {
	if testing.Short() {
		t.Skip("soak test")
	}
	for _, rs := range []retentionSettings{retentionSettingsShort, retentionSettingsDelete} {
		t.Run("state="+rs.state.String(), func(t *testing.T) { soakRetention(t, rs) })
	}
}

// soakRetention is "a month in an hour": short retentions (seconds)
// while three worker.Worker processes are killed (SIGKILL) and restarted
// under new consumer names and the apps root is edited under them (valid
// edits, a broken one, an app removed and added again). Every few seconds
// it samples Redis: used memory, the stream's and the dead-letter stream's
// length, the invocation hashes and dead-letter markers with and without a
// TTL, the group's consumers. Each
// must stay under a bound derived from the retentions and the publishing
// rate, and the memory must plateau, while the ledger proves nothing lost
// or acknowledged early and no pending entry trimmed
// (docs/operations.md#retention). The stream, dead-letter stream and
// invocation state must level off within projectionTolerance of what
// redisstats.MeasureMemory projected in the middle of the run
// (docs/operations.md#memory-budget).
func soakRetention(t *testing.T, rs retentionSettings) {
	duration := retentionSoakDuration()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	streamName := redistest.Name(t, "soak")
	appsRoot := t.TempDir()
	writeApp := func(name, text string, atomic bool) {
		dir := filepath.Join(appsRoot, name)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Error(err)
			return
		}
		path := filepath.Join(dir, app.TemplateFile)
		if !atomic {
			if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
				t.Error(err)
			}
			return
		}
		tmp := filepath.Join(appsRoot, "."+name+".tmp")
		if err := os.WriteFile(tmp, []byte(text), 0o644); err != nil {
			t.Error(err)
			return
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Error(err)
		}
	}
	writeApp(soakAppName, soakApp, true)
	writeApp(auxAppName, auxApp, true)
	ctx := context.Background()
	src := redisstream.New(rc, streamName, soakGroup, "publisher")
	if err := src.EnsureGroup(ctx); err != nil {
		t.Fatal(err)
	}
	s := newSoak(t, envRedis+"="+srv.Addr, envStream+"="+streamName, envApps+"="+appsRoot, envRunner+"=func",
		envRetention+"="+rs.String())
	names := []string{"w1", "w2", "w3"}
	s.startWorkers(names...)

	// Samples, taken while the soak runs and once more at the end.
	var (
		smu       sync.Mutex
		samples   []retentionSample
		published int
	)
	began := time.Now()
	sample := func() {
		smu.Lock()
		n := published
		smu.Unlock()
		sm, err := sampleRedis(ctx, rc, streamName)
		if err != nil {
			t.Logf("sample: %v", err)
			return
		}
		sm.mem, err = redisstats.MeasureMemory(ctx, rc, streamName, soakGroup, stats.Retentions{Stream: rs.stream, DLQ: rs.dlq, Invocation: rs.state}, stats.Budget{})
		if sm.measured = err == nil; err != nil {
			t.Logf("measure memory: %v", err)
		}
		sm.at, sm.published = time.Since(began).Round(time.Second), n
		smu.Lock()
		samples = append(samples, sm)
		smu.Unlock()
	}
	every := 2 * time.Second
	if duration > 3*time.Minute {
		every = 5 * time.Second
	}
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			sample()
			select {
			case <-stopSampling:
				return
			case <-time.After(every):
			}
		}
	}()

	// Faults: a worker killed every 2-4s; an edit of the apps root every
	// 2-4s, cycling through valid edits, a broken template (fixed 1.5s
	// later), the aux app removed and added again.
	// A restarted worker takes a new consumer name, as a new pod would:
	// the workers remove the consumers left behind.
	generation := 0
	stopKills := s.faultEvery(killEvery, 2*time.Second, func() {
		victim := names[rand.IntN(len(names))]
		s.kill(victim, syscall.SIGKILL)
		generation++
		s.mu.Lock()
		s.restarts++
		s.mu.Unlock()
		s.startAs(victim, fmt.Sprintf("%s-%d", victim, generation))
	})
	var edits struct{ valid, broken, removed, added int }
	step := 0
	stopEdits := s.faultEvery(2*time.Second, 2*time.Second, func() {
		switch step % 6 {
		case 0:
			writeApp(soakAppName, soakAppEdited, true)
			edits.valid++
		case 1:
			if err := os.RemoveAll(filepath.Join(appsRoot, auxAppName)); err != nil {
				t.Error(err)
			}
			edits.removed++
		case 2:
			writeApp(soakAppName, soakAppBroken, false)
			edits.broken++
			time.Sleep(1500 * time.Millisecond)
			writeApp(soakAppName, soakApp, true)
			edits.valid++
		case 3:
			writeApp(auxAppName, auxAppEdited, false)
			edits.added++
		case 4:
			writeApp(soakAppName, soakAppEdited, false)
			edits.valid++
		case 5:
			writeApp(auxAppName, auxApp, true)
			writeApp(soakAppName, soakApp, true)
			edits.valid += 2
		}
		step++
	})

	events := map[string]event{}
	var newest string
	for i := 0; time.Since(began) < duration; i++ {
		if wait := time.Until(began.Add(time.Duration(i) * time.Second / retentionRate)); wait > 0 {
			time.Sleep(wait)
		}
		kind, fail := "ok", 0
		switch r := rand.IntN(10); {
		case r < 2:
			kind, fail = "flaky", 1+rand.IntN(3)
		case r < 3:
			kind = "bad"
		}
		id := publish(t, rc, src, fmt.Sprintf(`{"kind":%q,"fail":%d,"n":%d}`, kind, fail, i))
		events[id] = event{kind: kind, fail: fail}
		newest = id
		smu.Lock()
		published++
		smu.Unlock()
	}
	publishedFor := time.Since(began)
	time.Sleep(2 * time.Second)
	stopKills()
	stopEdits()
	writeApp(auxAppName, auxApp, true)
	writeApp(soakAppName, soakApp, true)
	waitQuiet(t, rc, src, newest, 3*time.Minute)
	// Everything settled: nothing may be left without a TTL (the janitor
	// retains what a kill leaked), and once the retentions pass, both
	// streams are empty but for the group's last delivered entry, and
	// every invocation hash has expired. No dead-letter marker key may
	// exist at all: an entry's id lives in its invocation hash
	// (invocation.DLQField), so with the state deleted at the ack nothing
	// of a dead letter outlives the XACK but the entry.
	var end retentionSample
	for deadline := time.Now().Add(2 * time.Minute); ; {
		var err error
		end, err = sampleRedis(ctx, rc, streamName)
		markersDone := end.markers == 0
		if err == nil && end.streamLen <= 1 && end.dlqLen == 0 && end.hashes == 0 && markersDone &&
			end.consumers <= len(names) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("2 minutes after the soak: stream %d, DLQ %d, invocation hashes %d (%d without a TTL), markers %d (%d without a TTL), consumers %d (%v); want at most 1, 0, 0, 0 (or all with a TTL when the state is deleted at the ack), %d (an idle worker's consumer may go too, and comes back with its next delivery)",
				end.streamLen, end.dlqLen, end.hashes, end.hashesNoTTL, end.markers, end.markersNoTTL, end.consumers, err, len(names))
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("after the retentions: stream %d, DLQ %d, invocation hashes %d, markers %d, consumers %d",
		end.streamLen, end.dlqLen, end.hashes, end.markers, end.consumers)
	close(stopSampling)
	<-sampled
	sample()
	// MEMORY USAGE reports a hash field's table entry at its struct size,
	// less than the allocator gives it (about 8 bytes a field): memory no
	// key reports grows with the ledger's fields.
	var ledgerFields int64
	for _, name := range []string{keyRunIDs, keyRuns, keyLastRun, keyAttemptRuns, keyCalls, keyLastCall, keyCallAttempts,
		keyOKSeq, keyAckStates, keyDLQEntries, keyLateRuns, keyLateCalls, keyDelayedRuns, keyDelayedCalls, keyEarlyAcks, keyEnds, keyMissingMetric} {
		n, _ := rc.Do(ctx, rc.B().Hlen().Key(ledgerKey(streamName, name)).Build()).AsInt64()
		ledgerFields += n
	}
	t.Logf("ledger: %d hash fields, %s reported by MEMORY USAGE", ledgerFields, mib(samples[len(samples)-1].ledgerBytes))
	s.stopAll()
	s.checkCrashes()

	f := checkLedger(t, ledgerInput{
		rc: rc, stream: streamName, rules: funcRules, events: events, deleted: map[string]bool{},
		strandBudget: s.kills, attemptBudget: s.kills * 2 * relay.DefaultConcurrency, retained: true,
	})
	logFigures(t, t.Name()+": ledger", f, s)
	t.Logf("%s: apps root edits: %d valid, %d broken, %d app removals, %d re-additions",
		t.Name(), edits.valid, edits.broken, edits.removed, edits.added)

	rate := float64(published) / publishedFor.Seconds()
	checkPlateaus(t, samples, rs, rate)
	checkProjection(t, samples)
	t.Logf("%s: %d events in %s (%.0f/s); retentions stream %s, DLQ %s, invocation state %s; trim and janitor every %s\n%s",
		t.Name(), published, publishedFor.Round(time.Second), rate, rs.stream, rs.dlq, rs.state, rs.interval, curve(samples, 16))
}

// checkPlateaus fails the soak when a sample is over its bound, or the
// memory grows in the last third of the run.
func checkPlateaus(t *testing.T, samples []retentionSample, rs retentionSettings, rate float64) {
	t.Helper()
	if len(samples) < 6 {
		t.Fatalf("only %d samples", len(samples))
	}
	secs := func(d time.Duration) float64 { return d.Seconds() }
	hold := secs(rs.interval + retentionHold)
	bounds := []struct {
		what  string
		bound float64
		value func(retentionSample) float64
	}{
		{"stream length", rate*(secs(rs.stream)+hold) + retentionSlack, func(s retentionSample) float64 { return float64(s.streamLen) }},
		{"DLQ length", rate*dlqShare*(secs(rs.dlq)+hold) + retentionSlack, func(s retentionSample) float64 { return float64(s.dlqLen) }},
		{"invocation hashes", rate*(secs(rs.state)+hold) + retentionSlack, func(s retentionSample) float64 { return float64(s.hashes) }},
		{"invocation hashes without a TTL", rate*hold + retentionSlack, func(s retentionSample) float64 { return float64(s.hashesNoTTL) }},
		// The previous version's markers: this one writes none.
		{"dead-letter markers", 0, func(s retentionSample) float64 { return float64(s.markers) }},
		// The stats hash, the console feed and the group's keys.
		{"other keys", 10, func(s retentionSample) float64 { return float64(s.otherKeys) }},
		// Three live workers, and those killed while their consumer waits
		// for its pending entries to be reclaimed and then for the idle
		// time, one kill per killEvery at most.
		{"consumers in the group", 3 + (secs(rs.stream)+hold)/secs(killEvery) + 1, func(s retentionSample) float64 { return float64(s.consumers) }},
	}
	for _, b := range bounds {
		peak := 0.0
		for _, s := range samples {
			peak = max(peak, b.value(s))
		}
		if peak > b.bound {
			t.Errorf("%s peaked at %.0f, over its bound %.0f", b.what, peak, b.bound)
		} else {
			t.Logf("%s: peak %.0f, bound %.0f", b.what, peak, b.bound)
		}
	}
	// The memory of the engine's keys has no bound of its own to derive;
	// it must level off: the last third of the run peaks at most a fifth
	// plus 256 KiB above the middle third. A leak of a few hundred bytes
	// per event (an untrimmed stream, a hash never expiring) grows past
	// that. used_memory itself also holds the ledger, which grows with
	// every event by design, and memory no key reports: both are logged.
	run := samples[:len(samples)-1] // the last one is after the soak
	third := len(run) / 3
	peak := func(ss []retentionSample, v func(retentionSample) int64) int64 {
		var m int64
		for _, s := range ss {
			m = max(m, v(s))
		}
		return m
	}
	engine := func(s retentionSample) int64 { return s.engineBytes }
	mid, last := peak(run[third:2*third], engine), peak(run[2*third:], engine)
	if float64(last) > 1.2*float64(mid)+256<<10 {
		t.Errorf("the engine's keys still grow: MEMORY USAGE peaks at %s in the last third of the run, %s in the middle third",
			mib(last), mib(mid))
	} else {
		t.Logf("the engine's keys (MEMORY USAGE): peak %s in the middle third, %s in the last", mib(mid), mib(last))
	}
	used := func(s retentionSample) int64 { return s.engineMemory() }
	first, end := samples[0], samples[len(samples)-1]
	t.Logf("used_memory without the ledger: %s at the start, peak %s in the middle third, %s in the last, %s after the soak; of it, not reported by any key: %s at the start, %s after",
		mib(used(first)), mib(peak(run[third:2*third], used)), mib(peak(run[2*third:], used)), mib(used(end)),
		mib(first.unattributed), mib(end.unattributed))
}

// checkProjection fails the soak when the stream, the dead-letter stream
// and the invocation state level off (the median of the last third of
// the run) farther than projectionTolerance from the projection of the
// middle third (its median), and logs used_memory beside them.
func checkProjection(t *testing.T, samples []retentionSample) {
	t.Helper()
	run := samples[:len(samples)-1] // the last one is after the soak
	third := len(run) / 3
	median := func(ss []retentionSample, v func(retentionSample) int64) int64 {
		var vs []int64
		for _, s := range ss {
			if s.measured {
				vs = append(vs, v(s))
			}
		}
		if len(vs) == 0 {
			t.Fatalf("no memory measurement in %d samples", len(ss))
		}
		slices.Sort(vs)
		return vs[len(vs)/2]
	}
	now := func(s retentionSample) int64 { n, _ := relayParts(s.mem); return n }
	projected := func(s retentionSample) int64 { _, p := relayParts(s.mem); return p }
	predicted, level := median(run[third:2*third], projected), median(run[2*third:], now)
	used := func(s retentionSample) int64 { return s.mem.Used - s.ledgerBytes }
	usedProjected := func(s retentionSample) int64 { return s.mem.Projected - s.ledgerBytes }
	t.Logf("stream, DLQ and invocation state: projected %s in the middle third, level %s in the last (%+.0f%%); used_memory without the ledger: projected %s, level %s",
		mib(predicted), mib(level), 100*(float64(level)/float64(predicted)-1),
		mib(median(run[third:2*third], usedProjected)), mib(median(run[2*third:], used)))
	if d := math.Abs(float64(level) - float64(predicted)); d > projectionTolerance*float64(predicted) {
		t.Errorf("the stream, DLQ and invocation state levelled off at %s, %.0f%% from the projection %s (tolerance %.0f%%)",
			mib(level), 100*d/float64(predicted), mib(predicted), 100*projectionTolerance)
	}
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// curve renders about rows samples, evenly spread, and the last one, as a
// table ready for bench/RESULTS.md.
func curve(samples []retentionSample, rows int) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 1, ' ', 0)
	fmt.Fprintln(w, "| t\t| published\t| engine keys\t| used_memory − ledger\t| stream length\t| DLQ length\t| invocation hashes (no TTL)\t| DLQ markers (no TTL)\t| consumers\t|")
	fmt.Fprintln(w, "|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|--:\t|")
	stepBy := max(1, (len(samples)-1)/rows)
	for i, s := range samples {
		if i%stepBy != 0 && i != len(samples)-1 {
			continue
		}
		fmt.Fprintf(w, "| %s\t| %d\t| %s\t| %s\t| %d\t| %d\t| %d (%d)\t| %d (%d)\t| %d\t|\n", s.at, s.published, mib(s.engineBytes), mib(s.engineMemory()),
			s.streamLen, s.dlqLen, s.hashes, s.hashesNoTTL, s.markers, s.markersNoTTL, s.consumers)
	}
	w.Flush()
	return b.String()
}

// sampleRedis looks at the soak's Redis: memory, stream lengths, and every
// key by kind with its TTL.
func sampleRedis(ctx context.Context, rc rueidis.Client, streamName string) (retentionSample, error) {
	var s retentionSample
	info, err := rc.Do(ctx, rc.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return s, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			s.usedMemory, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	if s.streamLen, err = rc.Do(ctx, rc.B().Xlen().Key(streamName).Build()).AsInt64(); err != nil {
		return s, err
	}
	if s.dlqLen, err = rc.Do(ctx, rc.B().Xlen().Key(keys.DLQ(streamName)).Build()).AsInt64(); err != nil {
		return s, err
	}
	cs, err := rc.Do(ctx, rc.B().XinfoConsumers().Key(streamName).Group(soakGroup).Build()).ToArray()
	if err != nil {
		return s, err
	}
	s.consumers = len(cs)
	dataset := int64(0)
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory_dataset:"); ok {
			dataset, _ = strconv.ParseInt(v, 10, 64)
		}
	}
	invocationPrefix := keys.Invocation(streamName, soakGroup, "")
	markerPrefix := keys.DLQ(streamName) + ":written:" // keys.LegacyDLQWritten
	ledgerPrefix := ledgerKey(streamName, "")
	var invocations, markers, ledger, engine []string
	var cursor uint64
	for {
		e, err := rc.Do(ctx, rc.B().Scan().Cursor(cursor).Count(1000).Build()).AsScanEntry()
		if err != nil {
			return s, err
		}
		for _, k := range e.Elements {
			switch {
			case strings.HasPrefix(k, invocationPrefix):
				invocations = append(invocations, k)
				engine = append(engine, k)
			case strings.HasPrefix(k, markerPrefix):
				markers = append(markers, k)
				engine = append(engine, k)
			case strings.HasPrefix(k, ledgerPrefix):
				ledger = append(ledger, k)
			case k == streamName || k == keys.DLQ(streamName):
				engine = append(engine, k)
			default:
				s.otherKeys++
				engine = append(engine, k)
			}
		}
		if cursor = e.Cursor; cursor == 0 {
			break
		}
	}
	noTTL := func(ks []string) (int, error) {
		if len(ks) == 0 {
			return 0, nil
		}
		cmds := make(rueidis.Commands, 0, len(ks))
		for _, k := range ks {
			cmds = append(cmds, rc.B().Pttl().Key(k).Build())
		}
		n := 0
		for _, r := range rc.DoMulti(ctx, cmds...) {
			ttl, err := r.AsInt64()
			if err != nil {
				return 0, err
			}
			if ttl == -1 {
				n++
			}
		}
		return n, nil
	}
	// A key counted by SCAN may expire before its PTTL (-2): it is gone.
	s.hashes, s.markers = len(invocations), len(markers)
	if s.hashesNoTTL, err = noTTL(invocations); err != nil {
		return s, err
	}
	if s.markersNoTTL, err = noTTL(markers); err != nil {
		return s, err
	}
	usage := func(ks []string) (int64, error) {
		if len(ks) == 0 {
			return 0, nil
		}
		cmds := make(rueidis.Commands, 0, len(ks))
		for _, k := range ks {
			cmds = append(cmds, rc.B().MemoryUsage().Key(k).Samples(0).Build())
		}
		var sum int64
		for _, r := range rc.DoMulti(ctx, cmds...) {
			n, err := r.AsInt64()
			if err != nil && !rueidis.IsRedisNil(err) { // expired meanwhile
				return 0, err
			}
			sum += n
		}
		return sum, nil
	}
	if s.ledgerBytes, err = usage(ledger); err != nil {
		return s, err
	}
	if s.engineBytes, err = usage(engine); err != nil {
		return s, err
	}
	s.unattributed = dataset - s.ledgerBytes - s.engineBytes
	return s, nil
}
