package console_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// slowApp has two slots; its handler hangs (a Go function that ignores
// its context, as a container the runtime fails to kill) past a short
// timeout. fastApp succeeds, badApp is dead-lettered at once.
const (
	slowApp = "image: x\nconcurrency: 2\nevents:\n  - {handler: jobs.work, pattern: {kind: [work]}, timeout: %s, retries: 1}\n"
	fastApp = "image: x\nevents:\n  - {handler: users.sync, pattern: {kind: [user]}}\n"
	badApp  = "image: x\nevents:\n  - {handler: orders.charge, pattern: {kind: [order]}, retries: 0}\n"
)

// hangingRunner runs slow/jobs.work until release is closed, whatever its
// context says; the other handlers end at once.
func hangingRunner() (relay.Runner, chan struct{}) {
	release := make(chan struct{})
	hang := func(context.Context, runtime.Request) error { <-release; return nil }
	return runtime.NewFunc(map[string]runtime.HandlerFunc{
		"slow/jobs.work":    hang,
		"fast/users.sync":   func(context.Context, runtime.Request) error { return nil },
		"bad/orders.charge": func(context.Context, runtime.Request) error { return fmt.Errorf("payment provider unreachable") },
	}), release
}

// outageWorker runs a worker of apps on rc until the test ends, closing
// release first so that the hung handlers end.
func outageWorker(t *testing.T, rc rueidis.Client, streamName, apps string, runner relay.Runner, release chan struct{}) {
	t.Helper()
	w, err := worker.New(worker.Config{Redis: rc, Streams: []string{streamName}, Group: "shop", Consumer: "worker-1",
		Apps: template.Dir(apps), Runner: runner, StateDir: t.TempDir(),
		Engine: relay.Config{Logger: slog.New(slog.DiscardHandler), StatsInterval: 50 * time.Millisecond, MinPendingIdle: 500 * time.Millisecond,
			ReclaimInterval: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w)
	t.Cleanup(func() { close(release) })
}

// status reads worker-1's status of streamName; false when it has none.
func status(t *testing.T, rc rueidis.Client, streamName string) (stats.WorkerStatus, bool) {
	ws, err := redisstats.ReadStatus(t.Context(), rc, streamName, "shop", time.Now())
	if err != nil || len(ws) != 1 {
		return stats.WorkerStatus{}, false
	}
	return ws[0], true
}

// TestBrowserHungHandler is a handler that hangs past its timeout and
// holds both slots of its app while a third message waits: the overview
// shows a stall banner naming each attempt, how long it has run and its
// timeout, and the app's full slots with the message waiting; its
// Running table and the Pending page say how long each attempt has run
// and that the third message waits for a slot.
func TestBrowserHungHandler(t *testing.T) {
	b := tab{t, browser(t)}
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "events")
	apps := testutil.AppsRoot(t, map[string]string{"slow": fmt.Sprintf(slowApp, "300ms")})
	runner, release := hangingRunner()
	outageWorker(t, rc, streamName, apps, runner, release)
	srv, err := console.New(console.Config{Redis: rc, Streams: []string{streamName}, Group: "shop", Apps: template.Dir(apps),
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	src := redisstream.New(rc, streamName, "shop", "producer")
	var ids []string
	for i := range 3 {
		id, err := src.Publish(t.Context(), map[string]string{"event": fmt.Sprintf(`{"kind":"work","n":%d}`, i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	testutil.WaitFor(t, 30*time.Second, "two attempts past their timeout holding both slots", func() bool {
		st, ok := status(t, rc, streamName)
		if !ok || len(st.Running) != 2 || st.Slots == nil {
			return false
		}
		slots, _ := st.Slots.App("slow")
		return st.Running[0].PastTimeout(time.Now()) && st.Running[1].PastTimeout(time.Now()) && slots.InUse == 2 && slots.Limit == 2
	})

	b.run("the overview", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`.stall-banner`)))
	banner := b.text(`.stall-banner`)
	for _, want := range []string{"Handlers are stalled", "slow/jobs.work on worker-1 has run for ", "past its 300ms timeout",
		"the runtime did not stop it", "app slow: all 2 slots taken on worker-1", "1 other message pending: queued work waits for a slot"} {
		if !strings.Contains(banner, want) {
			t.Errorf("stall banner lacks %q:\n%s", want, banner)
		}
	}
	if n := b.count(`table.runs tbody tr.stalled`); n != 2 {
		t.Errorf("%d stalled rows in the Running table, want 2", n)
	}
	if got := b.text(`table.slots`); !regexp.MustCompile(`worker-1\s+slow\s+2 of 2\s+2 of 8\s+full`).MatchString(got) {
		t.Errorf("slots table:\n%s", got)
	}
	if got := b.text(`table.runs tbody tr:first-child .run-for`); !regexp.MustCompile(`^[0-9.]+m?s$`).MatchString(got) {
		t.Errorf("running for %q", got)
	}
	b.shot("hung-overview")

	b.run("pending", chromedp.Navigate(hs.URL+"/pending?stream="+url.QueryEscape(streamName)), chromedp.WaitVisible(chromedp.CSS(`table.pending`)))
	page := b.text(`table.pending`)
	if n := strings.Count(page, "past its timeout"); n != 2 || !strings.Contains(page, "running for ") || !strings.Contains(page, "(timeout 300ms) on worker-1") {
		t.Errorf("pending page does not say how long the attempts ran:\n%s", page)
	}
	if !strings.Contains(page, "slow on worker-1: 2 of 2 slots taken") && !strings.Contains(page, "app slow's concurrency is full on worker-1: 2 of 2 slots taken") {
		t.Errorf("pending page does not say the third message waits for a slot:\n%s", page)
	}
	if n := b.count(`.slots-full`); n != 1 {
		t.Errorf("%d messages marked waiting for a slot, want 1 of %v", n, ids)
	}
	b.shot("hung-pending")
}

// TestBrowserRedisLostData stops Redis under a running worker and starts
// it again empty, while two hung attempts hold both slots of their app:
// the overview says that Redis lost data (the worker created the group
// again), flags both attempts "message lost" with the slots they hold,
// shows no negative rate though every counter went back to 0, and its
// memory card shows what Redis holds now, not what it held before.
func TestBrowserRedisLostData(t *testing.T) {
	b := tab{t, browser(t)}
	srv := redistest.Start(t, redistest.Options{})
	workerRC := redistest.Connect(t, srv.Addr)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, RetryDelay: console.RetryDelay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	streamName := redistest.Name(t, "events")
	apps := testutil.AppsRoot(t, map[string]string{"slow": fmt.Sprintf(slowApp, "10m"), "fast": fastApp, "bad": badApp})
	runner, release := hangingRunner()
	outageWorker(t, workerRC, streamName, apps, runner, release)
	c, err := console.New(console.Config{Redis: rc, Streams: []string{streamName}, Group: "shop", Apps: template.Dir(apps),
		SampleInterval: 50 * time.Millisecond, DLQRetention: 336 * time.Hour, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(c)
	defer hs.Close()

	publish := func(events ...string) {
		t.Helper()
		src := redisstream.New(rc, streamName, "shop", "producer")
		for _, ev := range events {
			if _, err := src.Publish(t.Context(), map[string]string{"event": ev}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var before []string
	for i := range 40 {
		before = append(before, fmt.Sprintf(`{"kind":"order","n":%d}`, i), fmt.Sprintf(`{"kind":"user","n":%d}`, i))
	}
	publish(append(before, `{"kind":"work","n":1}`, `{"kind":"work","n":2}`)...)
	store := redisdlq.NewStore(rc, streamName)
	testutil.WaitFor(t, 30*time.Second, "40 dead letters and two hung attempts", func() bool {
		n, _ := store.Len(t.Context())
		st, ok := status(t, rc, streamName)
		return n == 40 && ok && len(st.Running) == 2
	})
	// The console samples counters already counting: the oldest sample is
	// above what the counters restart from.
	sctx, stopSampling := context.WithCancel(t.Context())
	defer stopSampling()
	go c.Sample(sctx)
	b.run("the overview before", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`table.memory-parts`)))
	if got := b.text(`table.memory-parts tbody tr:nth-child(2) td:nth-child(3)`); got != "40" {
		t.Fatalf("dead-letter stream items before the restart: %q, want 40", got)
	}

	srv.Stop()
	srv.Restart(t)
	publish(`{"kind":"user","n":100}`, `{"kind":"user","n":101}`, `{"kind":"user","n":102}`)
	testutil.WaitFor(t, 30*time.Second, "the worker to report the group recreated and both attempts lost", func() bool {
		st, ok := status(t, rc, streamName)
		if !ok || st.GroupRecreations != 1 || len(st.Running) != 2 {
			return false
		}
		c, err := redisstats.Read(t.Context(), rc, streamName, "shop")
		return st.Running[0].Lost && st.Running[1].Lost && err == nil && c.Received >= 3
	})
	// Samples of the new counters over more than the rate's span.
	testutil.WaitFor(t, 30*time.Second, "the sampler to read the new counters", func() bool {
		b.run("reload", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`table.counters`)))
		return b.text(`table.counters tbody tr:first-child td:nth-child(2)`) == "3"
	})

	b.run("the overview after", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`table.memory-parts`)))
	// The counters went back to 0 with Redis: no rate may be negative.
	for i := 1; i <= b.count(`table.counters tbody tr`); i++ {
		rate := b.text(fmt.Sprintf(`table.counters tbody tr:nth-child(%d) td:nth-child(3)`, i))
		if strings.HasPrefix(rate, "-") || strings.HasPrefix(rate, "\u2212") {
			t.Errorf("counter %d has a negative rate %q after the reset", i, rate)
		}
	}
	// The memory card shows what Redis holds now.
	if got := b.text(`table.memory-parts tbody tr:nth-child(2) td:nth-child(3)`); got != "0" {
		t.Errorf("dead-letter stream items after the restart: %q, want 0 (the measurement from before is stale)", got)
	}
	if got := b.text(`table.memory-parts tbody tr:first-child td:nth-child(3)`); got != "3" {
		t.Errorf("source stream items after the restart: %q, want 3", got)
	}
	// The loss, and the attempts still running for lost messages.
	if b.count(`.loss-banner`) != 1 {
		t.Errorf("no data-loss banner:\n%s", b.text(`main`))
	} else if got := b.text(`.loss-banner`); !strings.Contains(got, "Redis lost data") || !strings.Contains(got, "worker-1 created consumer group shop again from id 0 at ") ||
		!strings.Contains(got, "the entries still in the stream are delivered again") {
		t.Errorf("data-loss banner:\n%s", got)
	}
	if n := b.count(`table.runs tbody tr.lost`); n != 2 {
		t.Errorf("%d runs flagged lost, want 2", n)
	} else if got := b.text(`table.runs`); strings.Count(got, "message lost Redis no longer has it pending") != 2 {
		t.Errorf("running table:\n%s", got)
	}
	if b.count(`table.slots`) != 1 || !strings.Contains(b.text(`table.slots`), "2 slots held by runs whose message is lost") {
		t.Errorf("no slots held by the lost runs shown")
	}
	if b.count(`.stall-banner`) != 1 || strings.Count(b.text(`.stall-banner`), "which Redis no longer has pending for worker-1") != 2 {
		t.Errorf("no stall banner naming both lost attempts")
	}
	b.shot("redis-lost-data")

	b.run("pending", chromedp.Navigate(hs.URL+"/pending?stream="+url.QueryEscape(streamName)), chromedp.WaitVisible(chromedp.CSS(`main p`)))
	if b.count(`.lost-runs`) != 1 {
		t.Errorf("the pending page does not show the attempts running for lost messages:\n%s", b.text(`main`))
	} else if got := b.text(`.lost-runs`); strings.Count(got, "message lost Redis no longer has it pending") != 2 || !strings.Contains(got, "it holds a slot of app slow") {
		t.Errorf("pending page, lost runs:\n%s", got)
	}
	b.shot("redis-lost-data-pending")
}

// TestBrowserFiguresAgree: the memory card shows the dead-letter rate
// that drives its projection beside the event rate (a burst of dead
// letters and no events), and the counters' rate per minute is the
// current one: it falls back to 0 once a burst is over, where the
// window's average would still show it.
func TestBrowserFiguresAgree(t *testing.T) {
	b := tab{t, browser(t)}
	f := consoletest.New(t, func(c *console.Config) { c.SampleInterval = 20 * time.Millisecond })
	f.WriteDLQ(200, func(i int) (string, string, string, string) {
		return "shop", "orders.charge", "handler exited with code 3", fmt.Sprintf(`{"kind":"order","n":%d}`, i)
	})
	sctx, stopSampling := context.WithCancel(t.Context())
	defer stopSampling()
	go f.Server.Sample(sctx)
	points := func() int {
		b.run("reload", chromedp.Navigate(f.HTTP.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`table.counters`)))
		return eval[int](b, "sparkline points", `(function(){var p=document.querySelector("table.counters polyline");return p?p.getAttribute("points").split(" ").length:0})()`)
	}
	testutil.WaitFor(t, 30*time.Second, "a sparkline", func() bool { return points() >= 2 })
	rec := redisstats.NewRecorder(f.Redis, f.Stream, f.Group)
	for range 600 {
		rec.Add(stats.Received)
	}
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	from := points()
	testutil.WaitFor(t, 30*time.Second, "ten samples after the burst", func() bool { return points() >= from+10 })

	if got := b.text(`table.counters tbody tr:first-child td:nth-child(2)`); got != "600" {
		t.Errorf("received %q, want 600", got)
	}
	if got := b.text(`table.counters tbody tr:first-child td:nth-child(3)`); got != "0.0" {
		t.Errorf("received per min %q once the burst is over, want 0.0 (the current rate)", got)
	}
	if got := b.text(`.memory .tiles`); !strings.Contains(got, "EVENTS/S\n0.0") && !strings.Contains(got, "events/s\n0.0") {
		t.Errorf("memory tiles:\n%s", got)
	}
	if got := b.text(`#dlq-rate .v`); got != "200.0" {
		t.Errorf("dead letters per hour %q, want 200.0: the rate the dead-letter projection assumes", got)
	}
	b.shot("figures")
}

// TestBrowserDeadLetterTriage is the triage of 2,020 dead letters: a
// reason filter passing 10 (5 of them past the 2,000 entries a page
// used to read) fills its page; an event-text filter shows each match in
// its event; replaying all 1,000 identical failures lists them as one
// reason, the newest first, as labelled; and the replays count on the
// overview and show on the Live page.
func TestBrowserDeadLetterTriage(t *testing.T) {
	b := tab{t, browser(t)}
	f := consoletest.New(t)
	quota := func(i int) bool { return i < 5 || i >= 2015 }
	ids := f.WriteDLQ(2020, func(i int) (string, string, string, string) {
		switch {
		case quota(i):
			return "shop", "refunds.run", "disk quota exceeded", fmt.Sprintf(`{"kind":"refund","note":"customer c_%d asked for the needle back","n":%d}`, i, i)
		case i%2 == 0 && i < 2005: // 6, 8, ..., 2004: 1,000 of them
			return "shop", "orders.charge", "handler exited with code 3", fmt.Sprintf(`{"kind":"order","n":%d}`, i)
		}
		return "shop", "refunds.run", "handler exited with code 3", fmt.Sprintf(`{"kind":"refund","n":%d}`, i)
	})
	s := url.QueryEscape(f.Stream)

	b.run("reason filter", chromedp.Navigate(f.HTTP.URL+"/dlq?stream="+s+"&reason=quota"), chromedp.WaitVisible(chromedp.CSS(`table.dlq`)))
	if got := b.text(`#dlq-count`); got != "10 entries match (of 2\u202f020)" {
		t.Errorf("heading %q", got)
	}
	if n := b.count(`table.dlq tbody tr`); n != 10 {
		t.Errorf("the page lists %d of the 10 matching entries, want all 10", n)
	}
	if got := b.text(`table.dlq tbody tr:last-child td:nth-child(2)`); got != ids[0] {
		t.Errorf("last row %s, want the oldest match %s", got, ids[0])
	}
	b.shot("dlq-filter-filled")

	b.run("text filter", chromedp.Navigate(f.HTTP.URL+"/dlq?stream="+s+"&text=NEEDLE"), chromedp.WaitVisible(chromedp.CSS(`table.dlq`)))
	if n := b.count(`table.dlq tbody tr .excerpt mark`); n != 10 {
		t.Errorf("%d rows show the match in their event, want 10", n)
	}
	if got := b.text(`table.dlq tbody tr:first-child .excerpt`); !strings.Contains(got, `customer c_2019 asked for the needle back`) {
		t.Errorf("excerpt %q", got)
	}
	b.shot("dlq-text-excerpt")

	// Replay all 1,000 identical failures of orders.charge.
	b.run("filter orders.charge", chromedp.Navigate(f.HTTP.URL+"/dlq?stream="+s+"&handler=orders.charge"), chromedp.WaitVisible(chromedp.CSS(`form.bulk`)))
	b.run("replay all matching", chromedp.Click(chromedp.CSS(`form.bulk button[value=replay]`)), chromedp.WaitVisible(chromedp.CSS(`#bulk-count`)))
	if got := b.text(`#bulk-count`); got != "1\u202f000" {
		t.Fatalf("confirmation count %q, want 1 000", got)
	}
	b.run("confirm", chromedp.Click(chromedp.CSS(`main form button`)), chromedp.WaitVisible(chromedp.CSS(`#job-heading`)))
	testutil.WaitFor(t, 120*time.Second, "the replay of all matching to finish", func() bool {
		b.run("reload the job", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#job-heading`)))
		return b.count(`.badge.good`) == 1
	})
	if got := b.text(`#job-heading`); got != "Replay all matching: 1000 of 1000 done, 0 replayed, 1000 kept" {
		t.Errorf("job heading %q", got)
	}
	if n := b.count(`table.kept tbody tr`); n != 1 {
		t.Errorf("%d rows of kept entries, want one reason:\n%s", n, b.text(`main`))
	}
	if got := b.text(`table.kept tbody tr:first-child td:first-child`); got != "1\u202f000" {
		t.Errorf("entries of the reason %q, want 1 000", got)
	}
	newest := ids[2004] // the newest orders.charge entry
	if got := b.text(`table.kept tbody tr:first-child td.ids a:first-child`); got != newest {
		t.Errorf("first entry listed %s, want the newest %s", got, newest)
	}
	if got := b.text(`table.kept tbody tr:first-child td.reason`); !strings.Contains(got, "handler exited with code 3") {
		t.Errorf("reason %q", got)
	}
	b.shot("bulk-job-grouped")

	// The replays count, and the Live page shows them.
	b.run("overview", chromedp.Navigate(f.HTTP.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`table.counters`)))
	if got := b.text(`table.counters`); !regexp.MustCompile(`replay failed\s+1\x{202f}000`).MatchString(got) {
		t.Errorf("counters:\n%s", got)
	}
	b.run("live", chromedp.Navigate(f.HTTP.URL+"/live?stream="+s), chromedp.WaitVisible(chromedp.CSS(`#feed tr`)))
	if n := b.count(`#feed tr.replay-failed`); n == 0 {
		t.Errorf("the Live page shows no replay:\n%s", b.text(`#feed`))
	}
	if got := b.text(`#feed tr:first-child`); !strings.Contains(got, "shop/orders.charge") || !strings.Contains(got, "replay-failed") {
		t.Errorf("newest outcome %q", got)
	}
	b.shot("live-replays")
	// Close the live feed before the console's server closes.
	b.run("leave", chromedp.Navigate("about:blank"))
}
