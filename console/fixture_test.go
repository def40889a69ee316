package console_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// Hostile text: every page must show it as text.
const (
	xss       = `<script>alert("xss")</script>`
	xssURL    = `javascript:alert(1)`
	invalidU8 = "bad\xff\xfeutf8"
)

// fixture is the shared console fixture (internal/consoletest, which the
// browser tests in tools/console use too), with the helpers of these tests
// that send requests and write the state of workers.
type fixture struct{ *consoletest.Fixture }

func newFixture(t *testing.T, opts ...consoletest.Option) *fixture {
	t.Helper()
	return &fixture{consoletest.New(t, opts...)}
}

// deliver reads every new entry as consumer, leaving it pending.
func (f *fixture) deliver(consumer string) {
	f.T.Helper()
	err := f.Redis.Do(f.T.Context(), f.Redis.B().Xreadgroup().Group(f.Group, consumer).Count(1000).Streams().Key(f.Stream).Id(">").Build()).Error()
	if err != nil && !rueidis.IsRedisNil(err) {
		f.T.Fatal(err)
	}
}

// deadLetter writes a DLQ entry as a worker does and returns its id.
func (f *fixture) deadLetter(app, handler, event, reason string) string {
	f.T.Helper()
	attempts := 3
	if app == dlq.MalformedName {
		attempts = 0
	}
	id, err := f.Store.Write(f.T.Context(), dlq.Entry{OriginalStream: f.Stream, OriginalID: f.Publish(event), Group: f.Group,
		Consumer: "worker-1", Event: event, Reason: reason, App: app, Handler: handler, Deliveries: 3, HandlerAttempts: attempts,
		Timestamp: time.Now()})
	if err != nil {
		f.T.Fatal(err)
	}
	return id
}

// claim records the state of an invocation as a worker does: attempt 1
// running, or failed with a retry due when retryIn > 0.
func (f *fixture) claim(msgID, field string, retryIn time.Duration) {
	f.T.Helper()
	st := redisstate.New(f.Redis)
	key := invocation.Key{Stream: f.Stream, Group: f.Group, MessageID: msgID}
	r := st.Claim(f.T.Context(), []invocation.ClaimRequest{{Key: key, Field: field, Lease: time.Hour, MaxAttempts: 3}})
	if r[0].Err != nil {
		f.T.Fatal(r[0].Err)
	}
	if retryIn > 0 {
		s := invocation.Settlement{Key: key, Transitions: []invocation.Transition{{Kind: invocation.Retry, Lease: r[0].Lease, Backoff: retryIn}}}
		if res := st.Settle(f.T.Context(), []invocation.Settlement{s}); res[0].Err != nil {
			f.T.Fatal(res[0].Err)
		}
	}
}

// get fetches a console path and returns the status and body.
func (f *fixture) get(path string) (int, string) {
	f.T.Helper()
	return f.do(http.MethodGet, path, nil)
}

func (f *fixture) do(method, path string, form url.Values, header ...string) (int, string) {
	f.T.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(f.T.Context(), method, f.HTTP.URL+path, body)
	if err != nil {
		f.T.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		f.T.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		f.T.Fatal(err)
	}
	f.Location = resp.Header.Get("Location")
	return resp.StatusCode, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]{64})"`)

// csrf loads a page with a form and returns its CSRF token.
func (f *fixture) csrf() string {
	f.T.Helper()
	code, body := f.get("/playground?stream=" + url.QueryEscape(f.Stream))
	m := csrfRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		f.T.Fatalf("no CSRF token on the playground (status %d)", code)
	}
	return m[1]
}

// post submits a form with the CSRF token and the stream.
func (f *fixture) post(path string, form url.Values) (int, string) {
	f.T.Helper()
	if form == nil {
		form = url.Values{}
	}
	form.Set("csrf", f.csrf())
	form.Set("stream", f.Stream)
	code, body := f.do(http.MethodPost, path, form)
	if code == http.StatusSeeOther && strings.HasPrefix(f.Location, "/dlq/result?") {
		// A replay or remove redirects to its result (POST-redirect-GET).
		return f.get(f.Location)
	}
	return code, body
}

func (f *fixture) dlqIDs() []string {
	f.T.Helper()
	p, err := f.Store.Page(f.T.Context(), dlq.PageQuery{Count: 1000})
	if err != nil {
		f.T.Fatal(err)
	}
	var out []string
	for _, e := range p.Entries {
		out = append(out, e.ID)
	}
	return out
}

// fixApps rewrites a template of the apps root.
func (f *fixture) writeTemplate(app, src string) {
	f.T.Helper()
	if err := os.WriteFile(filepath.Join(f.Apps, app, "template.yaml"), []byte(src), 0o644); err != nil {
		f.T.Fatal(err)
	}
}

// record adds counters and feed events as a worker's redisstats.Recorder
// does.
func (f *fixture) record(evs ...stats.Event) {
	f.T.Helper()
	r := redisstats.NewRecorder(f.Redis, f.Stream, f.Group)
	for range 5 {
		r.Add(stats.Received)
		r.Add(stats.Matched)
	}
	r.Add(stats.Failures)
	for _, ev := range evs {
		r.Record(ev)
	}
	if err := r.Flush(f.T.Context()); err != nil {
		f.T.Fatal(err)
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
