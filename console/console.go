package console

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/worker"
)

// Defaults of Config.
const (
	// DefaultSampleInterval is how often the console reads the cluster
	// counters to draw their rates.
	DefaultSampleInterval = 10 * time.Second
	// DefaultSampleWindow is how far back the rates and sparklines reach.
	DefaultSampleWindow = time.Hour
	// DefaultPageSize is how many rows a DLQ or pending page shows.
	DefaultPageSize = 50
	// DefaultReplayTimeout bounds one replay request (all its entries).
	DefaultReplayTimeout = 15 * time.Minute
	// DefaultRequestTimeout bounds the Redis reads and writes of one page
	// or remove request, and of one read of the live feed.
	DefaultRequestTimeout = 10 * time.Second
)

// Cookie names.
const (
	sessionCookie = "relay_console_session"
	csrfCookie    = "relay_console_csrf"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed assets
var assetFS embed.FS

// ErrConfig marks an unusable Config.
var ErrConfig = errors.New("console: invalid configuration")

// Config is what a console serves and how.
type Config struct {
	// Redis is the client every page reads through; the console never
	// closes it. Give it or Connect, not both.
	Redis rueidis.Client
	// Connect makes the Redis client when the console cannot have one at
	// start (Redis unreachable). The console calls it when a page or the
	// sampler needs Redis, one call at a time and at most every
	// ReconnectInterval, until it succeeds; meanwhile every page answers,
	// names the error in a banner and shows what it could not read as
	// unknown (docs/console.md#while-redis-is-unreachable). Close closes the client it returned.
	Connect func(context.Context) (rueidis.Client, error)
	// ReconnectInterval is the shortest time between two calls of Connect
	// (DefaultReconnectInterval when 0).
	ReconnectInterval time.Duration
	// Streams are the source streams shown; Group is their consumer group.
	Streams []string
	Group   string
	// Apps loads the apps root: every page and every replay loads it anew,
	// so a fixed template is used at once (template.Dir(root)).
	Apps worker.AppSource
	// Runner runs replayed handlers, the same Runner relay dlq replay
	// uses. Nil disables replay (removing entries still works).
	Runner relay.Runner
	// Deps, when set, looks up the dependency image of an app with a
	// dependency manifest, built or not, for the Apps page, as relay app
	// inspect does (docs/runtimes.md#dependencies). Without it the page
	// shows the manifest and its digest, and the image as not looked up.
	Deps func(ctx context.Context, spec runtime.Spec) (DepsImage, error)
	// DefaultImage, when set, names the image an app that sets runtime
	// but no image runs in, for the Apps page, as relay app inspect shows
	// it (runtime/containerd.DefaultImage); "" when there is none.
	DefaultImage func(runtime string) string
	// ReadOnly hides and refuses replay and remove.
	ReadOnly bool
	// Token, when set, is required by every request: as
	// "Authorization: Bearer <token>", or the session cookie the login
	// form sets. Without it, only requests whose Host is a loopback name
	// or address (localhost, 127.0.0.0/8, ::1) or one of Hosts are
	// served: a page of another site that rebinds its own name to
	// 127.0.0.1 must not reach the console (docs/console.md#security).
	Token string
	// Hosts are further Host header values (without port) accepted when
	// Token is empty, e.g. the name a local reverse proxy forwards. A
	// request to one of them may say X-Forwarded-Proto: https, making the
	// console's cookies Secure.
	Hosts []string
	// SecureCookies marks every cookie Secure: the console is reached over
	// HTTPS (a TLS-terminating proxy) though it serves plain HTTP.
	SecureCookies bool
	// SessionTTL is how long a login lasts (DefaultSessionTTL when 0).
	SessionTTL time.Duration
	// DLQRetention is the workers' dead-letter retention, to show when
	// entries expire; 0 means kept forever.
	DLQRetention time.Duration
	// StreamRetention and InvocationRetention are the workers' other
	// retentions, for the overview's projection of Redis memory
	// (docs/operations.md#memory-budget): a StreamRetention of 0 keeps
	// every entry, an InvocationRetention of 0 deletes the state with the
	// acknowledgement.
	StreamRetention, InvocationRetention time.Duration
	// RetentionInterval is how often the workers trim the streams
	// (worker.Config.RetentionInterval): the projection is the peak just
	// before a trim. 0 means their default, worker.DefaultRetentionInterval.
	RetentionInterval time.Duration
	// MaxEventBytes is the workers' MAX_EVENT_BYTES: the playground's
	// backtest counts a larger event as malformed, as they dead-letter it
	// undecoded. 0 means their default (1 MiB), < 0 no limit.
	MaxEventBytes int
	// SampleInterval and SampleWindow set the rate sampling
	// (DefaultSampleInterval, DefaultSampleWindow when 0).
	SampleInterval, SampleWindow time.Duration
	// PageSize is the rows per DLQ and pending page (DefaultPageSize).
	PageSize int
	// RequestTimeout bounds the Redis work of one request other than a
	// replay (DefaultRequestTimeout when 0): while Redis is unreachable a
	// page shows the error, rather than loading for as long as the
	// browser waits (docs/console.md#while-redis-is-unreachable).
	RequestTimeout time.Duration
	// Logger gets request failures and actions (slog.Default() when nil).
	Logger *slog.Logger
}

// DepsImage is an app's dependency image as Config.Deps finds it.
type DepsImage struct {
	// Name is the image's reference.
	Name string
	// Built is set when the image exists; BuiltAt, BuildTime and Size
	// (of the dependency layer, compressed, in bytes) then too.
	Built     bool
	BuiltAt   time.Time
	BuildTime time.Duration
	Size      int64
}

// Server is the console: an http.Handler, and a sampler that Sample runs.
type Server struct {
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
	mux      *http.ServeMux
	sessions *sessions
	logins   *loginLimiter
	results  *results
	jobs     *jobs
	// jobCtx is the context of the bulk actions, which outlive their
	// request; Close cancels it.
	jobCtx   context.Context
	stopJobs context.CancelFunc
	sampler  *sampler
	link     *link
	memory   memoryCache
}

// New checks cfg and returns a console. It errs (wrapping ErrConfig) on a
// missing client, stream, group or apps source.
func New(cfg Config) (*Server, error) {
	switch {
	case cfg.Redis == nil && cfg.Connect == nil:
		return nil, fmt.Errorf("%w: no Redis client", ErrConfig)
	case cfg.Redis != nil && cfg.Connect != nil:
		return nil, fmt.Errorf("%w: both a Redis client and Connect; give one", ErrConfig)
	case len(cfg.Streams) == 0:
		return nil, fmt.Errorf("%w: no stream", ErrConfig)
	case cfg.Group == "":
		return nil, fmt.Errorf("%w: no consumer group", ErrConfig)
	case cfg.Apps == nil:
		return nil, fmt.Errorf("%w: no apps source", ErrConfig)
	case cfg.SampleInterval < 0 || cfg.SampleWindow < 0 || cfg.PageSize < 0 || cfg.DLQRetention < 0 || cfg.RequestTimeout < 0 ||
		cfg.StreamRetention < 0 || cfg.InvocationRetention < 0 || cfg.RetentionInterval < 0 ||
		cfg.ReconnectInterval < 0 || cfg.SessionTTL < 0:
		return nil, fmt.Errorf("%w: negative interval, window, page size, retention, request timeout, reconnect interval or session TTL", ErrConfig)
	}
	if cfg.SessionTTL == 0 {
		cfg.SessionTTL = DefaultSessionTTL
	}
	if cfg.RetentionInterval == 0 {
		cfg.RetentionInterval = worker.DefaultRetentionInterval
	}
	if cfg.ReconnectInterval == 0 {
		cfg.ReconnectInterval = DefaultReconnectInterval
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	if cfg.SampleInterval == 0 {
		cfg.SampleInterval = DefaultSampleInterval
	}
	if cfg.SampleWindow == 0 {
		cfg.SampleWindow = DefaultSampleWindow
	}
	if cfg.PageSize == 0 {
		cfg.PageSize = DefaultPageSize
	}
	s := &Server{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.sessions, s.logins, s.results = newSessions(cfg.SessionTTL), newLoginLimiter(), newResults()
	s.jobs = newJobs()
	s.jobCtx, s.stopJobs = context.WithCancel(context.Background())
	var err error
	if s.pages, err = parsePages(); err != nil {
		return nil, err
	}
	if s.link, err = newLink(cfg, s.log); err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	s.sampler = newSampler(cfg.Streams, cfg.SampleWindow, cfg.SampleInterval)
	s.routes()
	return s, nil
}

func (s *Server) routes() {
	assets, _ := fs.Sub(assetFS, "assets")
	m := http.NewServeMux()
	m.Handle("GET /assets/", http.StripPrefix("/assets/", http.FileServerFS(assets)))
	m.HandleFunc("GET /login", s.loginForm)
	m.HandleFunc("POST /login", s.login)
	m.HandleFunc("POST /logout", s.logout)
	m.HandleFunc("GET /{$}", s.overview)
	m.HandleFunc("GET /apps", s.apps)
	m.HandleFunc("GET /pending", s.pending)
	m.HandleFunc("GET /event", s.event)
	m.HandleFunc("GET /dlq", s.dlqList)
	m.HandleFunc("GET /dlq/entry", s.dlqEntry)
	m.HandleFunc("POST /dlq/replay", s.dlqReplay)
	m.HandleFunc("GET /dlq/result", s.dlqResult)
	m.HandleFunc("POST /dlq/bulk", s.dlqBulk)
	m.HandleFunc("GET /dlq/job", s.dlqJob)
	m.HandleFunc("POST /dlq/job/stop", s.dlqJobStop)
	m.HandleFunc("POST /dlq/remove", s.dlqRemove)
	m.HandleFunc("GET /playground", s.playground)
	m.HandleFunc("POST /playground", s.playground)
	m.HandleFunc("GET /live", s.live)
	m.HandleFunc("GET /live/events", s.liveEvents)
	s.mux = m
}

// ServeHTTP serves the console: security headers on every response, the
// token check when a Token is set, and the CSRF check on every POST.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// No inline script or style anywhere, and nothing from elsewhere:
	// event payloads are hostile input, and this is the second line of
	// defence behind html/template's escaping.
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
		"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
	if !strings.HasPrefix(r.URL.Path, "/assets/") {
		h.Set("Cache-Control", "no-store")
	}
	if s.cfg.Token == "" && !s.hostAllowed(r.Host) {
		http.Error(w, "misdirected request: without RELAY_CONSOLE_TOKEN the console answers only to a loopback host name (localhost, 127.0.0.1, [::1])", http.StatusMisdirectedRequest)
		return
	}
	public := strings.HasPrefix(r.URL.Path, "/assets/") || r.URL.Path == "/login"
	if s.cfg.Token != "" && !public && !s.authorized(r) {
		if r.Method == http.MethodGet && r.URL.Path != "/live/events" {
			http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
			return
		}
		http.Error(w, "unauthorized: send Authorization: Bearer <RELAY_CONSOLE_TOKEN>, or log in at /login", http.StatusUnauthorized)
		return
	}
	token := s.csrfToken(w, r)
	r = r.WithContext(context.WithValue(r.Context(), csrfKey{}, token))
	if r.Method == http.MethodPost && !s.checkPost(w, r, token) {
		return
	}
	ctx := r.Context()
	// The Redis client retries reads until its context ends, so without a
	// bound a page would load forever while Redis is down. The live feed
	// bounds each of its reads instead; a replay detaches from this
	// context and has its own bound.
	if r.URL.Path != "/live/events" {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, s.cfg.RequestTimeout)
		defer cancel()
	}
	s.mux.ServeHTTP(w, r.WithContext(ctx))
}

type csrfKey struct{}

// checkPost refuses a POST from another site or without the form's CSRF
// token, with a page saying so; false when it did.
func (s *Server) checkPost(w http.ResponseWriter, r *http.Request, token string) bool {
	if err := checkOrigin(r); err != nil {
		s.fail(w, r, http.StatusForbidden, err.Error())
		return false
	}
	// A form too large to parse (over 10 MB) would read as one without a
	// token; say what is wrong with it instead.
	if err := r.ParseForm(); err != nil {
		s.fail(w, r, http.StatusRequestEntityTooLarge, "bad request: the form cannot be read ("+err.Error()+"); an event is at most 1 MiB")
		return false
	}
	// Double submit: the form's token must equal the cookie, which a page
	// of another site can neither read nor send (SameSite=Strict).
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue("csrf")), []byte(token)) == 1 {
		return true
	}
	const stale = "The form's security token (CSRF) is missing or stale, as after the console restarted or the cookie expired, so it was not sent."
	if r.URL.Path == "/playground" {
		// Keep what was pasted: the page comes back with a fresh token.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(http.StatusForbidden)
		s.playgroundForm(w, r, stale+" Press Evaluate again.")
		return false
	}
	s.fail(w, r, http.StatusForbidden, stale+" Go back, reload the page and try again.")
	return false
}

