package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/internal/consoletest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

// connector is a Config.Connect for addr that counts its calls and names
// the address in its error, as relay console does.
type connector struct {
	addr  string
	calls atomic.Int32
}

func (c *connector) connect(context.Context) (rueidis.Client, error) {
	c.calls.Add(1)
	rc, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{c.addr}, DisableCache: true})
	if err != nil {
		return nil, fmt.Errorf("connect to Redis at %s: %w", c.addr, err)
	}
	return rc, nil
}

// getPage fetches path from the console at base; a request that hangs
// fails the test after 30 s, far above the console's RequestTimeout.
func getPage(t *testing.T, base, path string) (int, string) {
	t.Helper()
	client := &http.Client{Timeout: 30 * time.Second}
	resp, err := client.Get(base + path)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestStartWhileRedisIsDown starts a console (Config.Connect) while its
// redis-server is stopped: every page answers at once with a banner
// naming the address and the error, and its figures unknown. Once Redis
// is back, the same console shows real figures: no restart.
func TestStartWhileRedisIsDown(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	srv.Stop()
	conn := &connector{addr: srv.Addr}
	st := redistest.Name(t, "events")
	c, err := console.New(console.Config{Connect: conn.connect, Streams: []string{st}, Group: "shop",
		Apps:           template.Dir(testutil.AppsRoot(t, map[string]string{"shop": consoletest.ShopTemplate})),
		RequestTimeout: time.Second, ReconnectInterval: 20 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h := httptest.NewServer(c)
	t.Cleanup(h.Close)

	banner := `<div class="unreachable" role="alert"><b>Redis is unreachable</b>: connect to Redis at ` + srv.Addr + `: dial tcp ` + srv.Addr + `: connect: connection refused.`
	bodies := map[string]string{}
	for _, p := range []string{"/", "/apps", "/pending", "/dlq", "/dlq/entry?id=1-0", "/event?id=1-0", "/playground", "/live"} {
		code, body := getPage(t, h.URL, p)
		if !strings.Contains(body, banner) {
			t.Errorf("GET %s with Redis down since the start: status %d, no banner %q in\n%s", p, code, banner, body)
		}
		bodies[p] = body
		if p == "/" || p == "/apps" || p == "/pending" || p == "/playground" || p == "/live" {
			if code != http.StatusOK {
				t.Errorf("GET %s with Redis down since the start: status %d, want 200", p, code)
			}
		}
	}
	for _, tile := range []string{"entries", "pending", "oldest pending", "dead letters"} {
		if want := `<span class="k">` + tile + `</span><span class="v">?</span>`; !strings.Contains(bodies["/"], want) {
			t.Errorf("overview with Redis down since the start: tile %s is not shown as unknown (%s)", tile, want)
		}
	}
	lacks(t, "pending with Redis down since the start", bodies["/pending"], "0 messages delivered", "Nothing pending")
	// The apps page needs no Redis: the apps are all there.
	contains(t, "apps with Redis down since the start", bodies["/apps"], "orders.charge", "reports.nightly")
	if n := conn.calls.Load(); n == 0 {
		t.Error("Connect was never called")
	}

	srv.Restart(t)
	rc := redistest.Connect(t, srv.Addr)
	if err := redisstream.New(rc, st, "shop", "worker-1").EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := rc.Do(t.Context(), rc.B().Xadd().Key(st).Id("*").FieldValue().FieldValue("event", `{"kind":"order"}`).Build()).Error(); err != nil {
			t.Fatal(err)
		}
	}
	var body string
	testutil.WaitFor(t, 10*time.Second, "the console to reach Redis again", func() bool {
		var code int
		code, body = getPage(t, h.URL, "/")
		return code == http.StatusOK && strings.Contains(body, `<span class="k">entries</span><span class="v">3</span>`)
	})
	lacks(t, "overview after Redis came back", body, `class="unreachable"`, "connection refused")
	if code, body := getPage(t, h.URL, "/dlq"); code != http.StatusOK || strings.Contains(body, `class="unreachable"`) {
		t.Errorf("dead letters after Redis came back: status %d\n%s", code, body)
	}
}

// TestConnectPaced checks that a console without Redis calls Connect at
// most once per ReconnectInterval, however many pages are asked for, and
// that Config takes a client or Connect, not both.
func TestConnectPaced(t *testing.T) {
	var calls atomic.Int32
	c, err := console.New(console.Config{Streams: []string{"s"}, Group: "g",
		Connect: func(context.Context) (rueidis.Client, error) {
			calls.Add(1)
			return nil, errors.New("connect to Redis at 192.0.2.1:6379: i/o timeout")
		},
		Apps:              template.Dir(testutil.AppsRoot(t, map[string]string{"shop": consoletest.ShopTemplate})),
		ReconnectInterval: time.Hour, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	h := httptest.NewServer(c)
	t.Cleanup(h.Close)
	for range 5 {
		code, body := getPage(t, h.URL, "/")
		if code != http.StatusOK || !strings.Contains(body, "192.0.2.1:6379: i/o timeout") {
			t.Fatalf("overview: status %d, no connect error in\n%s", code, body)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("Connect called %d times within ReconnectInterval, want 1", n)
	}

	rc := redistest.Client(t)
	_, err = console.New(console.Config{Redis: rc, Streams: []string{"s"}, Group: "g",
		Connect: func(context.Context) (rueidis.Client, error) { return rc, nil },
		Apps:    template.Dir(t.TempDir())})
	if !errors.Is(err, console.ErrConfig) {
		t.Errorf("New with both Redis and Connect: %v, want ErrConfig", err)
	}
}
