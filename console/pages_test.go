package console_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

func TestOverview(t *testing.T) {
	f := newFixture(t)
	f.Publish(`{"kind":"order","amount":5}`)
	f.Publish(`{"kind":"order","amount":500}`)
	f.deliver("worker-1")
	f.Publish(`{"kind":"refund"}`) // not delivered: lag 1
	f.deadLetter("shop", "orders.charge", `{"kind":"order"}`, "exit 3")
	f.record()

	code, body := f.get("/")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "overview", body, f.Stream, "worker-1", ">dead letters<", "received", "sampling…")

	// Sampling draws the rates: once two samples span an increase, the
	// received sparkline is drawn and its rate is not "-".
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go f.Server.Sample(ctx)
	testutil.WaitFor(t, 5*time.Second, "three samples", func() bool {
		_, body = f.get("/")
		return strings.Count(body, "sampling…") == 0
	})
	f.record()
	testutil.WaitFor(t, 5*time.Second, "a drawn increase", func() bool {
		_, body = f.get("/")
		return strings.Contains(body, `aria-label="received per sample, peak 5"`)
	})
	contains(t, "overview", body, `<svg class="spark `, "<polyline points=")
}

// TestOverviewTiles checks the numbers of the tiles against what was set up.
func TestOverviewTiles(t *testing.T) {
	f := newFixture(t)
	for range 3 {
		f.Publish(`{"kind":"order"}`)
	}
	f.deliver("worker-a")
	f.Publish(`{"kind":"order"}`)
	f.Publish(`{"kind":"order"}`)
	f.deadLetter("shop", "orders.charge", `{}`, "exit 3")
	_, body := f.get("/")
	tile := func(name, want string) {
		t.Helper()
		if !strings.Contains(body, `<span class="k">`+name+`</span><span class="v">`+want+`</span>`) {
			t.Errorf("tile %s: want %s", name, want)
		}
	}
	tile("entries", "6") // 5 events and the dead letter's original
	tile("lag", "3")
	tile("pending", "3")
	tile("dead letters", "1")
}

func TestOverviewMissingGroup(t *testing.T) {
	f := newFixture(t)
	f.Config.Group = "nobody"
	srv, err := console.New(f.Config)
	if err != nil {
		t.Fatal(err)
	}
	w := httptestRecorder(srv, "GET", "/")
	contains(t, "overview", w, "consumer group nobody does not exist")
}

func TestApps(t *testing.T) {
	f := newFixture(t)
	code, body := f.get("/apps")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "apps", body,
		`id="app-shop"`, "ready", "<code>relay.local/busybox:latest</code>", "<dt>concurrency</dt><dd>3</dd>",
		"<code>orders.charge</code>", "kind: [&#34;order&#34;]", "amount:\n  - gte: 100", "id:\n  - prefix: &#34;ord_&#34;",
		"nightly", "<code>reports.nightly</code>", "0 3 * * *", "Europe/Paris", "API_TOKEN", "(values hidden)",
		"unavailable", "1 template error", "<code>broken/template.yaml:7:14</code>", "timeout")
	lacks(t, "apps", body, "s3cret-token-value")
	// The next fire time, in UTC and in the schedule's zone: 03:00 Paris.
	if !strings.Contains(body, " 03:00 CET") && !strings.Contains(body, " 03:00 CEST") {
		t.Error("apps: no 03:00 Paris fire time")
	}
	if !strings.Contains(body, " 01:00 UTC") && !strings.Contains(body, " 02:00 UTC") {
		t.Error("apps: no UTC fire time")
	}
}

func TestPending(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.PageSize = 2 })
	running := f.Publish(`{"kind":"order","amount":500,"id":"ord_1"}`)
	waiting := f.Publish(`{"kind":"order","amount":700,"id":"ord_2"}`)
	fresh := f.Publish(`{"kind":"refund"}`)
	f.deliver("worker-1")
	f.claim(running, "shop/orders.charge", 0)
	f.claim(waiting, "shop/orders.charge", 10*time.Minute)
	f.record(stats.Event{Time: time.Now(), Consumer: "worker-1", MessageID: waiting, App: "shop", Handler: "orders.charge",
		Outcome: "failed", Attempt: 1, MaxAttempts: 3, Reason: "payment provider unreachable"})

	code, body := f.get("/pending?stream=" + url.QueryEscape(f.Stream))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "pending page 1", body, "3 messages delivered", running, waiting,
		`<span class="badge running">running</span>`, "attempt 1 of 3, lease until",
		`<span class="badge waiting">waiting</span>`, "attempt 1 of 3 failed; next attempt at", "(in 9m)",
		"last error", "payment provider unreachable",
		`href="/event?id=`+running)
	lacks(t, "pending page 1", body, fresh)
	next := "/pending?after=" + waiting + "&amp;stream="
	if !strings.Contains(body, next) {
		t.Fatalf("pending page 1: no next link %q", next)
	}
	_, body = f.get("/pending?after=" + waiting + "&stream=" + url.QueryEscape(f.Stream))
	contains(t, "pending page 2", body, fresh, "no invocation claimed yet")
	lacks(t, "pending page 2", body, running+"</code>", "next 1")

	if code, _ := f.get("/pending?after=zzz"); code != http.StatusBadRequest {
		t.Errorf("a bad cursor: status %d, want 400", code)
	}
	if code, _ := f.get("/pending?stream=other"); code != http.StatusNotFound {
		t.Errorf("an unknown stream: status %d, want 404", code)
	}
}

