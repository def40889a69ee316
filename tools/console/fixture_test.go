package console_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream/redisstream"
)

// The browser tests of package console are in the tools module, so that
// chromedp stays out of the library's go.mod. They cannot use the helpers
// of console's own tests, so this file holds the part of them they use,
// as they are there (console/fixture_test.go, dlqscale_test.go,
// backtest_test.go and pages_test.go): change both together.

func TestMain(m *testing.M) { redistest.Main(m) }

const shopTemplate = `image: relay.local/busybox:latest
command: ["/bin/sh", "/app/handler.sh"]
concurrency: 3
env:
  API_TOKEN: s3cret-token-value
events:
  - handler: orders.charge
    pattern:
      kind: [order]
      amount: [{gte: 100}]
      id: [{prefix: "ord_"}]
    timeout: 5s
    retries: 2
  - handler: refunds.run
    pattern:
      kind: [refund]
  - handler: orders.stale
    pattern:
      kind: [order]
      created_at: [{lt: "now()-1h"}]
schedules:
  - name: nightly
    handler: reports.nightly
    cron: "0 3 * * *"
    timezone: Europe/Paris
`

const brokenTemplate = `image: relay.local/busybox:latest
command: ["/bin/sh", "/app/handler.sh"]
events:
  - handler: orders.audit
    pattern:
      kind: [order]
    timeout: forever
`

// fixture is a console on a real redis-server, with apps on disk and a
// Func runner whose handlers a test can fix.
type fixture struct {
	t       *testing.T
	rc      rueidis.Client
	stream  string
	group   string
	apps    string
	srv     *console.Server
	http    *httptest.Server
	failing atomic.Bool // orders.charge fails while set
	ran     atomic.Int64
	store   *redisdlq.Store
	cfg     console.Config
}

type fixtureOpt func(*console.Config)

func newFixture(t *testing.T, opts ...fixtureOpt) *fixture {
	t.Helper()
	f := &fixture{t: t, rc: redistest.Client(t), group: "shop"}
	f.stream = redistest.Name(t, "events")
	f.apps = testutil.AppsRoot(t, map[string]string{"shop": shopTemplate, "broken": brokenTemplate})
	f.failing.Store(true)
	fail := func(ctx context.Context, req runtime.Request) error {
		f.ran.Add(1)
		if f.failing.Load() {
			return &runtime.ExitError{Code: 3}
		}
		return nil
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"shop/orders.charge": fail,
		"shop/refunds.run":   fail,
	})
	src := redisstream.New(f.rc, f.stream, f.group, "worker-1")
	if err := src.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.store = redisdlq.NewStore(f.rc, f.stream)
	f.cfg = console.Config{Redis: f.rc, Streams: []string{f.stream}, Group: f.group, Apps: template.Dir(f.apps),
		Runner: runner, DLQRetention: 336 * time.Hour, SampleInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(&f.cfg)
	}
	srv, err := console.New(f.cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.srv = srv
	f.http = httptest.NewServer(srv)
	t.Cleanup(f.http.Close)
	return f
}

// publish adds an event to the stream and returns its id.
func (f *fixture) publish(event string, extra ...string) string {
	f.t.Helper()
	cmd := f.rc.B().Xadd().Key(f.stream).Id("*").FieldValue().FieldValue("event", event)
	for i := 0; i+1 < len(extra); i += 2 {
		cmd = cmd.FieldValue(extra[i], extra[i+1])
	}
	id, err := f.rc.Do(f.t.Context(), cmd.Build()).ToString()
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

func lacks(t *testing.T, what, body string, bad ...string) {
	t.Helper()
	for _, b := range bad {
		if strings.Contains(body, b) {
			t.Errorf("%s: holds %q", what, b)
		}
	}
}

// fillDLQ writes n dead letters with ids one second apart, the newest
// now: entry i (1..n) is app shop when i is even, else billing, handler
// refunds.run when i%4 == 0, else orders.charge, its event names customer
// c_<i>, its original id <i>-7. It returns the ids, oldest first.
func (f *fixture) fillDLQ(n int) []string {
	f.t.Helper()
	return f.writeDLQ(n, func(i0 int) (app, handler, reason, event string) {
		i := i0 + 1
		app, handler = "billing", "orders.charge"
		if i%2 == 0 {
			app = "shop"
		}
		if i%4 == 0 {
			handler = "refunds.run"
		}
		return app, handler, "handler exited with code 3", fmt.Sprintf(`{"kind":"order","customer":"c_%d"}`, i)
	})
}

// backtestStream fills the fixture's stream with entries of known content,
// oldest first, and returns the ids of the small orders, newest first:
// 7 big orders (shop/orders.charge), 4 small ones, 3 refunds
// (shop/refunds.run), 2 events no rule matches, one entry that is not
// JSON and one without an event field. broken/orders.audit matches all 11
// orders; nothing has the created_at of shop/orders.stale.
func backtestStream(f *fixture) (small []string) {
	f.t.Helper()
	for i := range 7 {
		f.publish(fmt.Sprintf(`{"kind":"order","amount":150,"id":"ord_%d"}`, i))
	}
	for i := range 4 {
		small = append([]string{f.publish(fmt.Sprintf(`{"kind":"order","amount":20,"id":"ord_s%d"}`, i))}, small...)
	}
	for range 3 {
		f.publish(`{"kind":"refund"}`)
	}
	f.publish(`{"kind":"other"}`)
	f.publish(`{"kind":"other"}`)
	f.publish(`nope`)
	if err := f.rc.Do(f.t.Context(), f.rc.B().Xadd().Key(f.stream).Id("*").FieldValue().FieldValue("payload", "{}").Build()).Error(); err != nil {
		f.t.Fatal(err)
	}
	return small
}

// stoppableRedis starts a private redis-server that a test may stop, and
// returns it, a client made as relay console makes its own
// (console.RetryDelay), and a stream with the group shop.
func stoppableRedis(t *testing.T) (*redistest.Server, rueidis.Client, string) {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr}, DisableCache: true, RetryDelay: console.RetryDelay})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rc.Close)
	st := redistest.Name(t, "events")
	if err := redisstream.New(rc, st, "shop", "worker-1").EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return srv, rc, st
}
