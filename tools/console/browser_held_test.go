package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
	"github.com/relaydev/relay/worker"
)

// missingImage is a Runner whose preparation of app billing fails as a
// missing image does, until fixed is set.
type missingImage struct {
	relay.Runner
	fixed atomic.Bool
}

func (m *missingImage) Prepare(_ context.Context, name string, _ runtime.Spec) error {
	if name == "billing" && !m.fixed.Load() {
		return fmt.Errorf("image relay.local/billing:2 is not in containerd (pull or import it)")
	}
	return nil
}

const (
	usersApp      = "image: x\nevents:\n  - {handler: users.created, pattern: {table_name: [users]}}\n"
	ordersTypo    = "image: x\nevents:\n  - handler: orders.new\n    pattern:\n      id: [{prefx: ord_}]\n"
	ordersFixed   = "image: x\nevents:\n  - handler: orders.new\n    pattern:\n      id: [{prefix: ord_}]\n"
	billingInvApp = "image: relay.local/billing:2\nevents:\n  - {handler: invoices.charge, pattern: {table_name: [invoices]}, retries: 4}\n"
)

// TestBrowserHeldMessages is the stalled stream of a bad day, in a real
// browser against a real worker: a new app whose pattern has a typo holds
// every message of the stream, and an app whose image is missing holds
// its invocations. The overview shows a banner naming both apps, the
// error's file:line:col and the messages held; the Pending page shows
// each held message and invocation as "held: <reason>" linking to the
// app, not as a failed attempt; the Apps page says what is held and why.
// Fixing both releases the messages and the banner goes.
func TestBrowserHeldMessages(t *testing.T) {
	b := tab{t, browser(t)}
	rc := redistest.Client(t)
	streamName := redistest.Name(t, "events")
	const group = "shop"
	apps := testutil.AppsRoot(t, map[string]string{"users": usersApp, "orders": ordersTypo, "billing": billingInvApp})
	ok := func(context.Context, runtime.Request) error { return nil }
	runner := &missingImage{Runner: runtime.NewFunc(map[string]runtime.HandlerFunc{
		"users/users.created": ok, "billing/invoices.charge": ok, "orders/orders.new": ok})}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	w, err := worker.New(worker.Config{Redis: rc, Streams: []string{streamName}, Group: group, Consumer: "worker-1",
		Apps: template.Dir(apps), Runner: runner, StateDir: t.TempDir(), PrepareRetry: 100 * time.Millisecond, PrepareWait: time.Second,
		Engine: relay.Config{Logger: quiet, StatsInterval: 50 * time.Millisecond, MinPendingIdle: 500 * time.Millisecond,
			ReclaimInterval: 100 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	runWorker(t, w)
	srv, err := console.New(console.Config{Redis: rc, Streams: []string{streamName}, Group: group, Apps: template.Dir(apps), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	defer hs.Close()

	src := redisstream.New(rc, streamName, group, "producer")
	var ids []string
	for _, ev := range []string{`{"table_name":"users","id":"u_1"}`, `{"table_name":"users","id":"u_2"}`, `{"table_name":"invoices","id":"in_1"}`} {
		id, err := src.Publish(t.Context(), map[string]string{"event": ev})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	testutil.WaitFor(t, 30*time.Second, "the worker to report both holds", func() bool {
		hs, _ := redisstats.ReadHolds(t.Context(), rc, streamName, group)
		return len(hs) == 2 && hs[0].App == "billing" && hs[0].Held == 1 && hs[1].App == "orders" && hs[1].Held == 3
	})

	// The overview: a banner naming both apps.
	b.run("open the overview", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`.held-banner`)))
	banner := b.text(`.held-banner`)
	for _, want := range []string{
		"app orders: its rules cannot all be read, so no message of stream " + streamName + " can be acknowledged",
		"3 messages held", `orders/template.yaml:5:13: events[0].pattern.id[0].prefx: unknown operator "prefx"`,
		"app billing: unavailable: its handlers do not run", "1 message held", "image relay.local/billing:2 is not in containerd",
	} {
		if !strings.Contains(banner, want) {
			t.Errorf("overview banner lacks %q:\n%s", want, banner)
		}
	}
	if n := b.count(`.held-banner a[href="/apps#app-orders"]`); n != 1 {
		t.Errorf("the banner has %d links to the orders app, want 1", n)
	}
	b.shot("held-overview")

	// Pending: every message held by orders; the invoice's charge held by
	// billing, not shown as a failed attempt.
	b.run("pending", chromedp.Navigate(hs.URL+"/pending?stream="+url.QueryEscape(streamName)), chromedp.WaitVisible(chromedp.CSS(`table.pending`)))
	if n := b.count(`table.pending tbody tr`); n != 3 {
		t.Fatalf("%d pending rows, want 3", n)
	}
	if n := b.count(`table.pending tbody tr .inv.held a[href="/apps#app-orders"]`); n != 3 {
		t.Errorf("%d rows held by orders, linking to it; want 3", n)
	}
	page := b.text(`table.pending`)
	if !strings.Contains(page, "held: rules of app orders cannot be read") ||
		!strings.Contains(page, "billing/invoices.charge held: app billing unavailable: ") || !strings.Contains(page, "no attempt charged") {
		t.Errorf("pending page does not show the held reasons:\n%s", page)
	}
	if strings.Contains(page, "attempt 0") || strings.Contains(page, "failed") {
		t.Errorf("pending page reads a held invocation as a failure:\n%s", page)
	}
	b.shot("held-pending")

	// Apps: what each app holds, and why.
	b.run("apps", chromedp.Navigate(hs.URL+"/apps"), chromedp.WaitVisible(chromedp.CSS(`#app-orders`)))
	if got := b.text(`#app-orders`); !strings.Contains(got, "holding messages") || !strings.Contains(got, "3 messages held") ||
		!strings.Contains(got, "no message of the stream is acknowledged") {
		t.Errorf("apps page, orders:\n%s", got)
	}
	if got := b.text(`#app-billing`); !strings.Contains(got, "holding messages") || !strings.Contains(got, "is not in containerd") {
		t.Errorf("apps page, billing:\n%s", got)
	}
	b.shot("held-apps")

	// The playground tries the rules it can read, and names the app it
	// cannot try with its error.
	b.run("playground", chromedp.Navigate(hs.URL+"/playground?stream="+url.QueryEscape(streamName)+"&id="+ids[0]),
		chromedp.WaitVisible(chromedp.CSS(`div.rule`)))
	if got := b.text(`main`); !strings.Contains(got, "users/users.created matched") ||
		!strings.Contains(got, "App orders is left out: some of its rules cannot be read") || !strings.Contains(got, `orders/template.yaml:5:13: events[0].pattern.id[0].prefx: unknown operator "prefx"`) {
		t.Errorf("playground:\n%s", got)
	}

	// The fix releases everything; the banner goes.
	runner.fixed.Store(true)
	if err := os.WriteFile(filepath.Join(apps, "orders", "template.yaml"), []byte(ordersFixed), 0o644); err != nil {
		t.Fatal(err)
	}
	w.Reload()
	testutil.WaitFor(t, 30*time.Second, "the messages released", func() bool {
		n, _, err := src.Pending(t.Context())
		hs, _ := redisstats.ReadHolds(t.Context(), rc, streamName, group)
		return err == nil && n == 0 && len(hs) == 0
	})
	b.run("the overview after the fix", chromedp.Navigate(hs.URL+"/"), chromedp.WaitVisible(chromedp.CSS(`.tiles`)))
	if n := b.count(`.held-banner`); n != 0 {
		t.Errorf("the banner is still shown after the fix")
	}
}

// runWorker runs w until the test ends.
func runWorker(t *testing.T, w *worker.Worker) {
	t.Helper()
	ctx, stop := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
}