func TestEvent(t *testing.T) {
	f := newFixture(t)
	id := f.Publish(`{"kind":"order","amount":500,"id":"ord_1"}`, "traceparent", "00-abc-def-01")
	f.deliver("worker-9")
	f.claim(id, "shop/orders.charge", time.Minute)
	code, body := f.get("/event?id=" + id + "&stream=" + url.QueryEscape(f.Stream))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "event", body, "yes, held by <code>worker-9</code>", "&#34;amount&#34;: 500", "traceparent",
		"00-abc-def-01", "<code>shop/orders.charge</code>", "waiting", "/playground?id="+id)
	_, body = f.get("/event?id=1-1&stream=" + url.QueryEscape(f.Stream))
	contains(t, "a trimmed event", body, "no longer in the stream")
	if code, _ := f.get("/event?id=x"); code != http.StatusBadRequest {
		t.Errorf("a bad id: status %d", code)
	}
}

func TestDLQList(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.PageSize = 2 })
	a := f.deadLetter("shop", "orders.charge", `{"n":1}`, "exit 3: Payment provider down")
	b := f.deadLetter("shop", "refunds.run", `{"n":2}`, "exit 1: refund rejected")
	c := f.deadLetter("shop", "orders.charge", `{"n":3}`, "timeout after 5s")
	s := "&stream=" + url.QueryEscape(f.Stream)

	// Newest first by default.
	_, body := f.get("/dlq?x=1" + s)
	contains(t, "page 1", body, "3 entries", c, b, `name="id" value="`+c+`"`, "Replay selected", "Remove selected", "in 13d")
	lacks(t, "page 1", body, a)
	_, body = f.get("/dlq?after=" + b + s)
	contains(t, "page 2", body, a, "« newest")
	_, body = f.get("/dlq?order=oldest" + s)
	contains(t, "oldest first", body, a, b)
	lacks(t, "oldest first", body, c)

	for _, tc := range []struct {
		query    string
		want     []string
		notWants []string
	}{
		{"app=shop&handler=refunds.run", []string{b}, []string{a, c}},
		{"reason=PAYMENT", []string{a}, []string{b, c}},
		{"newer=1h&order=oldest", []string{a, b}, nil},
		{"older=1h", nil, []string{a, b, c}},
		{"app=nobody", []string{"No dead-letter entries that pass the filter"}, nil},
	} {
		_, body := f.get("/dlq?" + tc.query + s)
		contains(t, tc.query, body, tc.want...)
		lacks(t, tc.query, body, tc.notWants...)
	}
	code, body := f.get("/dlq?newer=yesterday" + s)
	if code != http.StatusBadRequest || !strings.Contains(body, "want an age such as 30m") {
		t.Errorf("a bad age: status %d", code)
	}
}

func TestDLQInspect(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("shop", "orders.charge", `{"kind":"order","amount":500}`, "handler exited with code 3: payment provider unreachable")
	code, body := f.get("/dlq/entry?id=" + id + "&stream=" + url.QueryEscape(f.Stream))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "inspect", body, "<code>shop/orders.charge</code>", "payment provider unreachable", "worker-1",
		"&#34;kind&#34;: &#34;order&#34;,\n  &#34;amount&#34;: 500", "in 13d", "<dt>handler attempts</dt><dd>3 before it was dead-lettered</dd>", "<dt>replays</dt><dd class=\"replays\">none</dd>",
		`formaction="/dlq/replay"`, `formaction="/dlq/remove"`, "/playground?dlq="+id)
	code, body = f.get("/dlq/entry?id=1-1&stream=" + url.QueryEscape(f.Stream))
	if code != http.StatusNotFound || !strings.Contains(body, "no dead-letter entry 1-1") {
		t.Errorf("unknown entry: status %d", code)
	}
}

