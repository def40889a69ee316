package console_test

import (
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/testutil"
)

// TestBrowserPlaygroundBacktest backtests in a real browser, on a
// read-only console: every app's rules against the stream of known
// content of backtestStream, then an edited pattern, whose newest match
// links to its event page, then a broken pattern, which says where.
func TestBrowserPlaygroundBacktest(t *testing.T) {
	b := tab{t, browser(t)}
	f := consoletest.New(t, func(c *console.Config) { c.ReadOnly = true })
	small := f.BacktestStream()
	s := url.QueryEscape(f.Stream)
	// waitFor waits until the page the form posted to has loaded and its
	// backtest heading says what.
	waitFor := func(what string) {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, "the backtest of "+what, func() bool {
			return strings.Contains(b.loaded(`.bt-what`), what)
		})
	}
	rules := func() []string {
		t.Helper()
		var out []string
		for i := 1; i <= b.count(`table.backtest tbody tr`); i++ {
			row := `table.backtest tbody tr:nth-child(` + strconv.Itoa(i) + `) `
			out = append(out, b.text(row+`td:first-child code`)+"="+b.text(row+`td.bt-count`))
		}
		return out
	}
	totals := func() string {
		return b.text(`.bt-matched`) + "/" + b.text(`.bt-unmatched`) + "/" + b.text(`.bt-malformed`)
	}

	b.run("open the playground", chromedp.Navigate(f.HTTP.URL+"/playground?stream="+s), chromedp.WaitVisible(chromedp.CSS(`textarea#pattern`)))
	if got := b.text(`fieldset.backtest`); !strings.Contains(got, "1 to 10\u202f000 (default 1\u202f000)") {
		t.Errorf("the backtest form does not state its bound: %q", got)
	}
	b.run("backtest every app", chromedp.Click(chromedp.CSS(`button[value=backtest]`)))
	waitFor("the rules of every app")
	if got, want := strings.Join(rules(), " "), "broken/orders.audit=11 shop/orders.charge=7 shop/refunds.run=3 shop/orders.stale=0"; got != want {
		t.Errorf("rules %q, want %q", got, want)
	}
	if got := totals(); got != "14/2/2" {
		t.Errorf("matched/unmatched/malformed %s, want 14/2/2", got)
	}

	b.run("edit a pattern", chromedp.SendKeys(chromedp.CSS(`textarea#pattern`), "kind: [order]\namount: [{lt: 100}]"),
		chromedp.Click(chromedp.CSS(`button[value=backtest]`)))
	waitFor("the edited pattern")
	if got := strings.Join(rules(), " "); got != "edited pattern=4" {
		t.Errorf("edited pattern: rules %q, want edited pattern=4", got)
	}
	if got := totals(); got != "4/12/2" {
		t.Errorf("edited pattern: matched/unmatched/malformed %s, want 4/12/2", got)
	}
	if n := b.count(`table.backtest ul.picks a`); n != 4 {
		t.Errorf("edited pattern: %d matches listed, want 4", n)
	}
	// The pattern comes back as typed (browsers send line breaks as CRLF).
	if got := b.value(`textarea#pattern`); got != "kind: [order]\namount: [{lt: 100}]" {
		t.Errorf("the pattern box holds %q after the backtest", got)
	}
	b.shot("playground-backtest")
	b.run("open the newest match", chromedp.Click(chromedp.CSS(`table.backtest ul.picks a`)))
	b.waitURL("/event?id=" + url.QueryEscape(small[0]))

	b.run("back to the playground", chromedp.Navigate(f.HTTP.URL+"/playground?stream="+s), chromedp.WaitVisible(chromedp.CSS(`textarea#pattern`)))
	b.run("break the pattern", chromedp.SendKeys(chromedp.CSS(`textarea#pattern`), "kind: [order]\namount: 20"),
		chromedp.Click(chromedp.CSS(`button[value=backtest]`)))
	testutil.WaitFor(t, 30*time.Second, "the pattern's error", func() bool { return b.loaded(`.pattern-errors`) != "" })
	if got := b.text(`.pattern-errors`); !strings.Contains(got, "pattern:2:9: amount:") {
		t.Errorf("broken pattern: %q, want its position pattern:2:9", got)
	}
}

