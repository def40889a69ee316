package console

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// DefaultReconnectInterval is the shortest time between two attempts of
// Config.Connect while the console has no Redis client.
const DefaultReconnectInterval = time.Second

// link holds the console's Redis client. With Config.Redis it is that
// client for good. With Config.Connect it starts without one: until a
// connect succeeds, every read goes to an offline client whose every
// command fails at once with the last connect error, so pages render
// their figures as unknown and name the error
// (docs/console.md#while-redis-is-unreachable). Requests and the sampler connect on demand, one
// attempt at a time and at most every ReconnectInterval, so the console
// recovers by itself when Redis comes back.
//
// A caller takes the client once per piece of work and builds and sends
// its commands through that one client: a command built by one client
// must not be sent by another (the offline client and a Redis Cluster
// client build different commands).
type link struct {
	connect  func(context.Context) (rueidis.Client, error)
	interval time.Duration
	log      *slog.Logger

	client  atomic.Pointer[rueidis.Client] // set once connected
	offline rueidis.Client                 // nil with Config.Redis

	mu      sync.Mutex // held by the one connect attempt in flight
	tried   time.Time
	lastErr atomic.Pointer[error]
	closed  bool
	// lost is the error of the newest reply when Redis could not be
	// reached (observe), nil when it answered.
	lost atomic.Pointer[error]
}

// errNotConnected is the offline client's error before the first attempt.
var errNotConnected = errors.New("not connected to Redis yet")

func newLink(cfg Config, log *slog.Logger) (*link, error) {
	l := &link{connect: cfg.Connect, interval: cfg.ReconnectInterval, log: log}
	if cfg.Redis != nil {
		var c rueidis.Client = watched{Client: cfg.Redis, l: l}
		l.client.Store(&c)
		return l, nil
	}
	l.lastErr.Store(&errNotConnected)
	// A single client whose dialer never dials: each command fails at
	// once (no retries) with the last connect error. rueidis returns the
	// client together with the first dial's error when ForceSingleClient
	// is set.
	off, err := rueidis.NewClient(rueidis.ClientOption{
		InitAddress:       []string{"offline"},
		ForceSingleClient: true,
		DisableRetry:      true,
		DisableCache:      true,
		DialCtxFn: func(context.Context, string, *net.Dialer, *tls.Config) (net.Conn, error) {
			return nil, *l.lastErr.Load()
		},
	})
	if off == nil {
		return nil, err
	}
	l.offline = off
	return l, nil
}

// get returns the client to use now: the connected one, else the result
// of a connect attempt when none is in flight and the last one is at
// least interval old, else the offline client.
func (l *link) get(ctx context.Context) rueidis.Client {
	if c := l.client.Load(); c != nil {
		return *c
	}
	if !l.mu.TryLock() {
		return l.offline
	}
	defer l.mu.Unlock()
	if c := l.client.Load(); c != nil {
		return *c
	}
	if l.closed || time.Since(l.tried) < l.interval || ctx.Err() != nil {
		return l.offline
	}
	c, err := l.connect(ctx)
	l.tried = time.Now()
	if err != nil {
		l.lastErr.Store(&err)
		return l.offline
	}
	c = watched{Client: c, l: l}
	l.client.Store(&c)
	l.log.Info("console: connected to Redis; the pages show its figures again")
	return c
}

// down returns the last connect error while the console has no client,
// nil once it has one.
func (l *link) down() error {
	if l.client.Load() != nil {
		return nil
	}
	return *l.lastErr.Load()
}

// close closes the clients the console made: the one Connect returned
// and the offline one, never Config.Redis.
func (l *link) close() {
	if l.offline == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.offline.Close()
	if c := l.client.Load(); c != nil {
		(*c).Close()
	}
}

// RetryDelay is the rueidis.ClientOption.RetryDelay of a console's Redis
// client: a read that met a broken connection is tried twice more at once
// (the connection left from before a Redis restart fails, and the client
// may report it twice before it dials again), then fails.
// rueidis's default retries reads until the request's context ends, so a
// refused connection made every page wait out Config.RequestTimeout (10 s)
// before it could say that Redis is unreachable
// (docs/console.md#while-redis-is-unreachable).
func RetryDelay(attempts int, _ rueidis.Completed, _ error) time.Duration {
	if attempts > 2 {
		return -1
	}
	return 0
}

// watched is the console's Redis client as pages use it: every reply
// tells the link whether Redis answered, so the pages can say at once
// that it is unreachable, and again that it is back.
type watched struct {
	rueidis.Client
	l *link
}

func (w watched) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	res := w.Client.Do(ctx, cmd)
	w.l.observe(res.Error())
	return res
}

func (w watched) DoMulti(ctx context.Context, cmds ...rueidis.Completed) []rueidis.RedisResult {
	res := w.Client.DoMulti(ctx, cmds...)
	for _, r := range res {
		w.l.observe(r.Error())
	}
	return res
}

// observe records whether a reply came from Redis: nil, a nil reply or a
// Redis error say it answered; any other error (refused, reset, timed
// out) says it is unreachable, until a later reply says otherwise. A
// request the browser gave up on says nothing.
func (l *link) observe(err error) {
	var re *rueidis.RedisError
	switch {
	case err == nil || rueidis.IsRedisNil(err) || errors.As(err, &re):
		if l.lost.Load() != nil {
			l.lost.Store(nil)
		}
	case errors.Is(err, context.Canceled):
	default:
		l.lost.Store(&err)
	}
}

// unreachable returns the error of the newest reply when it says Redis
// could not be reached, nil when Redis answered it.
func (l *link) unreachable() error {
	if e := l.lost.Load(); e != nil {
		return *e
	}
	return nil
}