// TestDLQReplay replays as relay dlq replay does: a failing handler keeps
// the entry, a fixed one deletes it; malformed, gone and unavailable
// entries are refused without running anything.
func TestDLQReplay(t *testing.T) {
	f := newFixture(t)
	charge := f.deadLetter("shop", "orders.charge", `{"kind":"order"}`, "exit 3")
	malformed := f.deadLetter("-", "-", `not json`, "malformed event")
	gone := f.deadLetter("shop", "orders.gone", `{}`, "exit 3")
	broken := f.deadLetter("broken", "orders.audit", `{}`, "exit 3")

	code, body := f.post("/dlq/replay", url.Values{"id": {charge}})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	contains(t, "failing replay", body, "Replay of 1 entry: 0 replayed, 1 kept", "failed", "handler exited with code 3; the entry is kept")
	if f.Ran.Load() != 1 {
		t.Errorf("handler ran %d times, want 1", f.Ran.Load())
	}

	f.Failing.Store(false) // the app is fixed
	_, body = f.post("/dlq/replay", url.Values{"id": {charge, malformed, gone, broken}})
	contains(t, "replay", body, "Replay of 4 entries: 1 replayed, 3 kept", "replayed", "the entry is deleted",
		"malformed message", "is not in the apps root any more", "the app is unavailable")
	if f.Ran.Load() != 2 {
		t.Errorf("handler ran %d times, want 2", f.Ran.Load())
	}
	if got := f.dlqIDs(); strings.Join(got, " ") != strings.Join([]string{malformed, gone, broken}, " ") {
		t.Errorf("entries left %v, want the three refused", got)
	}
	code, _ = f.post("/dlq/replay", nil)
	if code != http.StatusBadRequest {
		t.Errorf("empty selection: status %d, want 400", code)
	}
	code, _ = f.post("/dlq/replay", url.Values{"id": {"<x>"}})
	if code != http.StatusBadRequest {
		t.Errorf("bad id: status %d, want 400", code)
	}
}

// TestDLQReplayUndecodable: an entry the console cannot decode (written
// by hand) is refused with what is wrong with it, and the rest of the
// selection is still replayed: it is not the runtime that failed.
func TestDLQReplayUndecodable(t *testing.T) {
	f := newFixture(t)
	f.Failing.Store(false)
	bad, err := f.Redis.Do(t.Context(), f.Redis.B().Xadd().Key(f.Store.Key()).Id("*").FieldValue().
		FieldValue("original_stream", f.Stream).FieldValue("original_id", "1-0").FieldValue("app", "shop").
		FieldValue("handler", "orders.charge").FieldValue("event", "{}").FieldValue("reason", "x").
		FieldValue("deliveries", "NaN").FieldValue("handler_attempts", "1").Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	good := f.deadLetter("shop", "orders.charge", `{"kind":"order"}`, "exit 3")
	code, body := f.post("/dlq/replay", url.Values{"id": {bad, good}})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	contains(t, "replay", body, "Replay of 2 entries: 1 replayed, 1 kept", `field &#34;deliveries&#34;`, "remove it instead")
	lacks(t, "replay", body, "not tried", "the runtime could not run")
	if f.Ran.Load() != 1 {
		t.Errorf("handler ran %d times, want 1 (the decodable entry)", f.Ran.Load())
	}
	if n, err := f.Store.Len(t.Context()); err != nil || n != 1 {
		t.Errorf("%d entries left (%v), want only the undecodable %s", n, err, bad)
	}
}

// TestDLQReplayAfterTemplateFix loads the apps at each replay: an app
// whose template was broken replays once it is fixed, without a restart.
func TestDLQReplayAfterTemplateFix(t *testing.T) {
	f := newFixture(t)
	f.Failing.Store(false)
	f.writeTemplate("shop", strings.Replace(consoletest.ShopTemplate, "timeout: 5s", "timeout: soon", 1))
	id := f.deadLetter("shop", "orders.charge", `{"kind":"order"}`, "exit 3")
	_, body := f.post("/dlq/replay", url.Values{"id": {id}})
	contains(t, "broken template", body, "refused", "the app is unavailable")
	f.writeTemplate("shop", consoletest.ShopTemplate)
	_, body = f.post("/dlq/replay", url.Values{"id": {id}})
	contains(t, "fixed template", body, "Replay of 1 entry: 1 replayed")
	if ids := f.dlqIDs(); len(ids) != 0 {
		t.Errorf("entries left %v", ids)
	}
}

func TestDLQRemove(t *testing.T) {
	f := newFixture(t)
	a := f.deadLetter("shop", "orders.charge", `{}`, "exit 3")
	b := f.deadLetter("shop", "refunds.run", `{}`, "exit 1")
	c := f.deadLetter("shop", "refunds.run", `{}`, "exit 1")

	code, body := f.post("/dlq/remove", url.Values{"id": {a, b}})
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "confirmation", body, "Remove 2 dead-letter entries?", `name="confirm" value="yes"`, "Delete 2 entries",
		`name="id" value="`+a+`"`, `name="id" value="`+b+`"`)
	if len(f.dlqIDs()) != 3 {
		t.Fatal("the confirmation page deleted entries")
	}
	// An unknown id deletes nothing, like relay dlq rm ID...
	code, body = f.post("/dlq/remove", url.Values{"id": {a, "1-1"}, "confirm": {"yes"}})
	if code != http.StatusNotFound || !strings.Contains(body, "nothing deleted") || len(f.dlqIDs()) != 3 {
		t.Fatalf("unknown id: status %d, %d entries left", code, len(f.dlqIDs()))
	}
	_, body = f.post("/dlq/remove", url.Values{"id": {a, b}, "confirm": {"yes"}})
	contains(t, "removed", body, "Remove of 2 entries: 2 removed")
	if got := f.dlqIDs(); len(got) != 1 || got[0] != c {
		t.Errorf("entries left %v, want [%s]", got, c)
	}
	if f.Ran.Load() != 0 {
		t.Error("remove ran a handler")
	}
}

