package console_test

import (
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/relaydev/relay/console"
)

func TestSecurityHeaders(t *testing.T) {
	f := newFixture(t)
	for _, p := range []string{"/", "/apps", "/dlq", "/login", "/nope", "/assets/style.css"} {
		req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, f.HTTP.URL+p, nil)
		resp, err := f.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		csp := resp.Header.Get("Content-Security-Policy")
		for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "frame-ancestors 'none'", "form-action 'self'"} {
			if !strings.Contains(csp, want) {
				t.Errorf("%s: CSP %q lacks %q", p, csp, want)
			}
		}
		if strings.Contains(csp, "unsafe") {
			t.Errorf("%s: CSP allows unsafe sources: %q", p, csp)
		}
		if resp.Header.Get("X-Content-Type-Options") != "nosniff" || resp.Header.Get("X-Frame-Options") != "DENY" {
			t.Errorf("%s: missing nosniff or frame denial", p)
		}
	}
}

// TestCSRF: a POST needs the form's token matching the cookie, and no
// cross-site markers.
func TestCSRF(t *testing.T) {
	f := newFixture(t)
	id := f.deadLetter("shop", "orders.charge", `{}`, "exit 3")
	token := f.csrf()
	base := url.Values{"stream": {f.Stream}, "id": {id}, "confirm": {"yes"}}
	for _, tc := range []struct {
		name   string
		csrf   string
		header []string
	}{
		{"no token", "", nil},
		{"wrong token", strings.Repeat("0", 64), nil},
		{"other origin", token, []string{"Origin", "https://evil.example"}},
		{"cross-site fetch", token, []string{"Sec-Fetch-Site", "cross-site"}},
	} {
		form := url.Values{}
		for k, v := range base {
			form[k] = v
		}
		if tc.csrf != "" {
			form.Set("csrf", tc.csrf)
		}
		code, _ := f.do(http.MethodPost, "/dlq/remove", form, tc.header...)
		if code != http.StatusForbidden {
			t.Errorf("%s: status %d, want 403", tc.name, code)
		}
	}
	if len(f.dlqIDs()) != 1 {
		t.Fatal("a forged request deleted the entry")
	}
	// The same request with the token and this origin works.
	form := url.Values{"csrf": {token}}
	for k, v := range base {
		form[k] = v
	}
	code, _ := f.do(http.MethodPost, "/dlq/remove", form, "Origin", f.HTTP.URL, "Sec-Fetch-Site", "same-origin")
	if code != http.StatusSeeOther || len(f.dlqIDs()) != 0 {
		t.Errorf("a genuine request: status %d, %d entries left", code, len(f.dlqIDs()))
	}
}

