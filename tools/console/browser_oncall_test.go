package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// tab drives one browser tab with a deadline per step, and saves
// screenshots to RELAY_CONSOLE_SCREENSHOTS when it is set.
type tab struct {
	t   *testing.T
	ctx context.Context
}

func (b tab) step() (context.Context, context.CancelFunc) {
	return context.WithTimeout(b.ctx, 30*time.Second)
}

func (b tab) run(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := b.step()
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// eval runs js in the tab and returns its value; what names the step in a
// failure.
func eval[T any](b tab, what, js string) T {
	b.t.Helper()
	ctx, cancel := b.step()
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
	return v
}

func (b tab) text(sel string) string {
	b.t.Helper()
	// Read through a script rather than by node id: an id read just after
	// a navigation may belong to the document the browser has left.
	return eval[string](b, "read "+sel, `(function(){var e=document.querySelector(`+strconv.Quote(sel)+
		`);if(!e){throw new Error("no element")};return e.innerText})()`)
}

func (b tab) count(sel string) int {
	b.t.Helper()
	return eval[int](b, "count "+sel, `document.querySelectorAll(`+strconv.Quote(sel)+`).length`)
}

func (b tab) location() string {
	b.t.Helper()
	ctx, cancel := b.step()
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		b.t.Fatal(err)
	}
	return v
}

// waitURL waits until the tab's address holds part: the page a form
// submitted has replaced the one it was on.
func (b tab) waitURL(part string) {
	b.t.Helper()
	testutil.WaitFor(b.t, 30*time.Second, "the address to hold "+part, func() bool { return strings.Contains(b.location(), part) })
	b.run("the page at "+part, chromedp.WaitReady(chromedp.CSS(`body`)))
}

func (b tab) shot(name string) {
	b.t.Helper()
	dir := os.Getenv("RELAY_CONSOLE_SCREENSHOTS")
	if dir == "" {
		return
	}
	ctx, cancel := b.step()
	defer cancel()
	buf, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "console-"+name+".png"), buf, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// TestBrowserDeadLettersAtScale is the on-call walk through 2,000 dead
