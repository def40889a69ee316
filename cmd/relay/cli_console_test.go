package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/internal/depstest"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

// TestCLIConsoleRefuses checks the settings relay console refuses before
// it connects: an address off loopback without a token, a bad address.
func TestCLIConsoleRefuses(t *testing.T) {
	isolateEnv(t)
	t.Setenv("REDIS_URI", "127.0.0.1:1")
	t.Setenv("REDIS_STREAM", "a,b")
	t.Setenv("REDIS_GROUP", "g")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--listen", "0.0.0.0:8089"}, "is not a loopback address: set RELAY_CONSOLE_TOKEN"},
		{[]string{"--listen", "8089"}, "want HOST:PORT"},
		{[]string{"--dlq-retention=-1h"}, "--dlq-retention must be >= 0"},
	} {
		r := relayCLI(t, "", append([]string{"console"}, tc.args...)...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("relay console %v: exit %d, stderr %q; want exit 2 with %q", tc.args, r.code, r.stderr, tc.want)
		}
	}
	// Off loopback a short token is refused: it would fall to guessing.
	t.Setenv("RELAY_CONSOLE_TOKEN", "hunter2")
	if r := relayCLI(t, "", "console", "--listen", "0.0.0.0:8089"); r.code != exitUsage ||
		!strings.Contains(r.stderr, "RELAY_CONSOLE_TOKEN has 7 characters: off loopback (--listen 0.0.0.0:8089) it needs at least 16") {
		t.Errorf("relay console with a 7-character token off loopback: exit %d, stderr %q", r.code, r.stderr)
	}
	isolateEnv(t)
	if r := relayCLI(t, "", "console"); r.code != exitUsage || !strings.Contains(r.stderr, "missing required configuration") {
		t.Errorf("relay console without settings: exit %d, stderr %q", r.code, r.stderr)
	}
}

// TestServedAt: the address printed is the host given, with the port
// bound: Go reports a listener on 0.0.0.0 as [::].
func TestServedAt(t *testing.T) {
	for _, tc := range []struct{ host, addr, want string }{
		{"0.0.0.0", "[::]:7313", "0.0.0.0:7313"},
		{"127.0.0.1", "127.0.0.1:40001", "127.0.0.1:40001"},
		{"::1", "[::1]:8089", "[::1]:8089"},
		{"localhost", "127.0.0.1:8089", "localhost:8089"},
	} {
		addr, err := net.ResolveTCPAddr("tcp", tc.addr)
		if err != nil {
			t.Fatal(err)
		}
		if got := servedAt(tc.host, addr); got != tc.want {
			t.Errorf("servedAt(%q, %s) = %q, want %q", tc.host, tc.addr, got, tc.want)
		}
	}
}

// TestCLIConsole serves two streams, with a token, until it is stopped.
func TestCLIConsole(t *testing.T) {
	isolateEnv(t)
	rc := redistest.Client(t)
	a, b := redistest.Name(t, "a"), redistest.Name(t, "b")
	for _, s := range []string{a, b} {
		if err := redisstream.New(rc, s, "g", "c").EnsureGroup(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("REDIS_URI", "redis://:"+"hunter2@"+redistest.Addr(t))
	t.Setenv("REDIS_STREAM", a+","+b)
	t.Setenv("REDIS_GROUP", "g")
	t.Setenv("RELAY_APPS", cliApps(t))
	t.Setenv("RELAY_CONSOLE_TOKEN", "s3cret")
	addr := "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))

	stdout, _, stop := runConsole(t, "--listen", addr, "--runner", "process")
	get := func(path, token string) (int, string) { return consoleGet(t, addr, path, token) }
	testutil.WaitFor(t, 10*time.Second, "the console to listen", func() bool {
		code, _ := get("/", "s3cret")
		return code == http.StatusOK
	})
	code, body := get("/", "s3cret")
	if code != http.StatusOK || !strings.Contains(body, a) || !strings.Contains(body, b) {
		t.Errorf("overview: %d, want both streams", code)
	}
	if strings.Contains(body, "hunter2") {
		t.Error("the overview shows the Redis password")
	}
	if code, _ := get("/apps", ""); code != http.StatusSeeOther {
		t.Errorf("without the token: %d, want a redirect to the login", code)
	}
	stop()
	if !strings.Contains(stdout.String(), "relay console on http://"+addr) {
		t.Errorf("stdout %q", stdout.String())
	}
}

// TestCLIConsoleRedisDownAtStart starts relay console while its Redis is
// stopped: it serves pages that name the address and the error, and
// shows the stream's figures once Redis is back, without a restart.
func TestCLIConsoleRedisDownAtStart(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	srv.Stop()
	st := redistest.Name(t, "events")
	t.Setenv("REDIS_URI", "redis://:"+"hunter2@"+srv.Addr)
	t.Setenv("REDIS_STREAM", st)
	t.Setenv("REDIS_GROUP", "g")
	t.Setenv("RELAY_APPS", cliApps(t))
	addr := "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))

	_, stderr, stop := runConsole(t, "--listen", addr, "--read-only")
	get := func(path string) (int, string) { return consoleGet(t, addr, path, "") }
	// The first pages may come before the console's first connect attempt
	// ended ("not connected to Redis yet"); the attempt's error follows.
	want := "<b>Redis is unreachable</b>: connect to Redis at redis://:***@" + srv.Addr + ": dial tcp " + srv.Addr + ": connect: connection refused"
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		var code int
		code, body = get("/")
		if code == http.StatusOK && strings.Contains(body, want) || time.Now().After(deadline) {
			break
		}
	}
	if !strings.Contains(body, want) || !strings.Contains(body, `<span class="k">entries</span><span class="v">?</span>`) {
		t.Errorf("overview with Redis down: want %q and entries unknown in\n%s", want, body)
	}
	if strings.Contains(body, "hunter2") {
		t.Error("the overview shows the Redis password")
	}

	srv.Restart(t)
	rc := redistest.Connect(t, srv.Addr)
	// The console's password last: this client has none. Until then the
	// console's AUTH fails and it tries again.
	if err := rc.Do(t.Context(), rc.B().Xadd().Key(st).Id("*").FieldValue().FieldValue("event", "{}").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := rc.Do(t.Context(), rc.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "hunter2").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the console to reach Redis again", func() bool {
		var code int
		code, body = get("/")
		return code == http.StatusOK && strings.Contains(body, `<span class="k">entries</span><span class="v">1</span>`)
	})
	if strings.Contains(body, `class="unreachable"`) {
		t.Errorf("overview after Redis came back still shows the banner:\n%s", body)
	}
	stop()
	if !strings.Contains(stderr.String(), "Redis is unreachable") || !strings.Contains(stderr.String(), "connected to Redis") {
		t.Errorf("stderr does not say that Redis is unreachable, then connected:\n%s", stderr.String())
	}
}