func TestReadOnly(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.ReadOnly = true })
	id := f.deadLetter("shop", "orders.charge", `{}`, "exit 3")
	s := "&stream=" + url.QueryEscape(f.Stream)
	for _, p := range []string{"/dlq?x=1" + s, "/dlq/entry?id=" + id + s} {
		_, body := f.get(p)
		contains(t, p, body, "read-only")
		lacks(t, p, body, "/dlq/replay", "/dlq/remove", `name="id"`)
	}
	for _, p := range []string{"/dlq/replay", "/dlq/remove"} {
		code, body := f.post(p, url.Values{"id": {id}, "confirm": {"yes"}})
		if code != http.StatusForbidden || !strings.Contains(body, "read-only") {
			t.Errorf("%s: status %d, want 403", p, code)
		}
	}
	if len(f.dlqIDs()) != 1 || f.Ran.Load() != 0 {
		t.Error("a read-only console changed the DLQ or ran a handler")
	}
}

func TestNoRunner(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.Runner = nil })
	id := f.deadLetter("shop", "orders.charge", `{}`, "exit 3")
	_, body := f.get("/dlq/entry?id=" + id + "&stream=" + url.QueryEscape(f.Stream))
	lacks(t, "entry", body, "/dlq/replay")
	contains(t, "entry", body, "/dlq/remove")
	if code, _ := f.post("/dlq/replay", url.Values{"id": {id}}); code != http.StatusForbidden {
		t.Errorf("replay without a runner: status %d", code)
	}
}

func TestPlayground(t *testing.T) {
	f := newFixture(t)
	code, body := f.post("/playground", url.Values{"event": {`{"kind":"order","amount":50,"id":"ord_7","created_at":"2026-01-01T00:00:00Z"}`}})
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "playground", body, "2 matching handlers, in dispatch order", "<code>shop/orders.stale</code> matched",
		"<code>shop/orders.charge</code> not matched", "<code>amount</code>: 50 is not &gt;= 100", "<code>kind</code>:",
		"<code>shop/refunds.run</code> not matched", "<code>broken/orders.audit</code> matched <span class=\"badge bad\">app unavailable</span>")

	// --now moves the cutoff of the temporal rule: an hour after the event
	// it is not yet stale.
	_, body = f.post("/playground", url.Values{"event": {`{"kind":"order","created_at":"2026-01-01T00:00:00Z"}`}, "now": {"2026-01-01T00:30:00Z"}})
	contains(t, "playground --now", body, "<code>shop/orders.stale</code> not matched", "at 2026-01-01 00:30:00Z")

	_, body = f.post("/playground", url.Values{"event": {`[1,2]`}})
	contains(t, "malformed", body, "malformed event", "one JSON object")
	_, body = f.post("/playground", url.Values{"event": {`{}`}, "now": {"noon"}})
	contains(t, "bad now", body, "want an RFC 3339 time")

	// Picking an event from the stream or the DLQ loads and evaluates it.
	id := f.Publish(`{"kind":"refund"}`)
	dl := f.deadLetter("shop", "orders.charge", `{"kind":"order","amount":100,"id":"ord_1"}`, "exit 3")
	s := "&stream=" + url.QueryEscape(f.Stream)
	_, body = f.get("/playground?id=" + id + s)
	contains(t, "from the stream", body, "from stream entry "+id, "<code>shop/refunds.run</code> matched", "/playground?id="+id)
	_, body = f.get("/playground?dlq=" + dl + s)
	contains(t, "from the DLQ", body, "from dead-letter entry "+dl, "<code>shop/orders.charge</code> matched", "/playground?dlq="+dl)
}

func TestLivePage(t *testing.T) {
	f := newFixture(t)
	f.record(stats.Event{Time: time.Now(), Consumer: "worker-1", MessageID: "1-1", App: "shop", Handler: "orders.charge",
		Outcome: "dead-lettered", Attempt: 3, MaxAttempts: 3, Reason: "exit 3", DLQID: "5-5"})
	code, body := f.get("/live?stream=" + url.QueryEscape(f.Stream))
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	contains(t, "live", body, `<span class="badge dead-lettered">dead-lettered</span>`, "<code>shop/orders.charge</code>",
		"3 of 3", `href="/dlq/entry?id=5-5`, `data-src="/live/events?after=`)
}