// letters in a real browser: log in (the login page shows nothing of the
// console, wrong tokens are rate-limited), page newest first and to the
// oldest, filter, replay all 500 that match after a confirmation with the
// exact count, find an entry by its original message id, replay it
// (failing) and reload its result without replaying again, see its
// replay history, and log out.
func TestBrowserDeadLettersAtScale(t *testing.T) {
	const token = "on-call-token-0123456789"
	b := tab{t, browser(t)}
	f := consoletest.New(t, func(c *console.Config) { c.Token = token })
	ids := f.FillDLQ(2000)
	s := url.QueryEscape(f.Stream)

	b.run("open the console", chromedp.Navigate(f.HTTP.URL+"/dlq?stream="+s), chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)))
	if n := b.count("nav"); n != 0 || strings.Contains(b.text("body"), f.Group) {
		t.Errorf("the login page shows a visitor %d navigation bars or the group", n)
	}
	b.shot("login")
	b.run("log in", chromedp.SendKeys(chromedp.CSS(`input[name=token]`), token), chromedp.Submit(chromedp.CSS(`form.login`)),
		chromedp.WaitVisible(chromedp.CSS(`table.dlq`)))
	b.run("the list", chromedp.WaitVisible(chromedp.CSS(`#dlq-count`)))

	// Newest first, 50 a page; the last page holds the oldest.
	if got := b.text(`#dlq-count`); got != "2\u202f000 entries" {
		t.Errorf("heading count %q", got)
	}
	if got := b.text(`table.dlq tbody tr:first-child td:nth-child(2)`); got != ids[1999] {
		t.Errorf("first row %s, want the newest %s", got, ids[1999])
	}
	b.shot("dlq-thousands")
	b.run("last page", chromedp.Click(chromedp.CSS(`a[rel=last]`)), chromedp.WaitVisible(chromedp.CSS(`a[rel=prev]`)))
	if got := b.text(`table.dlq tbody tr:last-child td:nth-child(2)`); got != ids[0] {
		t.Errorf("last row of the last page %s, want the oldest %s", got, ids[0])
	}

	// Filter: shop's refunds, the handler typed in another case.
	b.run("filter", chromedp.Navigate(f.HTTP.URL+"/dlq?stream="+s), chromedp.WaitVisible(chromedp.CSS(`form.filters`)),
		chromedp.SetValue(chromedp.CSS(`form.filters select[name=app]`), "shop"),
		chromedp.SendKeys(chromedp.CSS(`form.filters input[name=handler]`), "Refunds"),
		chromedp.Submit(chromedp.CSS(`form.filters`)))
	b.waitURL("handler=Refunds")
	if got := b.text(`#dlq-count`); got != "500 entries match (of 2\u202f000)" {
		t.Errorf("filtered heading %q", got)
	}
	f.Failing.Store(false)
	b.run("replay all matching", chromedp.Click(chromedp.CSS(`form.bulk button[value=replay]`)), chromedp.WaitVisible(chromedp.CSS(`#bulk-count`)))
	if got := b.text(`#bulk-count`); got != "500" {
		t.Errorf("confirmation count %q, want 500", got)
	}
	b.shot("bulk-confirm")
	b.run("confirm", chromedp.Click(chromedp.CSS(`main form button`)), chromedp.WaitVisible(chromedp.CSS(`#job-heading`)))
	testutil.WaitFor(t, 60*time.Second, "the replay of all matching to finish", func() bool {
		b.run("reload the job", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`#job-heading`)))
		return b.count(`.badge.good`) == 1
	})
	if got := b.text(`#job-heading`); got != "Replay all matching: 500 of 500 done, 500 replayed" {
		t.Errorf("job heading %q", got)
	}
	b.shot("bulk-job")
	if n := f.Ran.Load(); n != 500 {
		t.Errorf("handlers ran %d times, want 500", n)
	}
	b.run("back to the filtered list", chromedp.Click(chromedp.CSS(`a.back`)), chromedp.WaitVisible(chromedp.CSS(`form.filters`)))
	if got := b.text(`main`); !strings.Contains(got, "No dead-letter entries that pass the filter") || !strings.Contains(b.location(), "handler=Refunds") {
		t.Errorf("back from the job: %s", b.location())
	}

	// Find the entry of message 1502-7 (shop/orders.charge) by that id.
	f.Failing.Store(true)
	ran := f.Ran.Load()
	b.run("go to", chromedp.SendKeys(chromedp.CSS(`form.search input[name=q]`), "1502-7"), chromedp.Submit(chromedp.CSS(`form.search`)),
		chromedp.WaitVisible(chromedp.CSS(`pre.event`)))
	if l := b.location(); !strings.Contains(l, "id="+ids[1501]) {
		t.Fatalf("go to 1502-7 opened %s, want entry %s", l, ids[1501])
	}
	b.run("replay (failing)", chromedp.Click(chromedp.CSS(`button[formaction="/dlq/replay"]`)), chromedp.WaitVisible(chromedp.CSS(`table.results`)))
	if l := b.location(); !strings.Contains(l, "/dlq/result?") {
		t.Errorf("a replay ended on %s, want its result page (POST-redirect-GET)", l)
	}
	b.run("reload the result", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`table.results`)))
	b.run("reload the result again", chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS(`table.results`)))
	if n := f.Ran.Load() - ran; n != 1 {
		t.Errorf("the handler ran %d times after a replay and two reloads of its result, want 1", n)
	}
	if got := b.text(`main h1`); got != "Replay of 1 entry: 0 replayed, 1 kept" {
		t.Errorf("result heading %q", got)
	}
	b.shot("replay-result")
	b.run("open the entry", chromedp.Click(chromedp.CSS(`table.results a`)), chromedp.WaitVisible(chromedp.CSS(`dd.replays`)))
	if got := b.text(`dd.replays`); !strings.Contains(got, "1 replay without success") || !strings.Contains(got, "handler exited with code 3") {
		t.Errorf("replay history %q", got)
	}
	b.shot("dlq-entry-history")

	// Log out: the session is over, in this browser and for its cookie.
	b.run("log out", chromedp.Click(chromedp.CSS(`form.logout button`)), chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)))
	b.run("after logout", chromedp.Navigate(f.HTTP.URL+"/dlq?stream="+s), chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)))
	// The limiter gives one attempt back every LoginInterval, so on a slow
	// machine a few more may pass than the burst; the guesses must still
	// be refused long before twice the burst.
	refusedAt := 0
	for i := 1; i <= 2*console.LoginBurst && refusedAt == 0; i++ {
		// From a fresh form each time, so that the wait is for the answer.
		b.run("a wrong token", chromedp.Navigate(f.HTTP.URL+"/login"), chromedp.WaitVisible(chromedp.CSS(`input[name=token]`)),
			chromedp.SendKeys(chromedp.CSS(`input[name=token]`), "guess"), chromedp.Submit(chromedp.CSS(`form.login`)),
			chromedp.WaitVisible(chromedp.CSS(`p.problem`)))
		switch got := b.text(`p.problem`); {
		case strings.Contains(got, "Too many login attempts"):
			refusedAt = i
		case !strings.Contains(got, "not the console's token"):
			t.Fatalf("wrong token %d: %q", i, got)
		}
	}
	// One attempt of the burst went to the login at the start.
	if refusedAt == 0 || refusedAt < console.LoginBurst {
		t.Errorf("wrong tokens refused from attempt %d (0: never in %d), want from about the %dth on", refusedAt, 2*console.LoginBurst, console.LoginBurst)
	}
}