// TestBrowserPlaygroundBacktestFits backtests at a 1280 and a 1024 px
// wide window the rules of an app whose names are as long as they may be,
// against an event whose JSON runs long: the results wrap inside their
// column, and the page does not scroll sideways.
func TestBrowserPlaygroundBacktestFits(t *testing.T) {
	b := tab{t, browser(t)}
	f := consoletest.New(t, func(c *console.Config) { c.ReadOnly = true })
	f.BacktestStream()
	longApp, _ := longNames(f)
	s := url.QueryEscape(f.Stream)

	for _, width := range []int64{1280, 1024} {
		for i, a := range []string{"", longApp} {
			what := "the rules of every app"
			if a != "" {
				what = "the rules of app " + a
			}
			b.run("open the playground", chromedp.EmulateViewport(width, 800),
				chromedp.Navigate(f.HTTP.URL+"/playground?stream="+s+"&app="+a), chromedp.WaitVisible(chromedp.CSS(`textarea#pattern`)),
				chromedp.Click(chromedp.CSS(`button[value=backtest]`)))
			testutil.WaitFor(t, 30*time.Second, "the backtest of "+what, func() bool {
				return strings.Contains(b.loaded(`.bt-what`), what)
			})
			if n := b.count(`table.backtest tbody tr`); n < 1 {
				t.Fatalf("%d px, %s: no rule listed", width, what)
			}
			b.shot(fmt.Sprintf("playground-backtest-fits-%d-%d", width, i))
			b.fits(fmt.Sprintf("%d px, %s", width, what), `table.backtest`)
		}
	}
}

// TestBrowserPlaygroundMatchFits matches, at a 1280 and a 1024 px wide
// window, an event whose JSON runs long against the rules of an app whose
// names are as long as they may be: the matching handlers and each rule's
// heading wrap inside their column, and the page does not scroll sideways.
func TestBrowserPlaygroundMatchFits(t *testing.T) {
	b := tab{t, browser(t)}
	f := consoletest.New(t, func(c *console.Config) { c.ReadOnly = true })
	longApp, id := longNames(f)
	for _, width := range []int64{1280, 1024} {
		b.run("match the event", chromedp.EmulateViewport(width, 800),
			chromedp.Navigate(f.HTTP.URL+"/playground?stream="+url.QueryEscape(f.Stream)+"&id="+url.QueryEscape(id)),
			chromedp.WaitVisible(chromedp.CSS(`ol.matches`)))
		if got := b.text(`ol.matches`); !strings.Contains(got, longApp) {
			t.Fatalf("%d px: the long-named app's rule does not match: %q", width, got)
		}
		b.shot(fmt.Sprintf("playground-match-%d", width))
		b.fits(fmt.Sprintf("%d px", width), `ol.matches`)
	}
}

// longNames adds to f's apps one whose app and handler names are as long
// as they may be, with a rule that matches orders, and publishes an order
// whose JSON runs long; it returns the app's name and the order's id.
func longNames(f *consoletest.Fixture) (app, id string) {
	f.T.Helper()
	app = strings.Repeat("customer.notifications.", 3)[:63]
	const handler = "customer.subscription.renewal.reminder.email.dispatch_with_proration"
	dir := filepath.Join(f.Apps, app)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.T.Fatal(err)
	}
	tpl := "image: relay.local/busybox:latest\nevents:\n  - handler: " + handler + "\n    pattern:\n      kind: [order]\n"
	if err := os.WriteFile(filepath.Join(dir, "template.yaml"), []byte(tpl), 0o644); err != nil {
		f.T.Fatal(err)
	}
	return app, f.Publish(`{"kind":"order","amount":150,"id":"ord_` + strings.Repeat("0123456789", 12) + `"}`)
}

// fits says where the page scrolls sideways, or the column of results
// holding sel (its parent's) runs wider than it; the window's clientWidth
// leaves out its scroll bar.
func (b tab) fits(where, sel string) {
	b.t.Helper()
	type widths struct{ Page, Window, Panel, Column int }
	w := eval[widths](b, "measure the page", `(function(){var d=document.documentElement,p=document.querySelector(`+strconv.Quote(sel)+`).parentElement;`+
		`return {Page:d.scrollWidth,Window:d.clientWidth,Panel:p.scrollWidth,Column:p.clientWidth}})()`)
	if w.Page > w.Window {
		b.t.Errorf("%s: the page scrolls sideways, %d px wide in a window %d px wide", where, w.Page, w.Window)
	}
	if w.Panel > w.Column {
		b.t.Errorf("%s: the results run %d px wide out of their %d px column", where, w.Panel, w.Column)
	}
}

// value reads the current value of a form field.
func (b tab) value(sel string) string {
	b.t.Helper()
	return eval[string](b, "read the value of "+sel, `document.querySelector(`+strconv.Quote(sel)+`).value`)
}

// loaded returns the text of the element sel once the document has
// loaded, and "" before, or while a form submission replaces it (a read
// then may fail: the document it ran in is gone).
func (b tab) loaded(sel string) string {
	b.t.Helper()
	ctx, cancel := b.step()
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[string](`(function(){var e=document.querySelector(`+strconv.Quote(sel)+
		`);return document.readyState==="complete"&&e?e.innerText:""})()`))
	if err != nil {
		return ""
	}
	return v
}