// TestLiveEvents reads the server-sent event stream: the outcomes after
// the cursor, then a new one as a worker records it.
func TestLiveEvents(t *testing.T) {
	f := newFixture(t)
	f.record(stats.Event{Time: time.Now(), MessageID: "1-1", App: "shop", Handler: "orders.charge", Outcome: "failed", Reason: "first"})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.HTTP.URL+"/live/events?after=0-0&stream="+url.QueryEscape(f.Stream), nil)
	resp, err := f.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Fatalf("Content-Type %q", ct)
	}
	lines := make(chan string, 100)
	go func() {
		buf := make([]byte, 4096)
		var acc string
		for {
			n, err := resp.Body.Read(buf)
			acc += string(buf[:n])
			for {
				i := strings.IndexByte(acc, '\n')
				if i < 0 {
					break
				}
				lines <- acc[:i]
				acc = acc[i+1:]
			}
			if err != nil {
				close(lines)
				return
			}
		}
	}()
	wait := func(want string) {
		t.Helper()
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("stream ended before %q", want)
				}
				if strings.HasPrefix(l, "data: ") && strings.Contains(l, want) {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no event with %q", want)
			}
		}
	}
	wait(`"reason":"first"`)
	f.record(stats.Event{Time: time.Now(), MessageID: "2-2", App: "shop", Handler: "refunds.run", Outcome: "succeeded", Reason: xss})
	wait(`"target":"shop/refunds.run"`)
}

// TestLiveEventsEndWithTheirReader: a reader that leaves (a closed tab)
// ends its feed's blocking read at once, rather than when the block times
// out (5 s), which held a stopping console's shutdown that long.
func TestLiveEventsEndWithTheirReader(t *testing.T) {
	f := newFixture(t)
	blockedReads := func() int {
		list, err := f.Redis.Do(t.Context(), f.Redis.B().ClientList().Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, line := range strings.Split(list, "\n") {
			if strings.Contains(line, " cmd=xread ") && strings.Contains(line, " flags=b ") {
				n++
			}
		}
		return n
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, f.HTTP.URL+"/live/events?stream="+url.QueryEscape(f.Stream), nil)
	resp, err := f.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	testutil.WaitFor(t, 10*time.Second, "the feed's read to block in Redis", func() bool { return blockedReads() == 1 })
	cancel()
	// Well under the read's 5 s block: the read ends with its reader.
	testutil.WaitFor(t, 3*time.Second, "the feed's blocked read to end with its reader", func() bool { return blockedReads() == 0 })
}

func TestErrorsAndNotFound(t *testing.T) {
	f := newFixture(t)
	if code, _ := f.get("/nope"); code != http.StatusNotFound {
		t.Errorf("unknown path: %d", code)
	}
	if code, _ := f.do(http.MethodDelete, "/dlq", nil); code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE /dlq: %d", code)
	}
	if _, err := console.New(console.Config{}); err == nil {
		t.Error("New accepted an empty config")
	}
	code, body := f.get("/assets/style.css")
	if code != http.StatusOK || !strings.Contains(body, "--accent") {
		t.Errorf("style.css: %d", code)
	}
	if code, _ := f.get("/assets/console.js"); code != http.StatusOK {
		t.Errorf("console.js: %d", code)
	}
}