// hostAllowed reports whether host, a request's Host header, names the
// loopback interface or one of cfg.Hosts. A DNS-rebinding page reaches
// 127.0.0.1 under its own name, so its requests carry that name.
func (s *Server) hostAllowed(host string) bool {
	return Loopback(hostName(host)) || s.viaProxy(host)
}

// hostName is a Host header without port, brackets or final dot.
func hostName(host string) string {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return strings.TrimSuffix(strings.Trim(host, "[]"), ".")
}

// viaProxy reports whether host, a request's Host header, is one of
// cfg.Hosts: the request came through a reverse proxy of that name.
func (s *Server) viaProxy(host string) bool {
	host = hostName(host)
	return slices.ContainsFunc(s.cfg.Hosts, func(h string) bool { return strings.EqualFold(h, host) })
}

// Loopback reports whether host (a name or address, without port) is
// localhost or a loopback address: where the console may run without a
// token (docs/console.md#security).
func Loopback(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// csrfToken returns the request's CSRF cookie, setting a new one when it
// has none.
func (s *Server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	if c, err := r.Cookie(csrfCookie); err == nil && len(c.Value) == 64 {
		return c.Value
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	v := hex.EncodeToString(b)
	http.SetCookie(w, s.cookie(r, csrfCookie, v, 0))
	return v
}

// checkOrigin refuses a POST that a browser says comes from another site.
func checkOrigin(r *http.Request) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" && site != "none" {
		return fmt.Errorf("forbidden: cross-site request (Sec-Fetch-Site %s)", site)
	}
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("forbidden: request from origin %q, not this console", o)
		}
	}
	return nil
}

