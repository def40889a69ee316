package console_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/worker"
)

// billingTemplate is the app of the browser test: charge fails until the
// test fixes handler.sh; refund keeps failing with a retry due, so its
// message stays pending.
const billingTemplate = `image: relay.local/busybox:latest
command: ["/bin/sh", "/app/handler.sh"]
secrets: [payment-api-key, ledger-db-password]
events:
  - handler: invoices.charge
    pattern:
      table_name: [invoices]
      event_name: [INSERT]
    timeout: 5s
    retries: 0
  - handler: invoices.refund
    pattern:
      table_name: [invoices]
      event_name: [DELETE]
    timeout: 5s
    retries: 3
schedules:
  - name: daily-report
    handler: reports.daily
    cron: "30 6 * * *"
    timezone: America/New_York
`

// ledgerTemplate is a python3 app with a requirements.txt, whose
// dependency image the Apps page shows; no event of the test matches it.
const ledgerTemplate = `runtime: python3
env:
  LEDGER_URL: https://ledger.internal
events:
  - handler: ledger.post
    pattern:
      table_name: [ledger]
`

const brokenHandler = `cat >/dev/null
[ "$RELAY_HANDLER" = reports.daily ] && exit 0
echo "billing: payment provider unreachable (attempt $RELAY_ATTEMPT)" >&2
exit 3
`

const fixedHandler = `cat >/dev/null
case "$RELAY_HANDLER" in
invoices.charge | reports.daily) echo "done"; exit 0 ;;
esac
echo "billing: refund rejected" >&2
exit 3
`

var pointsRE = regexp.MustCompile(`<polyline points="([^"]*)"`)

// chromium returns the path of a headless-capable Chromium: the test
// fails without one under RELAY_TEST_REQUIRE=1 (make test installs it)
// and is skipped otherwise.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{os.Getenv("RELAY_TEST_CHROMIUM"), "chromium", "chromium-browser"} {
		if name == "" {
			continue
		}
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("RELAY_TEST_REQUIRE") == "1" {
		t.Fatal("chromium not found in PATH (apt-get install chromium; scripts/setup.sh does) (RELAY_TEST_REQUIRE=1)")
	}
	t.Skip("chromium not found in PATH (apt-get install chromium)")
	return ""
}

