package redisschedule

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/schedule/cron"
)

// fakeClock runs at real speed from an instant the test chooses, and can be
// stepped. It counts reads so a test can tell that the Scheduler has looked
// at the clock since a step.
type fakeClock struct {
	mu    sync.Mutex
	base  time.Time // the reading at setAt
	setAt time.Time // real time of the last Set
	reads int
}

func newFakeClock(at time.Time) *fakeClock {
	return &fakeClock{base: at, setAt: time.Now()}
}

// Now is the Scheduler's clock; it counts reads.
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.reads++
	return c.base.Add(time.Since(c.setAt))
}

// Peek is the test's view of the clock; it does not count as a read.
func (c *fakeClock) Peek() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(time.Since(c.setAt))
}

// ServerNow is the same clock as the Scheduler's authoritative clock.
func (c *fakeClock) ServerNow(context.Context) (time.Time, error) { return c.Now(), nil }

func (c *fakeClock) Set(at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.base, c.setAt = at, time.Now()
}

func (c *fakeClock) Reads() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// observed collects WithObserver calls.
type observed struct {
	mu  sync.Mutex
	got []string // "app/name@scheduled_at=result"
}

func (o *observed) observe(s schedule.Spec, at time.Time, r Result) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.got = append(o.got, s.App+"/"+s.Name+"@"+schedule.FormatAt(at)+"="+r.String())
}

func (o *observed) list() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.got)
}

func (o *observed) count(suffix string) int {
	n := 0
	for _, g := range o.list() {
		if strings.HasSuffix(g, suffix) {
			n++
		}
	}
	return n
}

// run starts s.Run and returns a function that stops it and returns Run's
// error. It also stops at test cleanup.
func run(t *testing.T, s *Scheduler) (stop func() error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var once sync.Once
	var err error
	stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				err = errors.New("Run did not return within 10s of cancel")
			}
		})
		return err
	}
	t.Cleanup(func() {
		if err := stop(); err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return stop
}

// fast holds the options that shrink every timing for tests.
func fast(clock *fakeClock, obs *observed, logs *testutil.Buffer) []Option {
	opts := []Option{
		WithClock(clock.Now), WithNow(clock.ServerNow),
		WithPublishBackoff([]time.Duration{time.Millisecond, 2 * time.Millisecond}),
		WithPublishTimeout(time.Second),
		WithOutboxInterval(20 * time.Millisecond),
		WithMaxSleep(2 * time.Millisecond),
		WithObserver(obs.observe),
	}
	if logs != nil {
		opts = append(opts, WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))))
	} else {
		opts = append(opts, WithLogger(slog.New(slog.DiscardHandler)))
	}
	return opts
}