// authorized reports whether r carries the token or a live session's
// cookie.
func (s *Server) authorized(r *http.Request) bool {
	if b, ok := bearer(r); ok {
		return subtle.ConstantTimeCompare([]byte(b), []byte(s.cfg.Token)) == 1
	}
	c, err := r.Cookie(sessionCookie)
	return err == nil && s.sessions.valid(c.Value, time.Now())
}

func (s *Server) loginForm(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "login", "Log in", loginView{Next: localPath(r.URL.Query().Get("next"))})
}

type loginView struct {
	Next  string
	Error string
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	next := localPath(r.PostFormValue("next"))
	if s.cfg.Token == "" {
		http.Redirect(w, r, next, http.StatusSeeOther)
		return
	}
	if !s.logins.allow(r) {
		s.log.Warn("console: login refused: too many attempts", "client", r.RemoteAddr)
		w.Header().Set("Retry-After", strconv.Itoa(int(LoginInterval.Seconds())))
		w.WriteHeader(http.StatusTooManyRequests)
		s.render(w, r, "login", "Log in", loginView{Next: next,
			Error: fmt.Sprintf("Too many login attempts from this address: try again in %s.", LoginInterval)})
		return
	}
	if subtle.ConstantTimeCompare([]byte(r.PostFormValue("token")), []byte(s.cfg.Token)) != 1 {
		s.log.Warn("console: login refused: wrong token", "client", r.RemoteAddr)
		w.WriteHeader(http.StatusUnauthorized)
		s.render(w, r, "login", "Log in", loginView{Next: next, Error: "That is not the console's token (RELAY_CONSOLE_TOKEN)."})
		return
	}
	// A new random id on every login: the cookie says nothing of the
	// token, and logging out ends it for good.
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.revoke(c.Value)
	}
	http.SetCookie(w, s.cookie(r, sessionCookie, s.sessions.create(time.Now()), int(s.cfg.SessionTTL.Seconds())))
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.revoke(c.Value)
	}
	http.SetCookie(w, s.cookie(r, sessionCookie, "", -1))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// localPath keeps a redirect target on this console: a path, never
// another host ("//evil", "/\evil", "https://...").
func localPath(p string) string {
	if !strings.HasPrefix(p, "/") || strings.HasPrefix(p, "//") || strings.ContainsAny(p, "\\\r\n") {
		return "/"
	}
	return p
}

// redis returns the client for one piece of work (a page, one read of
// the live feed, one sample): build and send all its commands through it.
func (s *Server) redis(ctx context.Context) rueidis.Client { return s.link.get(ctx) }

// Close stops the replay and remove of all matching entries still
// running (each after the entry it is on; a handler running is cancelled)
// and closes the Redis clients the console made through Config.Connect
// (never Config.Redis). Call it after the HTTP server and Sample have
// stopped.
func (s *Server) Close() {
	s.stopJobs()
	s.jobs.wait()
	s.link.close()
}

// Sample reads the cluster counters of every stream every SampleInterval
// until ctx is done, for the overview's rates and sparklines. Without it
// the overview shows the counters without rates.
func (s *Server) Sample(ctx context.Context) {
	t := time.NewTicker(s.cfg.SampleInterval)
	defer t.Stop()
	for {
		s.sampleOnce(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