// TestPagesWhileRedisIsDown stops the console's redis-server mid-session:
// every page answers at once (the client gives up on a refused connection,
// console.RetryDelay, instead of retrying until the request timeout) with
// the banner, what it could not read as ?, never 502; the live feed
// reports the error at once; and once Redis is back the pages show its
// figures without a restart.
func TestPagesWhileRedisIsDown(t *testing.T) {
	srv, rc, st := consoletest.StoppableRedis(t)
	// A request timeout far above what a page may take: a page that waits
	// for Redis to come back trips the client's timeout below.
	const requestTimeout = time.Minute
	c, err := console.New(console.Config{Redis: rc, Streams: []string{st}, Group: "shop",
		Apps:           template.Dir(testutil.AppsRoot(t, map[string]string{"shop": consoletest.ShopTemplate})),
		Runner:         runtime.NewFunc(map[string]runtime.HandlerFunc{}),
		RequestTimeout: requestTimeout, SampleInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(c)
	defer h.Close()
	jar, _ := cookiejar.New(nil)
	client := &http.Client{Jar: jar, Timeout: requestTimeout / 6}
	// Rates sampled before Redis stops must not pass for current ones.
	sctx, stopSampling := context.WithCancel(t.Context())
	defer stopSampling()
	go c.Sample(sctx)
	testutil.WaitFor(t, 5*time.Second, "a rate", func() bool {
		resp, err := client.Get(h.URL + "/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), "<td>received</td>\n      <td class=\"n\">0</td>\n      <td class=\"n\">0.0</td>")
	})
	resp, err := client.Get(h.URL + "/playground")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("with Redis up: %v %v", resp, err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	csrf := csrfRE.FindStringSubmatch(string(page))
	if csrf == nil {
		t.Fatal("no CSRF token on /playground")
	}
	srv.Stop()
	var slowest time.Duration
	get := func(p string) (int, string) {
		t.Helper()
		start := time.Now()
		resp, err := client.Get(h.URL + p)
		if err != nil {
			t.Fatalf("GET %s with Redis down: %v (it waited for Redis rather than saying it is unreachable)", p, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		slowest = max(slowest, time.Since(start))
		return resp.StatusCode, string(b)
	}
	// A replay runs for up to DefaultReplayTimeout, but reading its entry
	// must not wait for Redis that long.
	resp, err = client.PostForm(h.URL+"/dlq/replay", url.Values{"csrf": {csrf[1]}, "stream": {st}, "id": {"1-0", "2-0"}})
	if err != nil {
		t.Fatalf("POST /dlq/replay with Redis down: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	// The first read may meet the closed connection (EOF) rather than a
	// refused one.
	refused := regexp.MustCompile(`connection refused|EOF`)
	if body := string(b); !refused.MatchString(body) || !strings.Contains(body, "Redis could not be read, so the other 1 entry was not tried") {
		t.Errorf("POST /dlq/replay with Redis down: status %d, want the problem and the rest not tried in %s", resp.StatusCode, body)
	}
	const banner = `<div class="unreachable" role="alert"><b>Redis is unreachable</b>: `
	bodies := map[string]string{}
	for _, p := range []string{"/", "/dlq", "/dlq/entry?id=1-0", "/event?id=1-0", "/live", "/pending", "/playground"} {
		code, body := get(p)
		if !strings.Contains(body, banner) || !refused.MatchString(body) || !strings.Contains(body, "lost its connection") {
			t.Errorf("GET %s with Redis down: status %d, no banner naming the refused connection in %s", p, code, body)
		}
		if want := http.StatusOK; p == "/dlq/entry?id=1-0" || p == "/event?id=1-0" {
			if code != http.StatusServiceUnavailable {
				t.Errorf("GET %s with Redis down: status %d, want 503", p, code)
			}
		} else if code != want {
			t.Errorf("GET %s with Redis down: status %d, want %d", p, code, want)
		}
		bodies[p] = body
	}
	t.Logf("the slowest page with Redis down took %s", slowest)
	// What was not read is unknown, not zero: an empty queue it is not.
	for _, tile := range []string{"entries", "pending", "oldest pending", "dead letters"} {
		if want := `<span class="k">` + tile + `</span><span class="v">?</span>`; !strings.Contains(bodies["/"], want) {
			t.Errorf("overview with Redis down: tile %s is not shown as unknown (%s)", tile, want)
		}
	}
	for _, counter := range []string{"received", "matched", "unmatched", "malformed", "succeeded", "failed", "dead-lettered"} {
		contains(t, "overview with Redis down", bodies["/"], "<td>"+counter+"</td>\n      <td class=\"n\">?</td>\n      <td class=\"n\">?</td>")
	}
	lacks(t, "overview with Redis down", bodies["/"], "No consumers yet")
	contains(t, "dlq with Redis down", bodies["/dlq"], "? entries", "reading the dead-letter queue failed")
	lacks(t, "dlq with Redis down", bodies["/dlq"], "No dead-letter entries")
	lacks(t, "pending with Redis down", bodies["/pending"], "0 messages delivered", "Nothing pending")
	lacks(t, "playground with Redis down", bodies["/playground"], `<li class="muted">none</li>`)
	lctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	lreq, _ := http.NewRequestWithContext(lctx, http.MethodGet, h.URL+"/live/events", nil)
	live, err := http.DefaultClient.Do(lreq)
	if err != nil {
		t.Fatalf("GET /live/events with Redis down: %v", err)
	}
	defer live.Body.Close()
	readUntil := func(want string) {
		t.Helper()
		buf := make([]byte, 4096)
		var got string
		for !strings.Contains(got, want) {
			n, err := live.Body.Read(buf)
			got += string(buf[:n])
			if err != nil {
				t.Fatalf("live feed: %v after %q, want %q", err, got, want)
			}
		}
	}
	readUntil("event: problem")

	// Redis is back: the same console reads it, without the banner.
	srv.Restart(t)
	testutil.WaitFor(t, 10*time.Second, "the overview to read Redis again", func() bool {
		code, body := get("/")
		return code == http.StatusOK && !strings.Contains(body, banner) && strings.Contains(body, `<span class="k">entries</span><span class="v">0</span>`)
	})
	if code, body := get("/dlq?stream=" + url.QueryEscape(st)); code != http.StatusOK || strings.Contains(body, banner) || !strings.Contains(body, "No dead-letter entries") {
		t.Errorf("dead letters after Redis came back: status %d\n%s", code, body)
	}
	readUntil("event: recovered")
}

// TestAppsSecretsAndDeps shows an app's secret names (never values) and
// its dependency manifest, and the state of its dependency image as
// Config.Deps reports it: built, not built yet, or unknown with the
// error, escaped like other stored text.
func TestAppsSecretsAndDeps(t *testing.T) {
	root := testutil.AppsRoot(t, map[string]string{
		"vault": "runtime: python3\nsecrets: [db-password, api-key]\nevents:\n  - handler: handlers.run\n    pattern: {kind: [x]}\n",
		"plain": "runtime: python3\nevents:\n  - handler: handlers.run\n    pattern: {kind: [y]}\n",
	})
	if err := os.WriteFile(filepath.Join(root, "vault", "requirements.txt"), []byte("requests==2.32.3\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	built := time.Date(2026, 11, 30, 8, 15, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		deps func(context.Context, runtime.Spec) (console.DepsImage, error)
		want []string
	}{
		{"no containerd", nil, []string{`<span class="badge ">not looked up</span>`, "no containerd to ask"}},
		{"built", func(_ context.Context, spec runtime.Spec) (console.DepsImage, error) {
			if spec.Deps == nil || string(spec.Deps.ManifestData) != "requests==2.32.3\n" {
				return console.DepsImage{}, errors.New("asked without the manifest")
			}
			return console.DepsImage{Name: "relay.local/deps:0123abcd", Built: true, BuiltAt: built, BuildTime: 12340 * time.Millisecond, Size: 5 << 20}, nil
		}, []string{`<span class="badge good">built</span> <code>relay.local/deps:0123abcd</code>`, "5MiB compressed, built 2026-11-30 08:15:00Z in 12.3s"}},
		{"not built", func(context.Context, runtime.Spec) (console.DepsImage, error) {
			return console.DepsImage{Name: "relay.local/deps:0123abcd"}, nil
		}, []string{`<span class="badge warn">not built yet</span> <code>relay.local/deps:0123abcd</code>`, "the first start or invocation builds it"}},
		{"unknown", func(context.Context, runtime.Spec) (console.DepsImage, error) {
			return console.DepsImage{}, errors.New("containerd: " + xss + "\u202e\x1b[31m")
		}, []string{`<span class="badge warn">unknown</span>`, `containerd: &lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;\u202e\x1b[31m`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := appsPage(t, console.Config{Apps: template.Dir(root), Deps: tc.deps})
			contains(t, "apps", body, append([]string{
				`<dd class="secrets"><code>db-password</code>, <code>api-key</code> <span class="muted">(mounted at /run/secrets/NAME; values never shown)</span>`,
				`<dd class="deps"><code>requirements.txt</code> <span class="muted">(sha256 `,
			}, tc.want...)...)
			checkEscaped(t, "apps", body)
			// The app without secrets or a manifest says so.
			plain := body[strings.Index(body, `id="app-plain"`):strings.Index(body, `id="app-vault"`)]
			contains(t, "plain app", plain, `<dd class="secrets">-</dd>`, `<dd class="deps">-</dd>`)
			lacks(t, "plain app", plain, "dependency image")
		})
	}
}

// TestAppsDefaultImage: an app that sets runtime but no image shows the
// image it runs in, its runtime's default (Config.DefaultImage), as relay
// app inspect does; without DefaultImage, and for runtime: go, "-".
func TestAppsDefaultImage(t *testing.T) {
	root := testutil.AppsRoot(t, map[string]string{
		"py":  "runtime: python3\nevents:\n  - handler: handlers.run\n    pattern: {kind: [x]}\n",
		"own": "runtime: python3\nimage: relay.local/python3:bookworm\nevents:\n  - handler: handlers.run\n    pattern: {kind: [y]}\n",
	})
	for _, tc := range []struct {
		name  string
		image func(string) string
		want  string
	}{
		{"default", func(rt string) string { return map[string]string{"python3": "docker.io/library/python:3.12-slim"}[rt] },
			`<dt>image</dt><dd><code>docker.io/library/python:3.12-slim</code> <span class="muted">(the python3 default)</span></dd>`},
		{"no default", nil, `<dt>image</dt><dd><code>-</code></dd>`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := appsPage(t, console.Config{Apps: template.Dir(root), DefaultImage: tc.image})
			own := body[strings.Index(body, `id="app-own"`):strings.Index(body, `id="app-py"`)]
			py := body[strings.Index(body, `id="app-py"`):]
			contains(t, "app with its own image", own, `<dt>image</dt><dd><code>relay.local/python3:bookworm</code></dd>`)
			contains(t, "app with the runtime's image", py, tc.want)
		})
	}
}

// syncBuffer is a log destination a test reads while the console writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestDLQReplayPostRedirectGet: a replay answers with a redirect to its
// result, which reloads without replaying again; each replay that fails is
// added to the entry's history, which its page shows; the log names the
// ids replayed and removed.
func TestDLQReplayPostRedirectGet(t *testing.T) {
	var logs syncBuffer
	f := newFixture(t, func(c *console.Config) { c.Logger = slog.New(slog.NewTextHandler(&logs, nil)) })
	id := f.deadLetter("shop", "orders.charge", `{"kind":"order"}`, "handler exited with code 3: first failure")
	form := url.Values{"id": {id}, "csrf": {f.csrf()}, "stream": {f.Stream}}
	code, _ := f.do(http.MethodPost, "/dlq/replay", form)
	if code != http.StatusSeeOther || !strings.HasPrefix(f.Location, "/dlq/result?") {
		t.Fatalf("POST /dlq/replay: status %d to %q, want 303 to /dlq/result", code, f.Location)
	}
	result := f.Location
	for range 3 {
		code, body := f.get(result)
		if code != http.StatusOK {
			t.Fatalf("GET %s: status %d", result, code)
		}
		contains(t, "result page", body, "Replay of 1 entry: 0 replayed, 1 kept", "handler exited with code 3; the entry is kept",
			"replayed 1 time without success", "it does not act again")
	}
	if n := f.Ran.Load(); n != 1 {
		t.Errorf("the handler ran %d times after one replay and three loads of its result, want 1", n)
	}
	f.post("/dlq/replay", url.Values{"id": {id}})
	s := "&stream=" + url.QueryEscape(f.Stream)
	_, body := f.get("/dlq/entry?id=" + id + s)
	contains(t, "entry after two failed replays", body, "2 replays without success; the last",
		`<span class="badge failed">failed</span>`, "handler exited with code 3; the entry is kept",
		"first failure") // the reason it was dead-lettered with stays
	if code, body := f.get("/dlq/result?id=0123" + s); code != http.StatusNotFound || !strings.Contains(body, "no longer kept") {
		t.Errorf("an unknown result: status %d", code)
	}

	other := f.deadLetter("shop", "refunds.run", `{}`, "exit 1")
	f.Failing.Store(false)
	f.post("/dlq/replay", url.Values{"id": {id}})
	if h, err := f.Store.Replays(t.Context(), id); err != nil || h.Count != 0 {
		t.Errorf("the history of a replayed (deleted) entry: %+v, %v; want none", h, err)
	}
	f.post("/dlq/remove", url.Values{"id": {other}, "confirm": {"yes"}})
	out := logs.String()
	contains(t, "log", out, "msg=\"console: replay\"", "id="+id, "result=failed replays=1", "result=replayed",
		"msg=\"console: remove\"", "removed=1 ids=["+other+"]")
}

// TestSmallerFixes: an event whose invocation was dead-lettered links its
// entry and says "1 attempt"; a stale CSRF token answers with a page and
// keeps the playground's event; the overview counts malformed messages.
func TestSmallerFixes(t *testing.T) {
	f := newFixture(t)
	msg := f.Publish(`{"kind":"order"}`)
	entry, err := f.Store.Write(t.Context(), dlq.Entry{OriginalStream: f.Stream, OriginalID: msg, Group: f.Group, Consumer: "worker-1",
		Event: `{"kind":"order"}`, Reason: "exit 3", App: "shop", Handler: "orders.charge", Deliveries: 1, HandlerAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Redis.Do(t.Context(), f.Redis.B().Hset().Key(keys.Invocation(f.Stream, f.Group, msg)).FieldValue().
		FieldValue("shop/orders.charge", "exhausted:1:1700000000000:dlq").
		FieldValue(invocation.DLQField("shop/orders.charge"), entry).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s := "&stream=" + url.QueryEscape(f.Stream)
	_, body := f.get("/event?id=" + msg + s)
	contains(t, "event of a dead-lettered message", body, "after 1 attempt\n", `class="dlq-link"`, "/dlq/entry?id="+entry)
	lacks(t, "event of a dead-lettered message", body, "1 attempts")

	const event = `{"kind":"order","amount":7}`
	code, body := f.do(http.MethodPost, "/playground", url.Values{"stream": {f.Stream}, "event": {event}, "csrf": {strings.Repeat("0", 64)}})
	if code != http.StatusForbidden {
		t.Errorf("playground with a stale token: status %d, want 403", code)
	}
	contains(t, "playground with a stale token", body, "<nav>", "security token (CSRF) is missing or stale", "Press Evaluate again",
		"&#34;amount&#34;:7")
	if m := csrfRE.FindStringSubmatch(body); m == nil {
		t.Error("playground with a stale token: no fresh token to send again")
	}
	code, body = f.do(http.MethodPost, "/dlq/remove", url.Values{"stream": {f.Stream}, "id": {entry}})
	if code != http.StatusForbidden {
		t.Errorf("remove without a token: status %d", code)
	}
	contains(t, "remove without a token", body, "<!doctype html>", "<nav>", "reload the page and try again")

	r := redisstats.NewRecorder(f.Redis, f.Stream, f.Group)
	r.Add(stats.Received)
	r.Add(stats.Malformed)
	if err := r.Flush(t.Context()); err != nil {
		t.Fatal(err)
	}
	_, body = f.get("/")
	contains(t, "overview", body, "<td>malformed</td>\n      <td class=\"n\">1</td>")
}

// appsPage returns the Apps page of a console of cfg on a private Redis,
// stream "s" and group "g", which must answer 200.
func appsPage(t *testing.T, cfg console.Config) string {
	t.Helper()
	cfg.Redis, cfg.Streams, cfg.Group = redistest.Client(t), []string{"s"}, "g"
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h := httptest.NewServer(c)
	defer h.Close()
	code, body := getPage(t, h.URL, "/apps")
	if code != http.StatusOK {
		t.Fatalf("status %d", code)
	}
	return body
}