// browser starts a headless Chromium and returns a tab's context.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Flag("headless", true),
		chromedp.Flag("no-sandbox", true),
		chromedp.Flag("disable-gpu", true),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.WindowSize(1360, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancelAlloc)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	// A dialog means a script from an event ran: fail, and dismiss it
	// from another goroutine (a listener must not run commands).
	dialogs := make(chan string, 10)
	err := chromedp.Listen(ctx, func(ev any) {
		if d, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			select {
			case dialogs <- d.Message:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for msg := range dialogs {
			t.Errorf("a JavaScript dialog opened: %q (markup from an event ran)", msg)
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	t.Cleanup(func() { close(dialogs) })
	return ctx
}

// TestBrowser is the operator's walk-through in a real browser against a
// real worker: open the overview, find the dead-lettered invocation,
// inspect it, replay it (failing), fix the app, replay it again and see
// the DLQ empty; an event carrying markup is shown as text. With
// RELAY_CONSOLE_SCREENSHOTS=DIR it saves a screenshot of every page there
// (docs/console.md shows them).
func TestBrowser(t *testing.T) {
	ctx := browser(t)
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "events")
	const group = "billing"
	apps := testutil.AppsRoot(t, map[string]string{"billing": billingTemplate, "ledger": ledgerTemplate})
	if err := os.WriteFile(filepath.Join(apps, "ledger", "requirements.txt"), []byte("requests==2.32.3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	handler := filepath.Join(apps, "billing", "handler.sh")
	if err := os.WriteFile(handler, []byte(brokenHandler), 0o755); err != nil {
		t.Fatal(err)
	}
	runner, err := runtime.NewProcess(runtime.WithOutput(io.Discard, io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := worker.New(worker.Config{Redis: rc, Streams: []string{streamName}, Group: group, Consumer: "worker-1",
		Apps: template.Dir(apps), Runner: runner, Engine: relay.Config{Logger: quiet, StatsInterval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w)

	// The dependency image as relay console finds it in containerd
	// (TestCLIConsoleAppsDeps asks a real one).
	depsBuilt := func(context.Context, runtime.Spec) (console.DepsImage, error) {
		return console.DepsImage{Name: "relay.local/deps:3f9a0c1e", Built: true, BuiltAt: time.Now().Add(-2 * time.Hour),
			BuildTime: 41 * time.Second, Size: 12 << 20}, nil
	}
	srv, err := console.New(console.Config{Redis: rc, Streams: []string{streamName}, Group: group, Apps: template.Dir(apps),
		Runner: runner, DLQRetention: 336 * time.Hour, StreamRetention: 24 * time.Hour, InvocationRetention: 48 * time.Hour,
		SampleInterval: 250 * time.Millisecond, Logger: quiet, Deps: depsBuilt})
	if err != nil {
		t.Fatal(err)
	}
	sctx, stopSampling := context.WithCancel(t.Context())
	defer stopSampling()
	go srv.Sample(sctx)
	hs := httptest.NewServer(srv)
	defer hs.Close()

	publish := func(event string) {
		t.Helper()
		if err := rc.Do(t.Context(), rc.B().Xadd().Key(streamName).Id("*").FieldValue().FieldValue("event", event).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	store := redisdlq.NewStore(rc, streamName)
	dlqLen := func() int64 {
		n, err := store.Len(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	publish(`{"event_name":"INSERT","table_name":"invoices","new_image":{"id":7,"amount":120}}`)
	testutil.WaitFor(t, 30*time.Second, "the charge dead-lettered", func() bool { return dlqLen() == 1 })
	const payload = `<script>alert("xss")</script><img src=x onerror=alert(2)>`
	publish(`{"event_name":"INSERT","table_name":"invoices","new_image":{"id":8,"note":"` + strings.ReplaceAll(payload, `"`, `\"`) + `","link":"javascript:alert(3)"}}`)
	publish(`{"event_name":"DELETE","table_name":"invoices","new_image":{"id":9}}`)
	publish(`{"event_name":"UPDATE","table_name":"users","new_image":{"id":1}}`)
	testutil.WaitFor(t, 30*time.Second, "the markup event dead-lettered", func() bool { return dlqLen() == 2 })
	testutil.WaitFor(t, 30*time.Second, "the refund waiting for its retry", func() bool {
		evs, err := redisstats.LatestFeed(t.Context(), rc, streamName, group, 100)
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Handler == "invoices.refund" && ev.Outcome == "failed" {
				return true
			}
		}
		return false
	})
	shots := os.Getenv("RELAY_CONSOLE_SCREENSHOTS")
	// Each step gets its own deadline; the browser lives on ctx.
	step := func() (context.Context, context.CancelFunc) { return context.WithTimeout(ctx, 30*time.Second) }
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		tctx, cancel := step()
		defer cancel()
		for try := 1; ; try++ {
			err := chromedp.Do(tctx, steps...)
			// On a busy machine chromium can renumber a page's nodes after
			// the load a step waited for; the action that met a stale node
			// did nothing, so the step is tried again.
			if err != nil && staleNode(err) && try < 3 {
				time.Sleep(200 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return
		}
	}
	text := func(sel string) string {
		t.Helper()
		tctx, cancel := step()
		defer cancel()
		for try := 1; ; try++ {
			v, err := chromedp.Run(tctx, chromedp.Text(chromedp.CSS(sel)))
			// A page still replacing the one a click left can drop the
			// node between its query and its read: read it again.
			if err != nil && staleNode(err) && try < 5 {
				time.Sleep(100 * time.Millisecond)
				continue
			}
			if err != nil {
				t.Fatalf("read %s: %v", sel, err)
			}
			return v
		}
	}
	count := func(sel string) int {
		t.Helper()
		tctx, cancel := step()
		defer cancel()
		v, err := chromedp.Run(tctx, chromedp.Evaluate[int](`document.querySelectorAll(`+strconv.Quote(sel)+`).length`))
		if err != nil {
			t.Fatalf("count %s: %v", sel, err)
		}
		return v
	}
	shot := func(name string) {
		t.Helper()
		if shots == "" {
			return
		}
		tctx, cancel := step()
		defer cancel()
		buf, err := chromedp.Run(tctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, "console-"+name+".png"), buf, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s := url.QueryEscape(streamName)

	// The overview: two dead letters, a pending message; wait for the
	// counters' rates to be drawn.
	run("open the overview", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`a.tile.bad`)))
	if got := text(`a.tile.bad .v`); got != "2" {
		t.Errorf("dead letters tile = %q, want 2", got)
	}
	// The rates need samples over time: keep unmatched events coming (one
	// per 100ms) until the console has drawn ten samples.
	last := time.Now()
	testutil.WaitFor(t, 30*time.Second, "a sparkline of ten samples", func() bool {
		if time.Since(last) > 100*time.Millisecond {
			publish(`{"event_name":"UPDATE","table_name":"users","new_image":{"id":2}}`)
			last = time.Now()
		}
		resp, err := http.Get(hs.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		m := pointsRE.FindSubmatch(b)
		return m != nil && strings.Count(string(m[1]), ",") >= 10
	})
	run("reload the overview", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`svg.spark`)))
	shot("overview")
	run("apps", chromedp.Navigate(hs.URL+"/apps"), chromedp.WaitVisible(chromedp.CSS(`#app-billing`)))
	shot("apps")
	if got := text(`#app-billing`); !strings.Contains(got, "America/New_York") || !strings.Contains(got, "table_name: [\"invoices\"]") ||
		!strings.Contains(got, "payment-api-key, ledger-db-password (mounted at /run/secrets/NAME; values never shown)") {
		t.Errorf("apps page: %q", got)
	}
	if got := text(`#app-ledger .deps-image`); !strings.Contains(got, "built relay.local/deps:3f9a0c1e 12MiB compressed") {
		t.Errorf("apps page, the ledger's dependency image: %q", got)
	}
	run("pending", chromedp.Navigate(hs.URL+"/pending?stream="+s), chromedp.WaitVisible(chromedp.CSS(`main`)))
	shot("pending")
	if got := text(`main`); !strings.Contains(got, "waiting") || !strings.Contains(got, "refund rejected") && !strings.Contains(got, "payment provider unreachable") {
		t.Errorf("pending page: %q", got)
	}
	run("live", chromedp.Navigate(hs.URL+"/live?stream="+s), chromedp.WaitVisible(chromedp.CSS(`#live-status.good`)))
	shot("live")
	if got := text(`#feed`); !strings.Contains(got, "dead-lettered") {
		t.Errorf("live page: %q", got)
	}

	// From the overview to the DLQ, to the charge's entry.
	run("open the DLQ", chromedp.Navigate(hs.URL+"/"), chromedp.Click(chromedp.CSS(`a.tile.bad`)), chromedp.WaitVisible(chromedp.CSS(`table.dlq`)))
	shot("dlq")
	// Newest first: the charge, dead-lettered first, is the second row.
	run("inspect the charge's entry", chromedp.Click(chromedp.CSS(`table.dlq tbody tr:nth-child(2) a`)), chromedp.WaitVisible(chromedp.CSS(`pre.event`)))
	shot("dlq-entry")
	if got := text(`main`); !strings.Contains(got, "billing/invoices.charge") || !strings.Contains(got, "payment provider unreachable") || !strings.Contains(got, `"amount": 120`) {
		t.Errorf("entry page: %q", got)
	}
	entryURL, err := chromedp.Run(ctx, chromedp.Location())
	if err != nil {
		t.Fatal(err)
	}

	// Replay before the fix: the handler fails again, the entry is kept.
	run("replay (still broken)", chromedp.Click(chromedp.CSS(`button[formaction="/dlq/replay"]`)), chromedp.WaitVisible(chromedp.CSS(`table.results`)))
	if got := text(`table.results`); !strings.Contains(got, "failed") || !strings.Contains(got, "payment provider unreachable (attempt 2)") {
		t.Errorf("replay before the fix: %q", got)
	}
	if dlqLen() != 2 {
		t.Fatal("a failed replay removed the entry")
	}

	// The markup event is shown as text, and no script of it ran.
	run("open the markup entry", chromedp.Navigate(hs.URL+"/dlq?stream="+s), chromedp.WaitVisible(chromedp.CSS(`table.dlq`)),
		chromedp.Click(chromedp.CSS(`table.dlq tbody tr:first-child a`)), chromedp.WaitVisible(chromedp.CSS(`pre.event`)))
	if got := text(`pre.event`); !strings.Contains(got, strings.ReplaceAll(payload, `"`, `\"`)) || !strings.Contains(got, "javascript:alert(3)") {
		t.Errorf("the event's markup is not shown as text: %q", got)
	}
	scripts, imgs := count("script"), count("img")
	if scripts != 1 || imgs != 0 {
		t.Errorf("%d scripts and %d images on the page: markup from the event became elements", scripts, imgs)
	}

	// Fix the app, replay the charge from its page: the entry is deleted.
	if err := os.WriteFile(handler, []byte(fixedHandler), 0o755); err != nil {
		t.Fatal(err)
	}
	run("replay (fixed)", chromedp.Navigate(entryURL), chromedp.WaitVisible(chromedp.CSS(`pre.event`)),
		chromedp.Click(chromedp.CSS(`button[formaction="/dlq/replay"]`)), chromedp.WaitVisible(chromedp.CSS(`table.results`)))
	shot("replayed")
	if got := text(`table.results`); !strings.Contains(got, "replayed") {
		t.Errorf("replay after the fix: %q", got)
	}

	// The playground, with the markup event picked from the DLQ.
	run("playground", chromedp.Navigate(hs.URL+"/playground?stream="+s), chromedp.WaitVisible(chromedp.CSS(`ul.picks`)),
		chromedp.Click(chromedp.CSS(`ul.picks:nth-of-type(2) a`)), chromedp.WaitVisible(chromedp.CSS(`div.rule`)))
	shot("playground")
	if got := text(`main`); !strings.Contains(got, "billing/invoices.charge matched") || !strings.Contains(got, `"DELETE" is not one of`) && !strings.Contains(got, "is not one of") {
		t.Errorf("playground: %q", got)
	}

	// Remove the markup entry: select it, confirm, and the DLQ is empty.
	run("remove", chromedp.Navigate(hs.URL+"/dlq?stream="+s), chromedp.WaitVisible(chromedp.CSS(`table.dlq`)),
		chromedp.Click(chromedp.CSS(`input[data-select-all]`)),
		chromedp.Click(chromedp.CSS(`button[formaction="/dlq/remove"]`)), chromedp.WaitReady(chromedp.CSS(`input[name=confirm]`)))
	shot("confirm")
	run("confirm", chromedp.Click(chromedp.CSS(`button.danger`)), chromedp.WaitVisible(chromedp.CSS(`table.results`)))
	run("empty DLQ", chromedp.Navigate(hs.URL+"/dlq?stream="+s), chromedp.WaitVisible(chromedp.CSS(`p.empty`)))
	if got := text(`p.empty`); got != "No dead-letter entries." {
		t.Errorf("DLQ page: %q, want it empty", got)
	}
	if dlqLen() != 0 {
		t.Errorf("DLQ holds %d entries, want 0", dlqLen())
	}
}

// staleNode reports an error of a browser action that met a node the page
// no longer has.
func staleNode(err error) bool {
	return strings.Contains(err.Error(), "No node with given id") || strings.Contains(err.Error(), "Could not find node with given id")
}