// TestToken: with a token every request needs it, as a bearer header or
// the login form's cookie.
func TestToken(t *testing.T) {
	const token = "t0ken-for-tests-0123"
	f := newFixture(t, func(c *console.Config) { c.Token = token })
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, f.HTTP.URL+"/dlq?x=1", nil)
	resp, err := f.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/login?next=%2Fdlq%3Fx%3D1" {
		t.Errorf("page without token: %d to %q, want a redirect to the login", resp.StatusCode, resp.Header.Get("Location"))
	}
	for _, p := range []string{"/live/events", "/apps"} {
		if code, _ := f.do(http.MethodGet, p, nil, "Authorization", "Bearer wrong"); code == http.StatusOK {
			t.Errorf("%s with a wrong bearer: 200", p)
		}
	}
	if code, _ := f.do(http.MethodGet, "/live/events?after=0-0", nil); code != http.StatusUnauthorized {
		t.Errorf("live events without token: %d, want 401", code)
	}
	if code, body := f.do(http.MethodGet, "/apps", nil, "Authorization", "Bearer "+token); code != http.StatusOK || !strings.Contains(body, "shop") {
		t.Errorf("bearer: %d", code)
	}
	if code, _ := f.get("/assets/style.css"); code != http.StatusOK {
		t.Errorf("assets need no token: %d", code)
	}

	// The login form: a wrong token is refused, the right one sets the cookie.
	code, body := f.get("/login?next=/apps")
	if code != http.StatusOK {
		t.Fatalf("login form: %d", code)
	}
	csrf := csrfRE.FindStringSubmatch(body)[1]
	code, _ = f.do(http.MethodPost, "/login", url.Values{"csrf": {csrf}, "token": {"nope"}, "next": {"/apps"}})
	if code != http.StatusUnauthorized {
		t.Errorf("wrong login: %d", code)
	}
	req, _ = http.NewRequestWithContext(t.Context(), http.MethodPost, f.HTTP.URL+"/login",
		strings.NewReader(url.Values{"csrf": {csrf}, "token": {token}, "next": {"//evil.example/x"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err = f.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if loc := resp.Header.Get("Location"); loc != "/" {
		t.Errorf("login redirects to %q, want / (never another host)", loc)
	}
	var session *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "relay_console_session" {
			session = c
		}
	}
	if session == nil || !session.HttpOnly || session.SameSite != http.SameSiteStrictMode || strings.Contains(session.Value, token) {
		t.Fatalf("session cookie %+v: want HttpOnly, SameSite=Strict, not the token itself", session)
	}
	if code, body := f.get("/apps"); code != http.StatusOK || !strings.Contains(body, "Log out") {
		t.Errorf("with the session cookie: %d", code)
	}
}

var hrefRE = regexp.MustCompile(`(?i)(href|src|action|formaction)="([^"]*)"`)

// TestHostileContent puts markup, quotes, javascript: URLs and invalid
// UTF-8 in every place event content reaches, and checks that every page
// shows them as text.
func TestHostileContent(t *testing.T) {
	f := newFixture(t)
	hostile := xss + `"'` + xssURL + invalidU8
	event := `{"name":"` + xss + `","url":"` + xssURL + `","q":"\"'"}`
	rawEvent := "not json " + xss + invalidU8
	id := f.deadLetter(hostile, hostile, event, hostile)
	bad := f.deadLetter("shop", "orders.charge", rawEvent, "reason "+xss)
	msg := f.Publish(event, "extra", hostile)
	f.deliver(xss + invalidU8)
	f.claim(msg, "shop/"+xss, 0)

	s := "&stream=" + url.QueryEscape(f.Stream)
	pages := map[string]string{
		"overview":  "/",
		"pending":   "/pending?x=1" + s,
		"event":     "/event?id=" + msg + s,
		"dlq":       "/dlq?x=1" + s,
		"entry":     "/dlq/entry?id=" + id + s,
		"raw entry": "/dlq/entry?id=" + bad + s,
		"pg stream": "/playground?id=" + msg + s,
		"pg dlq":    "/playground?dlq=" + bad + s,
		"filter":    "/dlq?reason=" + url.QueryEscape(hostile) + "&app=" + url.QueryEscape(hostile) + s,
		"bad age":   "/dlq?newer=" + url.QueryEscape(hostile) + s,
	}
	for name, p := range pages {
		_, body := f.get(p)
		checkEscaped(t, name, body)
	}
	_, body := f.get(pages["dlq"])
	contains(t, "dlq", body, "&lt;script&gt;alert(&#34;xss&#34;)&lt;/script&gt;")
	_, body = f.post("/dlq/remove", url.Values{"id": {id, bad}})
	checkEscaped(t, "confirm", body)
	_, body = f.post("/dlq/replay", url.Values{"id": {id}})
	checkEscaped(t, "replay result", body)
	_, body = f.post("/playground", url.Values{"event": {event}})
	checkEscaped(t, "playground", body)
	_, body = f.post("/playground", url.Values{"event": {rawEvent}})
	checkEscaped(t, "playground malformed", body)
	// A backtest lists matching events, a broken pattern's errors and the
	// pattern itself, all hostile here. (The events above are not JSON:
	// xss holds quotes.)
	f.Publish(`{"name":` + strconv.Quote(xss) + `}`)
	_, body = f.post("/playground", url.Values{"action": {"backtest"}, "pattern": {`name: [` + strconv.Quote(xss) + `]`}})
	contains(t, "backtest", body, `class="bt-matched">1<`)
	checkEscaped(t, "backtest", body)
	_, body = f.post("/playground", url.Values{"action": {"backtest"}, "pattern": {`name: "` + xss + `"` + invalidU8}, "window": {hostile}})
	checkEscaped(t, "backtest bad window", body)
	_, body = f.post("/playground", url.Values{"action": {"backtest"}, "pattern": {`name: "` + xss + `"` + invalidU8}})
	contains(t, "backtest broken pattern", body, "The pattern does not parse")
	checkEscaped(t, "backtest broken pattern", body)
	_, body = f.post("/playground", url.Values{"action": {"backtest"}, "app": {hostile}})
	checkEscaped(t, "backtest unknown app", body)
	_, body = f.get("/playground?app=" + url.QueryEscape(hostile) + "&handler=" + url.QueryEscape(hostile) + s)
	checkEscaped(t, "load an unknown rule", body)
}

func checkEscaped(t *testing.T, name, body string) {
	t.Helper()
	if strings.Contains(body, "<script>alert") || strings.Contains(body, "</script>alert") {
		t.Errorf("%s: markup from an event reached the page unescaped", name)
	}
	if strings.Count(body, "<script") != 1 {
		t.Errorf("%s: %d script elements, want only the console's own", name, strings.Count(body, "<script"))
	}
	if strings.Contains(body, " on") && regexp.MustCompile(`<[^>]+\son[a-z]+=`).MatchString(body) {
		t.Errorf("%s: an inline event handler", name)
	}
	for _, m := range hrefRE.FindAllStringSubmatch(body, -1) {
		if u := strings.ToLower(m[2]); strings.Contains(u, "javascript:") || !(strings.HasPrefix(u, "/") || strings.HasPrefix(u, "#") || u == "") {
			t.Errorf("%s: %s=%q leaves the console", name, m[1], m[2])
		}
	}
	if !utf8.ValidString(body) {
		t.Errorf("%s: the page is not valid UTF-8", name)
	}
}

// TestRebindingHostRefused: without a token the console answers only
// requests addressed to a loopback name (or a configured host). A page of
// another site that rebinds its own name to 127.0.0.1 sends that name as
// Host, and gets neither a page nor a CSRF cookie, so it can neither read
// the DLQ nor remove an entry; with a token, the token decides.
func TestRebindingHostRefused(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.Hosts = []string{"relay.internal"} })
	serve := func(h http.Handler, host, method, path string, header ...string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, path, strings.NewReader("confirm=yes"))
		req.Host = host
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w
	}
	h := f.HTTP.Config.Handler
	for _, host := range []string{"evil.example:8089", "evil.example", "127.0.0.1.evil.example", "10.0.0.1:8089", ""} {
		for _, mp := range [][2]string{{http.MethodGet, "/dlq"}, {http.MethodGet, "/assets/style.css"}, {http.MethodPost, "/dlq/remove"}} {
			w := serve(h, host, mp[0], mp[1])
			if w.Code != http.StatusMisdirectedRequest || w.Header().Get("Set-Cookie") != "" {
				t.Errorf("%s %s with Host %q: %d (cookie %q), want 421 and no cookie", mp[0], mp[1], host, w.Code, w.Header().Get("Set-Cookie"))
			}
		}
	}
	for _, host := range []string{"127.0.0.1:8089", "localhost:8089", "[::1]:8089", "LOCALHOST", "127.0.0.2", "localhost.", "relay.internal:80"} {
		if w := serve(h, host, http.MethodGet, "/dlq"); w.Code != http.StatusOK {
			t.Errorf("GET /dlq with Host %q: %d, want 200", host, w.Code)
		}
	}
	const token = "t0ken-for-tests-0123"
	ft := newFixture(t, func(c *console.Config) { c.Token = token })
	if w := serve(ft.HTTP.Config.Handler, "relay.example.com", http.MethodGet, "/dlq", "Authorization", "Bearer "+token); w.Code != http.StatusOK {
		t.Errorf("GET /dlq with the token and Host relay.example.com: %d, want 200", w.Code)
	}
}

