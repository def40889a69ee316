// Package consoletest is the fixture of package console's tests: a
// console on a real redis-server, with apps on disk and a Func runner
// whose handlers a test can fix, and the helpers that seed its stream and
// dead-letter queue. It is a package rather than a _test.go file because
// the console's browser tests live in the tools module (tools/console),
// so that chromedp stays out of the library's go.mod, and a test cannot
// import another package's test files: console's own tests and the
// browser tests share it from here. It must not import chromedp.
package consoletest

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
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

// ShopTemplate is the template of app shop in a Fixture's apps root:
// orders.charge (big orders with an ord_ id, 2 retries), refunds.run,
// orders.stale (old orders, no handler in the runner) and a schedule.
const ShopTemplate = `image: relay.local/busybox:latest
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

// BrokenTemplate is the template of app broken in a Fixture's apps root:
// its rule matches every order, but its timeout is invalid.
const BrokenTemplate = `image: relay.local/busybox:latest
command: ["/bin/sh", "/app/handler.sh"]
events:
  - handler: orders.audit
    pattern:
      kind: [order]
    timeout: forever
`

// Fixture is a console on a real redis-server (redistest), with the apps
// shop and broken on disk and a Func runner for shop/orders.charge and
// shop/refunds.run whose outcome a test sets with Failing. Its fields are
// exported for the helpers each test package adds around it.
type Fixture struct {
	T      *testing.T
	Redis  rueidis.Client
	Stream string // the source stream, with the consumer group Group
	Group  string
	Apps   string // the apps root
	Server *console.Server
	HTTP   *httptest.Server // serves Server
	// Client keeps cookies and does not follow redirects.
	Client  *http.Client
	Failing atomic.Bool  // the handlers fail (exit code 3) while set; set at first
	Ran     atomic.Int64 // how many times a handler ran
	// Hold, when set, is received from before a handler returns.
	Hold   atomic.Pointer[chan struct{}]
	Store  *redisdlq.Store // the dead-letter queue of Stream
	Config console.Config  // the console's configuration, after the options
	// Location is the Location of the last response a test read with
	// Client, "" when none; the test's own request helpers set it.
	Location string
}

// Option changes the console's configuration before New starts it.
type Option func(*console.Config)

// New starts a Fixture for t on a new stream of the test's redis-server;
// it stops at the end of the test.
func New(t *testing.T, opts ...Option) *Fixture {
	t.Helper()
	f := &Fixture{T: t, Redis: redistest.Client(t), Group: "shop"}
	f.Stream = redistest.Name(t, "events")
	f.Apps = testutil.AppsRoot(t, map[string]string{"shop": ShopTemplate, "broken": BrokenTemplate})
	f.Failing.Store(true)
	fail := func(ctx context.Context, req runtime.Request) error {
		f.Ran.Add(1)
		if h := f.Hold.Load(); h != nil {
			<-*h
		}
		if f.Failing.Load() {
			return &runtime.ExitError{Code: 3}
		}
		return nil
	}
	runner := runtime.NewFunc(map[string]runtime.HandlerFunc{
		"shop/orders.charge": fail,
		"shop/refunds.run":   fail,
	})
	src := redisstream.New(f.Redis, f.Stream, f.Group, "worker-1")
	if err := src.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.Store = redisdlq.NewStore(f.Redis, f.Stream)
	f.Config = console.Config{Redis: f.Redis, Streams: []string{f.Stream}, Group: f.Group, Apps: template.Dir(f.Apps),
		Runner: runner, DLQRetention: 336 * time.Hour, SampleInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	for _, o := range opts {
		o(&f.Config)
	}
	srv, err := console.New(f.Config)
	if err != nil {
		t.Fatal(err)
	}
	f.Server = srv
	f.HTTP = httptest.NewServer(srv)
	t.Cleanup(f.HTTP.Close)
	jar, _ := cookiejar.New(nil)
	f.Client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return f
}

// Publish adds an event to the stream, with the field-value pairs of
// extra, and returns its id.
func (f *Fixture) Publish(event string, extra ...string) string {
	f.T.Helper()
	cmd := f.Redis.B().Xadd().Key(f.Stream).Id("*").FieldValue().FieldValue("event", event)
	for i := 0; i+1 < len(extra); i += 2 {
		cmd = cmd.FieldValue(extra[i], extra[i+1])
	}
	id, err := f.Redis.Do(f.T.Context(), cmd.Build()).ToString()
	if err != nil {
		f.T.Fatal(err)
	}
	return id
}

// WriteDLQ writes n dead letters, one a second up to now, entry i (from
// 0, oldest first) with the app, handler, reason and event of at(i); it
// returns their ids, oldest first. It writes the fields a worker writes,
// in one pipeline, so that a test can have thousands.
func (f *Fixture) WriteDLQ(n int, at func(i int) (app, handler, reason, event string)) []string {
	f.T.Helper()
	now := time.Now().UnixMilli()
	ids := make([]string, n)
	cmds := make(rueidis.Commands, 0, n)
	for i := range n {
		app, handler, reason, event := at(i)
		ms := now - int64(n-1-i)*1000
		ids[i] = fmt.Sprintf("%d-0", ms)
		cmds = append(cmds, f.Redis.B().Xadd().Key(f.Store.Key()).Id(ids[i]).FieldValue().
			FieldValue("original_stream", f.Stream).FieldValue("original_id", fmt.Sprintf("%d-7", i+1)).
			FieldValue("group", f.Group).FieldValue("consumer", "worker-1").FieldValue("event", event).
			FieldValue("reason", reason).FieldValue("app", app).FieldValue("handler", handler).
			FieldValue("deliveries", "3").FieldValue("handler_attempts", "3").
			FieldValue("timestamp", time.UnixMilli(ms).UTC().Format(time.RFC3339Nano)).Build())
	}
	for _, r := range f.Redis.DoMulti(f.T.Context(), cmds...) {
		if err := r.Error(); err != nil {
			f.T.Fatal(err)
		}
	}
	return ids
}

// FillDLQ writes n dead letters with ids one second apart, the newest
// now: entry i (1..n) is app shop when i is even, else billing, handler
// refunds.run when i%4 == 0, else orders.charge, its event names customer
// c_<i>, its original id <i>-7. It returns the ids, oldest first.
func (f *Fixture) FillDLQ(n int) []string {
	f.T.Helper()
	return f.WriteDLQ(n, func(i0 int) (app, handler, reason, event string) {
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

// BacktestStream fills the stream with entries of known content, oldest
// first, and returns the ids of the small orders, newest first: 7 big
// orders (shop/orders.charge), 4 small ones, 3 refunds
// (shop/refunds.run), 2 events no rule matches, one entry that is not
// JSON and one without an event field. broken/orders.audit matches all 11
// orders; nothing has the created_at of shop/orders.stale.
func (f *Fixture) BacktestStream() (small []string) {
	f.T.Helper()
	for i := range 7 {
		f.Publish(fmt.Sprintf(`{"kind":"order","amount":150,"id":"ord_%d"}`, i))
	}
	for i := range 4 {
		small = append([]string{f.Publish(fmt.Sprintf(`{"kind":"order","amount":20,"id":"ord_s%d"}`, i))}, small...)
	}
	for range 3 {
		f.Publish(`{"kind":"refund"}`)
	}
	f.Publish(`{"kind":"other"}`)
	f.Publish(`{"kind":"other"}`)
	f.Publish(`nope`)
	if err := f.Redis.Do(f.T.Context(), f.Redis.B().Xadd().Key(f.Stream).Id("*").FieldValue().FieldValue("payload", "{}").Build()).Error(); err != nil {
		f.T.Fatal(err)
	}
	return small
}

// StoppableRedis starts a private redis-server that a test may stop, and
// returns it, a client made as relay console makes its own
// (console.RetryDelay), and a stream with the group shop.
func StoppableRedis(t *testing.T) (*redistest.Server, rueidis.Client, string) {
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
