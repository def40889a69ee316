package console

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Session and login settings (docs/console.md#security).
const (
	// DefaultSessionTTL is how long a login lasts (Config.SessionTTL).
	DefaultSessionTTL = 12 * time.Hour
	// MinTokenLength is the shortest token relay console accepts when it
	// listens off loopback: a short token falls to guessing even at the
	// login's rate limit.
	MinTokenLength = 16
	// LoginBurst login attempts from one client address are answered at
	// once; after that one more every LoginInterval, and the others get
	// 429 Too Many Requests, whether the token is right or not.
	LoginBurst    = 10
	LoginInterval = 6 * time.Second
	// maxSessions bounds the sessions kept: only a holder of the token can
	// make one, but a script logging in in a loop must not grow memory.
	maxSessions = 10_000
	// maxLimiters bounds the client addresses whose login attempts are
	// counted; full (idle) ones are dropped first.
	maxLimiters = 10_000
)

// sessions are the logged-in browsers: a random id each, kept in the
// console's memory only (by its SHA-256, so a lookup's timing says nothing
// of a valid id). Logging out ends one; a restart, as a new token needs,
// ends them all.
type sessions struct {
	mu  sync.Mutex
	ttl time.Duration
	ids map[[32]byte]time.Time // hashed id → expiry
}

func newSessions(ttl time.Duration) *sessions {
	return &sessions{ttl: ttl, ids: map[[32]byte]time.Time{}}
}

// create returns a new session id, valid for ttl.
func (s *sessions) create(now time.Time) string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ids) >= maxSessions {
		s.pruneLocked(now)
	}
	if len(s.ids) >= maxSessions { // all live: the oldest-expiring goes
		var oldest [32]byte
		var at time.Time
		for k, exp := range s.ids {
			if at.IsZero() || exp.Before(at) {
				oldest, at = k, exp
			}
		}
		delete(s.ids, oldest)
	}
	s.ids[sha256.Sum256([]byte(id))] = now.Add(s.ttl)
	return id
}

// valid reports whether id is a live session.
func (s *sessions) valid(id string, now time.Time) bool {
	if id == "" {
		return false
	}
	k := sha256.Sum256([]byte(id))
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.ids[k]
	if ok && !now.Before(exp) {
		delete(s.ids, k)
		return false
	}
	return ok
}

// revoke ends session id.
func (s *sessions) revoke(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.ids, sha256.Sum256([]byte(id)))
}

func (s *sessions) pruneLocked(now time.Time) {
	for k, exp := range s.ids {
		if !now.Before(exp) {
			delete(s.ids, k)
		}
	}
}

// loginLimiter counts login attempts per client address (a token bucket
// each, golang.org/x/time/rate).
type loginLimiter struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newLoginLimiter() *loginLimiter { return &loginLimiter{m: map[string]*rate.Limiter{}} }

// allow reports whether one more attempt from r's address may be tried.
// Behind a reverse proxy every client shares the proxy's address, so a
// guessing client there slows the others' logins too; it never unlocks
// a guess.
func (l *loginLimiter) allow(r *http.Request) bool {
	addr := r.RemoteAddr
	if h, _, err := net.SplitHostPort(addr); err == nil {
		addr = h
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	lim := l.m[addr]
	if lim == nil {
		if len(l.m) >= maxLimiters {
			for k, v := range l.m {
				if v.Tokens() >= LoginBurst {
					delete(l.m, k)
				}
			}
		}
		lim = rate.NewLimiter(rate.Every(LoginInterval), LoginBurst)
		l.m[addr] = lim
	}
	return lim.Allow()
}

// bearer returns the token of an "Authorization: Bearer <token>" header;
// the scheme is case-insensitive (RFC 9110, section 11.1).
func bearer(r *http.Request) (string, bool) {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(r.Header.Get("Authorization")), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", false
	}
	return strings.TrimSpace(tok), true
}

// secure reports whether the browser reached the console over HTTPS, so
// its cookies get the Secure attribute: Config.SecureCookies says so, the
// connection is TLS, or a reverse proxy named in Config.Hosts (the request
// came to that name) says X-Forwarded-Proto: https.
func (s *Server) secure(r *http.Request) bool {
	if s.cfg.SecureCookies || r.TLS != nil {
		return true
	}
	return strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") && s.viaProxy(r.Host)
}

// cookie is a console cookie: HttpOnly, SameSite=Strict, Secure over HTTPS.
func (s *Server) cookie(r *http.Request, name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		SameSite: http.SameSiteStrictMode, Secure: s.secure(r)}
}