func newScheduler(t *testing.T, c rueidis.Client, stream string, specs []schedule.Spec, opts ...Option) *Scheduler {
	t.Helper()
	s, err := New(newPublisher(t, c, stream), specs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func every5(t *testing.T) schedule.Spec {
	return schedule.Spec{App: redistest.Name(t, "app"), Name: "every5", Handler: "h.run", Cron: cron.MustParse("*/5 * * * *", nil)}
}

// Three workers evaluate the same schedule and reach the same occurrence at
// the same moment: one stream entry, one Published, two Duplicates.
func TestSchedulersRace(t *testing.T) {
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	due := mustTime(t, "2026-03-10T12:05:00Z")
	obs := &observed{}
	var stops []func() error
	for range 3 {
		clock := newFakeClock(due.Add(-100 * time.Millisecond))
		s := newScheduler(t, redistest.Client(t), stream, []schedule.Spec{spec},
			append(fast(clock, obs, nil), WithStateDir(t.TempDir()), WithCatchUpWindow(0))...)
		stops = append(stops, run(t, s))
	}
	testutil.WaitFor(t, 30*time.Second, "three outcomes", func() bool { return len(obs.list()) >= 3 })
	for _, stop := range stops {
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	}
	if p, d := obs.count("=published"), obs.count("=duplicate"); p != 1 || d != 2 || len(obs.list()) != 3 {
		t.Fatalf("outcomes %v: want exactly 1 published and 2 duplicates", obs.list())
	}
	c := redistest.Client(t)
	es := entries(t, c, stream)
	if got := scheduledAts(t, es); len(got) != 1 || got[0] != "2026-03-10T12:05:00Z" {
		t.Fatalf("stream holds %v, want one entry for 2026-03-10T12:05:00Z", got)
	}
	env, err := schedule.DecodeEnvelope([]byte(es[0].Fields["event"]))
	if err != nil {
		t.Fatal(err)
	}
	if err := env.Validate(spec); err != nil {
		t.Errorf("published envelope does not validate: %v", err)
	}
	checkDedupTTL(t, c, keysFor(stream, spec, due))
}

// A scheduler started after several missed firings publishes only the
// latest one within 24h, and nothing for a schedule whose latest firing is
// older than that.
func TestCatchUp(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	app := redistest.Name(t, "app")
	yearly := schedule.Spec{App: app, Name: "yearly", Handler: "h.y", Cron: cron.MustParse("0 0 1 1 *", nil)} // last fired 68 days ago
	tenMin := schedule.Spec{App: app, Name: "ten", Handler: "h.t", Cron: cron.MustParse("*/10 * * * *", nil)} // fired 150 times in 24h
	daily := schedule.Spec{App: app, Name: "daily", Handler: "h.d", Cron: cron.MustParse("0 13 * * *", nil)}  // fired 23h35m ago
	stale := schedule.Spec{App: app, Name: "stale", Handler: "h.s", Cron: cron.MustParse("30 12 9 3 *", nil)} // fired 24h04m56s ago
	now := mustTime(t, "2026-03-10T12:34:56Z")
	obs := &observed{}
	clock := newFakeClock(now)
	s := newScheduler(t, c, stream, []schedule.Spec{yearly, tenMin, stale, daily}, append(fast(clock, obs, nil), WithStateDir(t.TempDir()))...)
	stop := run(t, s)
	// Catch-up handles the schedules in order, so once the last one is
	// reported, all are.
	testutil.WaitFor(t, 10*time.Second, "catch-up of the daily schedule", func() bool { return obs.count("/daily@2026-03-09T13:00:00Z=published") == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	want := []string{app + "/ten@2026-03-10T12:30:00Z=published", app + "/daily@2026-03-09T13:00:00Z=published"}
	if got := obs.list(); !slices.Equal(got, want) {
		t.Fatalf("outcomes %v, want %v", got, want)
	}
	if got := scheduledAts(t, entries(t, c, stream)); !slices.Equal(got, []string{"2026-03-10T12:30:00Z", "2026-03-09T13:00:00Z"}) {
		t.Fatalf("stream holds %v", got)
	}

	// A restart catches up the same occurrences again: duplicates only.
	obs2 := &observed{}
	s2 := newScheduler(t, c, stream, []schedule.Spec{yearly, tenMin, stale, daily}, append(fast(newFakeClock(now.Add(time.Minute)), obs2, nil), WithStateDir(t.TempDir()))...)
	stop2 := run(t, s2)
	testutil.WaitFor(t, 10*time.Second, "second catch-up", func() bool { return len(obs2.list()) == 2 })
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if d := obs2.count("=duplicate"); d != 2 {
		t.Fatalf("restart outcomes %v, want 2 duplicates", obs2.list())
	}
	if n := len(entries(t, c, stream)); n != 2 {
		t.Fatalf("XLEN = %d after the restart, want still 2", n)
	}
}

// By default the Scheduler decides by the Redis server's TIME, not its
// local clock: with a local clock an hour fast, catch-up still publishes
// the minute the server is in.
func TestCatchUpUsesServerTime(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	spec := schedule.Spec{App: redistest.Name(t, "app"), Name: "minutely", Handler: "h.m", Cron: cron.MustParse("* * * * *", nil)}
	pub := newPublisher(t, c, stream)
	before, err := pub.ServerTime(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	obs := &observed{}
	s, err := New(pub, []schedule.Spec{spec}, WithStateDir(t.TempDir()), WithObserver(obs.observe),
		WithLogger(slog.New(slog.DiscardHandler)),
		WithClock(func() time.Time { return time.Now().Add(time.Hour) }))
	if err != nil {
		t.Fatal(err)
	}
	stop := run(t, s)
	testutil.WaitFor(t, 10*time.Second, "catch-up", func() bool { return len(obs.list()) >= 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	after, err := pub.ServerTime(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	got := scheduledAts(t, entries(t, c, stream))
	// The minute boundary may pass while the test runs: the first entry is
	// one of the minutes the server was in.
	lo, hi := schedule.FormatAt(before.Truncate(time.Minute)), schedule.FormatAt(after.Truncate(time.Minute))
	if len(got) == 0 || (got[0] != lo && got[0] != hi) {
		t.Fatalf("published %v, want the server's current minute (%s or %s)", got, lo, hi)
	}
}

// With Redis down, a due occurrence goes to the outbox after its retries. A
// new Scheduler on the same state directory, once Redis is back, publishes
// it exactly once and empties the outbox.
func TestOutboxSurvivesRestart(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{AppendOnly: true})
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	due := mustTime(t, "2026-03-10T12:05:00Z")
	state := t.TempDir()
	outboxDir := filepath.Join(state, OutboxDir)

	c1 := redistest.Connect(t, srv.Addr)
	srv.Stop()
	obs1 := &observed{}
	logs := &testutil.Buffer{}
	s1 := newScheduler(t, c1, stream, []schedule.Spec{spec},
		append(fast(newFakeClock(due.Add(-50*time.Millisecond)), obs1, logs), WithStateDir(state), WithCatchUpWindow(0))...)
	stop1 := run(t, s1)
	testutil.WaitFor(t, 10*time.Second, "the occurrence to be outboxed", func() bool { return obs1.count("=outboxed") == 1 })
	if err := stop1(); err != nil {
		t.Fatal(err)
	}
	// Three attempts (two backoff waits), each logged, then the outbox.
	if n := strings.Count(logs.String(), "schedule publish failed; retrying"); n != 2 {
		t.Errorf("%d retry warnings, want 2:\n%s", n, logs)
	}
	files := outboxFiles(t, outboxDir)
	if len(files) != 1 {
		t.Fatalf("outbox holds %v, want one file", files)
	}
	if !strings.Contains(logs.String(), files[0]) {
		t.Errorf("the outbox warning does not name the file %s:\n%s", files[0], logs)
	}

	srv.Restart(t)
	c2 := redistest.Connect(t, srv.Addr)
	obs2 := &observed{}
	// Catch-up off: only the outbox can publish the occurrence.
	s2 := newScheduler(t, c2, stream, []schedule.Spec{spec},
		append(fast(newFakeClock(due.Add(time.Minute)), obs2, nil), WithStateDir(state), WithCatchUpWindow(0))...)
	stop2 := run(t, s2)
	testutil.WaitFor(t, 10*time.Second, "the outbox to publish", func() bool { return obs2.count("=published") == 1 })
	testutil.WaitFor(t, 10*time.Second, "an empty outbox", func() bool { return len(outboxFiles(t, outboxDir)) == 0 })
	if err := stop2(); err != nil {
		t.Fatal(err)
	}
	if got := scheduledAts(t, entries(t, c2, stream)); !slices.Equal(got, []string{"2026-03-10T12:05:00Z"}) {
		t.Fatalf("stream holds %v, want exactly the outboxed occurrence", got)
	}
	if got := obs2.list(); len(got) != 1 {
		t.Fatalf("outcomes %v, want one", got)
	}
	checkDedupTTL(t, c2, keysFor(stream, spec, due))
}

// A running Scheduler retries its outbox until Redis comes back.
func TestOutboxRetriedWhileRunning(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	due := mustTime(t, "2026-03-10T12:05:00Z")
	state := t.TempDir()
	c := redistest.Connect(t, srv.Addr)
	srv.Stop()
	obs := &observed{}
	s := newScheduler(t, c, stream, []schedule.Spec{spec},
		append(fast(newFakeClock(due.Add(-50*time.Millisecond)), obs, nil), WithStateDir(state), WithCatchUpWindow(0))...)
	stop := run(t, s)
	testutil.WaitFor(t, 10*time.Second, "the occurrence to be outboxed", func() bool { return obs.count("=outboxed") == 1 })
	srv.Restart(t)
	testutil.WaitFor(t, 20*time.Second, "the outbox retry to publish", func() bool { return obs.count("=published") == 1 })
	testutil.WaitFor(t, 10*time.Second, "an empty outbox", func() bool { return len(outboxFiles(t, filepath.Join(state, OutboxDir))) == 0 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := scheduledAts(t, entries(t, c, stream)); !slices.Equal(got, []string{"2026-03-10T12:05:00Z"}) {
		t.Fatalf("stream holds %v", got)
	}
}

// An occurrence still being retried when Run is stopped goes to the outbox.
func TestShutdownKeepsRetryingOccurrence(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	due := mustTime(t, "2026-03-10T12:05:00Z")
	state := t.TempDir()
	c := redistest.Connect(t, srv.Addr)
	srv.Stop()
	obs := &observed{}
	logs := &testutil.Buffer{}
	s := newScheduler(t, c, stream, []schedule.Spec{spec},
		append(fast(newFakeClock(due.Add(-50*time.Millisecond)), obs, logs), WithStateDir(state), WithCatchUpWindow(0),
			WithPublishBackoff([]time.Duration{time.Hour}))...)
	stop := run(t, s)
	testutil.WaitFor(t, 10*time.Second, "the first failed attempt", func() bool { return strings.Contains(logs.String(), "retrying") })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := obs.list(); len(got) != 1 || !strings.HasSuffix(got[0], "=outboxed") {
		t.Fatalf("outcomes %v, want the occurrence outboxed", got)
	}
	if files := outboxFiles(t, filepath.Join(state, OutboxDir)); len(files) != 1 {
		t.Fatalf("outbox holds %v, want one file", files)
	}
}

// DST in a live Scheduler with real zones (2026 transitions): a skipped
// wall time fires once, at the jump; a repeated one fires once, the first
// time, and not when the wall clock passes it again.
func TestSchedulerDST(t *testing.T) {
	for _, c := range []struct {
		name, zone, cron string
		start            string // clock start, just before the first firing
		first            string
		repeat           string // the instant the wall time repeats (fall back), or ""
		nextDay          string
	}{
		{name: "new york spring forward", zone: "America/New_York", cron: "30 2 * * *",
			start: "2026-03-08T06:59:59.900Z", first: "2026-03-08T07:00:00Z"}, // 02:30 skipped → 03:00 EDT
		{name: "berlin spring forward", zone: "Europe/Berlin", cron: "30 2 * * *",
			start: "2026-03-29T00:59:59.900Z", first: "2026-03-29T01:00:00Z"}, // 02:30 skipped → 03:00 CEST
		{name: "lord howe spring forward", zone: "Australia/Lord_Howe", cron: "15 2 * * *",
			start: "2026-10-03T15:29:59.900Z", first: "2026-10-03T15:30:00Z"}, // 02:15 skipped → 02:30 +11
		{name: "new york fall back", zone: "America/New_York", cron: "30 1 * * *",
			start: "2026-11-01T05:29:59.900Z", first: "2026-11-01T05:30:00Z", // 01:30 EDT
			repeat: "2026-11-01T06:30:00Z", nextDay: "2026-11-02T06:30:00Z"}, // 01:30 EST
		{name: "berlin fall back", zone: "Europe/Berlin", cron: "30 2 * * *",
			start: "2026-10-25T00:29:59.900Z", first: "2026-10-25T00:30:00Z", // 02:30 CEST
			repeat: "2026-10-25T01:30:00Z", nextDay: "2026-10-26T01:30:00Z"}, // 02:30 CET
		{name: "lord howe fall back", zone: "Australia/Lord_Howe", cron: "45 1 * * *",
			start: "2026-04-04T14:44:59.900Z", first: "2026-04-04T14:45:00Z", // 01:45 +11
			repeat: "2026-04-04T15:15:00Z", nextDay: "2026-04-05T15:15:00Z"}, // 01:45 +10:30
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := redistest.Client(t)
			stream := redistest.Name(t, "stream")
			spec := schedule.Spec{App: redistest.Name(t, "app"), Name: "dst", Handler: "h.d", Cron: cron.MustParse(c.cron, mustZone(t, c.zone))}
			obs := &observed{}
			clock := newFakeClock(mustTime(t, c.start))
			stop := run(t, newScheduler(t, cl, stream, []schedule.Spec{spec}, append(fast(clock, obs, nil), WithCatchUpWindow(0))...))
			testutil.WaitFor(t, 10*time.Second, "the first firing", func() bool { return len(obs.list()) >= 1 })
			want := []string{c.first}
			if c.repeat != "" {
				// Let the Scheduler watch its clock pass the repeated wall
				// time, then move on to the next day's firing.
				repeat := mustTime(t, c.repeat)
				clock.Set(repeat.Add(-100 * time.Millisecond))
				testutil.WaitFor(t, 10*time.Second, "the clock to pass the repeated wall time", func() bool {
					return clock.Peek().After(repeat.Add(100 * time.Millisecond))
				})
				reads := clock.Reads()
				testutil.WaitFor(t, 10*time.Second, "the scheduler to read the clock", func() bool { return clock.Reads() > reads+5 })
				clock.Set(mustTime(t, c.nextDay).Add(-100 * time.Millisecond))
				testutil.WaitFor(t, 10*time.Second, "the next day's firing", func() bool { return len(obs.list()) >= 2 })
				want = append(want, c.nextDay)
			}
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			if got := scheduledAts(t, entries(t, cl, stream)); !slices.Equal(got, want) {
				t.Fatalf("stream holds %v, want %v", got, want)
			}
		})
	}
}

// After a clock step over several firings (a suspended host), only the
// latest missed firing is published, as at startup.
func TestSchedulerFellBehind(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	obs := &observed{}
	logs := &testutil.Buffer{}
	clock := newFakeClock(mustTime(t, "2026-03-10T12:04:59.900Z"))
	stop := run(t, newScheduler(t, c, stream, []schedule.Spec{spec}, append(fast(clock, obs, logs), WithCatchUpWindow(0))...))
	testutil.WaitFor(t, 10*time.Second, "12:05", func() bool { return len(obs.list()) >= 1 })
	clock.Set(mustTime(t, "2026-03-10T12:31:00Z"))
	testutil.WaitFor(t, 10*time.Second, "the latest missed firing", func() bool { return len(obs.list()) >= 2 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := scheduledAts(t, entries(t, c, stream)); !slices.Equal(got, []string{"2026-03-10T12:05:00Z", "2026-03-10T12:30:00Z"}) {
		t.Fatalf("stream holds %v, want 12:05 and 12:30 only", got)
	}
	if !strings.Contains(logs.String(), "first_missed=2026-03-10T12:10:00Z") {
		t.Errorf("no fell-behind warning naming 12:10:\n%s", logs)
	}
}

func TestStateDirNotWritable(t *testing.T) {
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(file, "state") // below a regular file: unusable even for root
	s := newScheduler(t, redistest.Client(t), redistest.Name(t, "stream"), []schedule.Spec{every5(t)}, WithStateDir(state))
	err := s.Run(t.Context())
	if err == nil {
		t.Fatal("Run with an unusable state directory: no error")
	}
	for _, want := range []string{state, "--state-dir", "RELAY_STATE_DIR"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// A corrupt outbox file is logged with its path and moved aside; the valid
// records beside it are published.
func TestOutboxCorruptFile(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	state := t.TempDir()
	dir := filepath.Join(state, OutboxDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(dir, "broken.json")
	if err := os.WriteFile(corrupt, []byte(`{"source":"relay.schedule","app":`), 0o600); err != nil {
		t.Fatal(err)
	}
	at := mustTime(t, "2026-03-10T11:55:00Z")
	if _, err := (&outbox{dir: dir}).put(schedule.NewEnvelope(spec, at)); err != nil {
		t.Fatal(err)
	}
	obs := &observed{}
	logs := &testutil.Buffer{}
	stop := run(t, newScheduler(t, c, stream, []schedule.Spec{spec},
		append(fast(newFakeClock(mustTime(t, "2026-03-10T12:01:00Z")), obs, logs), WithStateDir(state), WithCatchUpWindow(0))...))
	testutil.WaitFor(t, 10*time.Second, "the valid record", func() bool { return obs.count("=published") == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got := outboxFiles(t, dir); !slices.Equal(got, []string{"broken.json.corrupt"}) {
		t.Fatalf("outbox holds %v, want only the corrupt file, moved aside", got)
	}
	if !strings.Contains(logs.String(), corrupt) || !strings.Contains(logs.String(), "moved aside") {
		t.Errorf("no log naming %s:\n%s", corrupt, logs)
	}
	if got := scheduledAts(t, entries(t, c, stream)); !slices.Equal(got, []string{"2026-03-10T11:55:00Z"}) {
		t.Fatalf("stream holds %v", got)
	}
}

// With no schedules, Run still serves the outbox and blocks until stopped.
func TestRunWithoutSchedules(t *testing.T) {
	c := redistest.Client(t)
	stream := redistest.Name(t, "stream")
	state := t.TempDir()
	obs := &observed{}
	s := newScheduler(t, c, stream, nil, append(fast(newFakeClock(mustTime(t, "2026-03-10T12:00:00Z")), obs, nil), WithStateDir(state))...)
	stop := run(t, s)
	// A record arriving while it runs is published by the periodic retry,
	// which shows Run is alive; the observer gets what the record knows.
	gone := schedule.Spec{App: redistest.Name(t, "gone"), Name: "old", Handler: "h.o"}
	dir := filepath.Join(state, OutboxDir)
	if err := os.MkdirAll(dir, 0o700); err != nil { // Run may not have made it yet
		t.Fatal(err)
	}
	if _, err := (&outbox{dir: dir}).put(schedule.NewEnvelope(gone, mustTime(t, "2026-03-10T11:00:00Z"))); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the outbox record", func() bool { return len(obs.list()) == 1 })
	if got := obs.list()[0]; got != gone.App+"/old@2026-03-10T11:00:00Z=published" {
		t.Errorf("outcome %s", got)
	}
	if err := s.Run(t.Context()); !errors.Is(err, ErrRunning) {
		t.Errorf("second Run = %v, want ErrRunning", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil after cancel", err)
	}
}

// Without a state directory the outbox lives in memory and is still
// retried while Run runs.
func TestMemoryOutbox(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	stream := redistest.Name(t, "stream")
	spec := every5(t)
	due := mustTime(t, "2026-03-10T12:05:00Z")
	c := redistest.Connect(t, srv.Addr)
	srv.Stop()
	obs := &observed{}
	stop := run(t, newScheduler(t, c, stream, []schedule.Spec{spec},
		append(fast(newFakeClock(due.Add(-50*time.Millisecond)), obs, nil), WithCatchUpWindow(0))...))
	testutil.WaitFor(t, 10*time.Second, "the occurrence to be outboxed", func() bool { return obs.count("=outboxed") == 1 })
	srv.Restart(t)
	testutil.WaitFor(t, 20*time.Second, "the outbox retry", func() bool { return obs.count("=published") == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if n := len(entries(t, c, stream)); n != 1 {
		t.Fatalf("XLEN = %d, want 1", n)
	}
}

func TestNewRejects(t *testing.T) {
	pub := newPublisher(t, redistest.Client(t), "s")
	ok := schedule.Spec{App: "a", Name: "n", Handler: "h", Cron: cron.MustParse("@daily", nil)}
	for name, c := range map[string]struct {
		specs []schedule.Spec
		opts  []Option
		want  string
	}{
		"duplicate schedule": {[]schedule.Spec{ok, ok}, nil, "schedule a/n is listed twice"},
		"empty handler":      {[]schedule.Spec{{App: "a", Name: "n", Cron: cron.MustParse("@daily", nil)}}, nil, "app, name and handler must not be empty"},
		"no cron":            {[]schedule.Spec{{App: "a", Name: "n", Handler: "h"}}, nil, "schedule a/n has no Cron"},
		"negative window":    {[]schedule.Spec{ok}, []Option{WithCatchUpWindow(-time.Second)}, "WithCatchUpWindow: must be >= 0"},
		"zero backoff wait":  {[]schedule.Spec{ok}, []Option{WithPublishBackoff([]time.Duration{time.Second, 0})}, "WithPublishBackoff: wait 1 is 0s, must be > 0"},
		"empty state dir":    {[]schedule.Spec{ok}, []Option{WithStateDir("")}, "WithStateDir: directory must not be empty"},
		"nil option":         {[]schedule.Spec{ok}, []Option{nil}, "nil Option"},
		"nil clock":          {[]schedule.Spec{ok}, []Option{WithClock(nil)}, "WithClock"},
		"zero interval":      {[]schedule.Spec{ok}, []Option{WithOutboxInterval(0)}, "WithOutboxInterval: must be > 0"},
	} {
		_, err := New(pub, c.specs, c.opts...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", name, err, c.want)
		}
	}
	if _, err := New(nil, nil); err == nil {
		t.Error("nil Publisher: no error")
	}
}

func outboxFiles(t *testing.T, dir string) []string {
	t.Helper()
	des, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, de := range des {
		names = append(names, de.Name())
	}
	return names
}