// TestCLIConsoleWrongPassword keeps refusing to start when Redis answers
// and refuses the settings: that is not an outage to wait out.
func TestCLIConsoleWrongPassword(t *testing.T) {
	isolateEnv(t)
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	if err := rc.Do(t.Context(), rc.B().ConfigSet().ParameterValue().ParameterValue("requirepass", "right").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	t.Setenv("REDIS_URI", "redis://:wrong@"+srv.Addr)
	t.Setenv("REDIS_STREAM", "s")
	t.Setenv("REDIS_GROUP", "g")
	t.Setenv("RELAY_APPS", cliApps(t))
	r := relayCLI(t, "", "console", "--listen", "127.0.0.1:"+strconv.Itoa(testutil.FreePort(t)))
	if r.code != exitFailure || !strings.Contains(r.stderr, "WRONGPASS") {
		t.Errorf("relay console with a wrong password: exit %d, stderr %q; want exit 1 naming WRONGPASS", r.code, r.stderr)
	}
}

// TestCLIConsoleAppsDeps: with the containerd runner, the Apps page names
// an app's secrets and asks containerd for its dependency image, as relay
// app inspect does; the image is not built yet, since nothing prepared it.
func TestCLIConsoleAppsDeps(t *testing.T) {
	cc := containerdtest.Client(t)
	containerdtest.ImportArchive(t, cc, containerdtest.EnvPythonArchive, containerdtest.PythonImage)
	isolateEnv(t)
	apps := t.TempDir()
	depstest.PythonApp(t, filepath.Join(apps, "pydeps"), map[string]string{
		"template.yaml": "runtime: python3\nimage: " + containerdtest.PythonImage + "\nsecrets: [api-key]\n" +
			"events:\n  - handler: handlers.hello\n    pattern: {table_name: [people]}\n",
	})
	t.Setenv("REDIS_URI", redistest.Addr(t))
	t.Setenv("REDIS_STREAM", redistest.Name(t, "events"))
	t.Setenv("REDIS_GROUP", "g")
	t.Setenv("RELAY_APPS", apps)
	t.Setenv("CONTAINERD_NAMESPACE", cc.DefaultNamespace())
	addr := "127.0.0.1:" + strconv.Itoa(testutil.FreePort(t))
	_, _, stop := runConsole(t, "--listen", addr, "--read-only")
	var code int
	var body string
	testutil.WaitFor(t, 10*time.Second, "the console to listen", func() bool {
		code, body = consoleGet(t, addr, "/apps", "")
		return code != 0
	})
	if code != http.StatusOK {
		t.Fatalf("/apps: status %d\n%s", code, body)
	}
	for _, want := range []string{`<dd class="secrets"><code>api-key</code>`, `<dd class="deps"><code>requirements.txt</code>`,
		`<span class="badge warn">not built yet</span> <code>relay.local/deps:`} {
		if !strings.Contains(body, want) {
			t.Errorf("/apps: missing %q in\n%s", want, body)
		}
	}
	stop()
}

// consoleGet asks the console at addr for path, with token as a bearer
// token unless it is "", without following redirects; it returns the
// status and the body, or 0 and the error when the request failed.
func consoleGet(t *testing.T, addr, path, token string) (int, string) {
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, "http://"+addr+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultTransport.RoundTrip(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

// runConsole runs relay console with args in the background, until stop
// (or the test's end) cancels it; stop fails the test unless it exits 0
// within 30 s.
func runConsole(t *testing.T, args ...string) (stdout, stderr *testutil.Buffer, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	stdout, stderr = &testutil.Buffer{}, &testutil.Buffer{}
	done := make(chan int, 1)
	go func() { done <- run(ctx, append([]string{"console"}, args...), stdout, stderr) }()
	return stdout, stderr, func() {
		t.Helper()
		cancel()
		select {
		case c := <-done:
			if c != exitOK {
				t.Errorf("exit %d after the stop; stderr:\n%s", c, stderr.String())
			}
		case <-time.After(30 * time.Second):
			t.Fatal("relay console did not stop")
		}
	}
}
