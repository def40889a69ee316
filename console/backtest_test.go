package console_test

import (
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
)

var (
	btRowRE    = regexp.MustCompile(`(?s)<tr><td><code>([^<]*)</code>.*?<td class="n bt-count">(\d+)</td>`)
	btTotalsRE = regexp.MustCompile(`class="bt-matched">(\d+)<.*class="bt-unmatched">(\d+)<.*class="bt-malformed">(\d+)<`)
)

// backtestCounts reads the per-rule counts and the totals off a page.
func backtestCounts(t *testing.T, body string) (rules []string, totals string) {
	t.Helper()
	for _, m := range btRowRE.FindAllStringSubmatch(body, -1) {
		rules = append(rules, html.UnescapeString(m[1])+"="+m[2])
	}
	if m := btTotalsRE.FindStringSubmatch(body); m != nil {
		totals = m[1] + "/" + m[2] + "/" + m[3]
	}
	return rules, totals
}

func TestPlaygroundBacktest(t *testing.T) {
	f := newFixture(t)
	small := f.BacktestStream()
	backtest := func(form url.Values) string {
		t.Helper()
		form.Set("action", "backtest")
		code, body := f.post("/playground", form)
		if code != http.StatusOK {
			t.Fatalf("backtest %v: status %d", form, code)
		}
		return body
	}
	check := func(what, body, totals string, rules ...string) {
		t.Helper()
		gotRules, gotTotals := backtestCounts(t, body)
		if gotTotals != totals || !slices.Equal(gotRules, rules) {
			t.Errorf("%s: rules %v, totals %s (matched/unmatched/malformed); want %v, %s", what, gotRules, gotTotals, rules, totals)
		}
	}

	// Every app's rules, in dispatch order, over the default window.
	body := backtest(url.Values{})
	check("every app", body, "14/2/2", "broken/orders.audit=11", "shop/orders.charge=7", "shop/refunds.run=3", "shop/orders.stale=0")
	contains(t, "every app", body, "Backtest of the rules of every app", "The newest 18 entries of stream", "all it holds",
		`<span class="badge bad">app unavailable</span>`, `value="1000"`, "1 to 10\u202f000 (default 1\u202f000)")

	// One app, over a window of the newest 5 entries: 1 refund, 2 others
	// and the 2 malformed entries.
	body = backtest(url.Values{"app": {"shop"}, "window": {"5"}})
	check("shop, newest 5", body, "1/2/2", "shop/orders.charge=0", "shop/refunds.run=1", "shop/orders.stale=0")
	contains(t, "shop, newest 5", body, "Backtest of the rules of app shop", "The newest 5 entries", `<option selected>shop</option>`)
	lacks(t, "shop, newest 5", body, "all it holds")

	// A pattern being edited runs alone; its first matches, newest first,
	// link to their event pages.
	body = backtest(url.Values{"pattern": {"kind: [order]\namount: [{lt: 100}]\n"}, "app": {"shop"}})
	check("edited pattern", body, "4/12/2", "edited pattern=4")
	contains(t, "edited pattern", body, "Backtest of the edited pattern", "amount: [{lt: 100}]")
	link := func(id string) string {
		return html.EscapeString(`/event?id=` + url.QueryEscape(id) + `&stream=` + url.QueryEscape(f.Stream))
	}
	for _, id := range small {
		contains(t, "edited pattern", body, link(id))
	}
	// By their whole links: an id such as ...-1 is a prefix of ...-10.
	if i, j := strings.Index(body, link(small[0])), strings.Index(body, link(small[3])); i < 0 || j < i {
		t.Errorf("edited pattern: the newest match %s is not listed first", small[0])
	}

	// A broken pattern says where, as pattern:line:col.
	body = backtest(url.Values{"pattern": {"kind: [order]\namount: 20\n"}})
	contains(t, "broken pattern", body, "The pattern does not parse", "<code>pattern:2:9: amount:")
	lacks(t, "broken pattern", body, "Backtest of")
	body = backtest(url.Values{"pattern": {"kind: [order\n"}})
	contains(t, "invalid YAML", body, "<code>pattern:", "invalid YAML")

	for _, w := range []string{"0", "10001", "many"} {
		body = backtest(url.Values{"window": {w}})
		contains(t, "window "+w, body, "window: want 1 to 10000 entries", `value="`+w+`"`)
		lacks(t, "window "+w, body, "Backtest of")
	}
	body = backtest(url.Values{"app": {"nope"}})
	contains(t, "unknown app", body, "app: no app nope is loaded")

	// Each rule offers its pattern to edit and backtest.
	_, body = f.get("/playground?stream=" + url.QueryEscape(f.Stream) + "&app=shop&handler=orders.charge")
	contains(t, "load a rule", body, "from rule shop/orders.charge", "kind: [&#34;order&#34;]\namount:\n  - gte: 100\n")
	// What it loads parses back to the same rule.
	m := regexp.MustCompile(`(?s)name="pattern"[^>]*>(.*?)</textarea>`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("load a rule: no pattern box")
	}
	body = backtest(url.Values{"pattern": {html.UnescapeString(m[1])}})
	check("loaded pattern", body, "7/9/2", "edited pattern=7")
}

// TestPlaygroundBacktestReadOnly: a backtest only reads, so a read-only
// console allows it; a stale token keeps the pattern and the window.
func TestPlaygroundBacktestReadOnly(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.ReadOnly = true })
	f.BacktestStream()
	_, body := f.post("/playground", url.Values{"action": {"backtest"}, "window": {"4"}})
	if _, totals := backtestCounts(t, body); totals != "0/2/2" {
		t.Errorf("read-only backtest of the newest 4: totals %q, want 0/2/2", totals)
	}
	code, body := f.do(http.MethodPost, "/playground", url.Values{"stream": {f.Stream}, "action": {"backtest"},
		"pattern": {"kind: [refund]"}, "window": {"77"}, "csrf": {strings.Repeat("0", 64)}})
	if code != http.StatusForbidden {
		t.Errorf("stale token: status %d, want 403", code)
	}
	contains(t, "stale token", body, "kind: [refund]</textarea>", `value="77"`)
}

// TestPlaygroundBacktestRedisDown: with redis-server stopped a backtest
// answers within the request timeout, keeping the pattern, and says why
// it read nothing.
func TestPlaygroundBacktestRedisDown(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	st := redistest.Name(t, "events")
	c, err := console.New(console.Config{Redis: redistest.Connect(t, srv.Addr), Streams: []string{st}, Group: "shop",
		Apps:           template.Dir(testutil.AppsRoot(t, map[string]string{"shop": consoletest.ShopTemplate})),
		RequestTimeout: time.Second, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h := httptest.NewServer(c)
	t.Cleanup(h.Close)
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: 30 * time.Second}
	resp, err := client.Get(h.URL + "/playground")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfRE.FindSubmatch(b)
	if m == nil {
		t.Fatal("no CSRF token on /playground")
	}
	srv.Stop()
	resp, err = client.PostForm(h.URL+"/playground", url.Values{"csrf": {string(m[1])}, "stream": {st}, "action": {"backtest"},
		"pattern": {"kind: [order]"}})
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	contains(t, "backtest with Redis down", string(b), "backtest: read the newest 1000 entries of "+st, "kind: [order]</textarea>")
	lacks(t, "backtest with Redis down", string(b), "Backtest of")
}