// TestBrowserRedisStopped stops the console's redis-server while a
// browser has it open: the live badge turns red at once, every page shows
// the banner and ? at once; when Redis is back the badge and pages
// recover without a restart.
func TestBrowserRedisStopped(t *testing.T) {
	b := tab{t, browser(t)}
	srv, rc, st := consoletest.StoppableRedis(t)
	rec := redisstats.NewRecorder(rc, st, "shop")
	rec.Record(stats.Event{Time: time.Now(), MessageID: "1-1", App: "shop", Handler: "orders.charge", Outcome: "succeeded"})
	if err := rec.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	c, err := console.New(console.Config{Redis: rc, Streams: []string{st}, Group: "shop",
		Apps:   template.Dir(testutil.AppsRoot(t, map[string]string{"shop": consoletest.ShopTemplate})),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(c)
	t.Cleanup(h.Close)
	b.run("live", chromedp.Navigate(h.URL+"/live"), chromedp.WaitVisible(chromedp.CSS(`#live-status.good`)))
	srv.Stop()
	start := time.Now()
	b.run("the badge turns red", chromedp.WaitVisible(chromedp.CSS(`#live-status.bad`)))
	t.Logf("the live badge turned red %s after redis-server stopped", time.Since(start).Round(time.Millisecond))
	b.shot("live-redis-down")
	for _, p := range []string{"/", "/dlq", "/pending"} {
		start := time.Now()
		b.run("open "+p, chromedp.Navigate(h.URL+p), chromedp.WaitVisible(chromedp.CSS(`div.unreachable`)))
		t.Logf("%s with Redis down: the banner after %s", p, time.Since(start).Round(time.Millisecond))
		if p == "/" {
			b.shot("redis-down")
			if got := b.text(`table.counters tbody tr:first-child td:nth-child(2)`); got != "?" {
				t.Errorf("received counter with Redis down: %q, want ?", got)
			}
		}
	}
	srv.Restart(t)
	b.run("live again", chromedp.Navigate(h.URL+"/live"), chromedp.WaitVisible(chromedp.CSS(`#live-status.good`)))
	testutil.WaitFor(t, 10*time.Second, "the overview without the banner", func() bool {
		b.run("reload", chromedp.Navigate(h.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`main`)))
		return b.count(`div.unreachable`) == 0
	})
}
