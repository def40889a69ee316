package console_test

import (
	"context"
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
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// Hostile text: every page must show it as text.
const (
	xss       = `<script>alert("xss")</script>`
	xssURL    = `javascript:alert(1)`
	invalidU8 = "bad\xff\xfeutf8"
)

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
	client  *http.Client
	failing atomic.Bool // orders.charge fails while set
	ran     atomic.Int64
	// hold, when set, is received from before a handler returns.
	hold  atomic.Pointer[chan struct{}]
	store *redisdlq.Store
	cfg   console.Config
	// location is the Location of the last response, "" when none.
	location string
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
		if h := f.hold.Load(); h != nil {
			<-*h
		}
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
	jar, _ := cookiejar.New(nil)
	f.client = &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
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

// deliver reads every new entry as consumer, leaving it pending.
func (f *fixture) deliver(consumer string) {
	f.t.Helper()
	err := f.rc.Do(f.t.Context(), f.rc.B().Xreadgroup().Group(f.group, consumer).Count(1000).Streams().Key(f.stream).Id(">").Build()).Error()
	if err != nil && !rueidis.IsRedisNil(err) {
		f.t.Fatal(err)
	}
}

// deadLetter writes a DLQ entry as a worker does and returns its id.
func (f *fixture) deadLetter(app, handler, event, reason string) string {
	f.t.Helper()
	attempts := 3
	if app == dlq.MalformedName {
		attempts = 0
	}
	id, err := f.store.Write(f.t.Context(), dlq.Entry{OriginalStream: f.stream, OriginalID: f.publish(event), Group: f.group,
		Consumer: "worker-1", Event: event, Reason: reason, App: app, Handler: handler, Deliveries: 3, HandlerAttempts: attempts,
		Timestamp: time.Now()})
	if err != nil {
		f.t.Fatal(err)
	}
	return id
}

// claim records the state of an invocation as a worker does: attempt 1
// running, or failed with a retry due when retryIn > 0.
func (f *fixture) claim(msgID, field string, retryIn time.Duration) {
	f.t.Helper()
	st := redisstate.New(f.rc)
	key := invocation.Key{Stream: f.stream, Group: f.group, MessageID: msgID}
	r := st.Claim(f.t.Context(), []invocation.ClaimRequest{{Key: key, Field: field, Lease: time.Hour, MaxAttempts: 3}})
	if r[0].Err != nil {
		f.t.Fatal(r[0].Err)
	}
	if retryIn > 0 {
		s := invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Retry, Lease: r[0].Lease, Backoff: retryIn}}}
		if res := st.Settle(f.t.Context(), []invocation.Settlement{s}); res[0].Err != nil {
			f.t.Fatal(res[0].Err)
		}
	}
}

// get fetches a console path and returns the status and body.
func (f *fixture) get(path string) (int, string) {
	f.t.Helper()
	return f.do(http.MethodGet, path, nil)
}

func (f *fixture) do(method, path string, form url.Values, header ...string) (int, string) {
	f.t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(f.t.Context(), method, f.http.URL+path, body)
	if err != nil {
		f.t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := f.client.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.t.Fatal(err)
	}
	f.location = resp.Header.Get("Location")
	return resp.StatusCode, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// csrf loads a page with a form and returns its CSRF token.
func (f *fixture) csrf() string {
	f.t.Helper()
	code, body := f.get("/playground?stream=" + url.QueryEscape(f.stream))
	m := csrfRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		f.t.Fatalf("no CSRF token on the playground (status %d)", code)
	}
	return m[1]
}

// post submits a form with the CSRF token and the stream.
func (f *fixture) post(path string, form url.Values) (int, string) {
	f.t.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf", f.csrf())
	form.Set("stream", f.stream)
	code, body := f.do(http.MethodPost, path, form)
	if code == http.StatusSeeOther && strings.HasPrefix(f.location, "/dlq/result?") {
		// A replay or remove redirects to its result (POST-redirect-GET).
		return f.get(f.location)
	}
	return code, body
}

func (f *fixture) dlqIDs() []string {
	f.t.Helper()
	p, err := f.store.Page(f.t.Context(), dlq.PageQuery{Count: 1000})
	if err != nil {
		f.t.Fatal(err)
	}
	var out []string
	for _, e := range p.Entries {
		out = append(out, e.ID)
	}
	return out
}

// fixApps rewrites a template of the apps root.
func (f *fixture) writeTemplate(app, src string) {
	f.t.Helper()
	if err := os.WriteFile(filepath.Join(f.apps, app, "template.yaml"), []byte(src), 0o644); err != nil {
		f.t.Fatal(err)
	}
}

// record adds counters and feed events as a worker's redisstats.Recorder
// does.
func (f *fixture) record(evs ...stats.Event) {
	f.t.Helper()
	r := redisstats.NewRecorder(f.rc, f.stream, f.group)
	for range 5 {
		r.Add(stats.Received)
		r.Add(stats.Matched)
	}
	r.Add(stats.Failures)
	for _, ev := range evs {
		r.Record(ev)
	}
	if err := r.Flush(f.t.Context()); err != nil {
		f.t.Fatal(err)
	}
}

// contains fails the test unless body holds every want.
func contains(t *testing.T, what, body string, want ...string) {
	t.Helper()
	for _, w := range want {
		if !strings.Contains(body, w) {
			t.Errorf("%s: missing %q", what, w)
		}
	}
}

func lacks(t *testing.T, what, body string, bad ...string) {
	t.Helper()
	for _, b := range bad {
		if strings.Contains(body, b) {
			t.Errorf("%s: holds %q", what, b)
		}
	}
}

// httptestRecorder serves one request to h and returns the body.
func httptestRecorder(h http.Handler, method, path string) string {
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(method, "http://127.0.0.1"+path, nil))
	return w.Body.String()
}