// TestOversizedForm: a form too large to parse (an event pasted far over
// the 1 MiB limit) is answered as such, not as a missing CSRF token.
func TestOversizedForm(t *testing.T) {
	f := newFixture(t)
	form := url.Values{"csrf": {f.csrf()}, "stream": {f.Stream}, "event": {`{"x":"` + strings.Repeat("a", 11<<20) + `"}`}}
	code, body := f.do(http.MethodPost, "/playground", form)
	if code != http.StatusRequestEntityTooLarge || strings.Contains(body, "CSRF") {
		t.Errorf("status %d, body %.200q; want 413 naming the size, not the CSRF token", code, body)
	}
}

// login posts the login form from a fresh client and returns the
// response's session cookie and status.
func (f *fixture) login(token string, header ...string) (*http.Cookie, int) {
	f.T.Helper()
	code, body := f.get("/login")
	m := csrfRE.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		f.T.Fatalf("login form: status %d, no CSRF token", code)
	}
	req, _ := http.NewRequestWithContext(f.T.Context(), http.MethodPost, f.HTTP.URL+"/login",
		strings.NewReader(url.Values{"csrf": {m[1]}, "token": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			// The client sends no jar cookies to a request whose Host
			// differs from its URL's: send them.
			req.Host = header[i+1]
			for _, c := range f.Client.Jar.Cookies(req.URL) {
				req.AddCookie(c)
			}
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := f.Client.Do(req)
	if err != nil {
		f.T.Fatal(err)
	}
	resp.Body.Close()
	for _, c := range resp.Cookies() {
		if c.Name == "relay_console_session" {
			return c, resp.StatusCode
		}
	}
	return nil, resp.StatusCode
}

// getWith fetches path carrying only the given cookie (no jar).
func getWith(t *testing.T, base, path string, c *http.Cookie) int {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodGet, base+path, nil)
	if c != nil {
		req.AddCookie(c)
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestSessions: every login gets a new random session id, which logging
// out revokes and a console with another token (a restart) never knew.
func TestSessions(t *testing.T) {
	const token = "0123456789abcdef-sessions"
	f := newFixture(t, func(c *console.Config) { c.Token = token })
	a, code := f.login(token)
	if a == nil || code != http.StatusSeeOther {
		t.Fatalf("login: status %d, cookie %v", code, a)
	}
	jar, _ := cookiejar.New(nil)
	f.Client.Jar = jar // another browser: a login revokes the session it replaces
	b, _ := f.login(token)
	if b == nil || a.Value == b.Value || len(a.Value) != 64 {
		t.Fatalf("two logins gave cookies %q and %q: want two random 64-hex ids", a.Value, b.Value)
	}
	if a.MaxAge <= 0 || a.Secure {
		t.Errorf("session cookie over plain HTTP: MaxAge %d Secure %v; want a lifetime and no Secure", a.MaxAge, a.Secure)
	}
	for _, c := range []*http.Cookie{a, b} {
		if code := getWith(t, f.HTTP.URL, "/apps", c); code != http.StatusOK {
			t.Errorf("a live session: status %d", code)
		}
	}
	// Logging out (with b, the jar's) revokes b, not a.
	if code, _ := f.post("/logout", nil); code != http.StatusSeeOther {
		t.Fatalf("logout: status %d", code)
	}
	if code := getWith(t, f.HTTP.URL, "/apps", b); code != http.StatusSeeOther {
		t.Errorf("a logged-out session replayed: status %d, want a redirect to the login", code)
	}
	if code := getWith(t, f.HTTP.URL, "/apps", a); code != http.StatusOK {
		t.Errorf("another browser's session after a logout: status %d", code)
	}
	// A console with another token does not know the session.
	g := newFixture(t, func(c *console.Config) { c.Token = token + "-rotated" })
	if code := getWith(t, g.HTTP.URL, "/apps", a); code != http.StatusSeeOther {
		t.Errorf("a session after the token changed: status %d, want a redirect to the login", code)
	}
	// The bearer scheme is case-insensitive.
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		if code, _ := f.do(http.MethodGet, "/apps", nil, "Authorization", scheme+" "+token); code != http.StatusOK {
			t.Errorf("Authorization: %s <token>: status %d", scheme, code)
		}
	}
}

// TestLoginRateLimit: after LoginBurst attempts in a row, further logins
// from the address are refused, the right token too.
func TestLoginRateLimit(t *testing.T) {
	const token = "0123456789abcdef-ratelimit"
	f := newFixture(t, func(c *console.Config) { c.Token = token })
	limited := 0
	for range console.LoginBurst + 10 {
		if _, code := f.login("wrong"); code == http.StatusTooManyRequests {
			limited++
		} else if code != http.StatusUnauthorized {
			t.Fatalf("a wrong token: status %d", code)
		}
	}
	if limited == 0 {
		t.Fatalf("%d wrong logins in a row were all tried", console.LoginBurst+10)
	}
	if c, code := f.login(token); code != http.StatusTooManyRequests || c != nil {
		t.Errorf("the right token while limited: status %d, cookie %v; want 429 and no session", code, c)
	}
}

// TestSecureCookies: the cookies are Secure with SecureCookies, or when a
// --host proxy says the browser used HTTPS; not otherwise.
func TestSecureCookies(t *testing.T) {
	const token = "0123456789abcdef-secure"
	f := newFixture(t, func(c *console.Config) { c.Token = token; c.SecureCookies = true })
	if c, _ := f.login(token); c == nil || !c.Secure {
		t.Errorf("SecureCookies: session cookie %v, want Secure", c)
	}
	p := newFixture(t, func(c *console.Config) { c.Token = token; c.Hosts = []string{"relay.internal"} })
	if c, code := p.login(token, "Host", "relay.internal", "X-Forwarded-Proto", "https"); c == nil || !c.Secure {
		t.Errorf("through the --host proxy over HTTPS: status %d, session cookie %v, want Secure", code, c)
	}
	if c, _ := p.login(token, "X-Forwarded-Proto", "https"); c == nil || c.Secure {
		t.Errorf("X-Forwarded-Proto from a client that is not a --host proxy: session cookie %v, want it not Secure", c)
	}
}

// TestLoginPageShowsNothing: a visitor without the token sees no
// navigation, group or stream on the login page.
func TestLoginPageShowsNothing(t *testing.T) {
	f := newFixture(t, func(c *console.Config) { c.Token = "0123456789abcdef-visitor" })
	_, body := f.get("/login")
	contains(t, "login page", body, `name="token"`)
	lacks(t, "login page", body, "<nav>", f.Group, f.Stream, "Log out")
}
