package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/console"
	"github.com/relaydev/relay/runtime"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// ConsoleCmd is `relay console`.
type ConsoleCmd struct {
	Listen   string   `default:"127.0.0.1:8089" placeholder:"HOST:PORT" help:"Address to serve the console on (default ${default}). Any address other than loopback requires RELAY_CONSOLE_TOKEN."`
	Token    string   `name:"token" env:"RELAY_CONSOLE_TOKEN" help:"Token every request must carry (Authorization: Bearer, or the login form's cookie); required off loopback. Prefer the env variable."`
	Hosts    []string `name:"host" placeholder:"NAME" help:"Further Host name to answer without a token (a local reverse proxy's); without a token only loopback names are answered. Repeatable."`
	ReadOnly bool     `name:"read-only" help:"Hide and refuse replay and remove."`
	Secure   bool     `name:"secure-cookies" help:"Mark the console's cookies Secure: browsers reach it over HTTPS through a TLS-terminating proxy. (A request through a --host proxy saying X-Forwarded-Proto: https gets them anyway.)"`
	// The workers' retentions, for the overview's memory projection.
	RetentionFlags `embed:""`
	// The workers' event size limit, for the playground's backtest.
	MaxEventBytes byteSize `name:"max-event-bytes" env:"MAX_EVENT_BYTES" default:"1MiB" help:"The workers' MAX_EVENT_BYTES: the playground's backtest counts a larger event as malformed."`
	RunnerFlags   `embed:""`
}

// Help shows examples under relay console --help.
func (c *ConsoleCmd) Help() string {
	return `Serves a web console for on-call work: the pipeline of every stream in REDIS_STREAM (a comma list) for the group REDIS_GROUP, the apps under RELAY_APPS, pending messages, the dead-letter queue (filter, inspect, replay, remove: the semantics of relay dlq replay and rm), a pattern playground and a live tail of outcomes. Replays run through the same runner as relay start (--runner, CONTAINERD_*). See docs/console.md.

Examples:

    relay console
    relay console --read-only --listen 127.0.0.1:9000
    RELAY_CONSOLE_TOKEN=$(openssl rand -hex 16) relay console --listen 0.0.0.0:8089`
}

// consoleShutdown bounds the wait for open requests at a stop; the live
// tails end at once with their context.
const consoleShutdown = 5 * time.Second

// Run serves the console until ctx is cancelled (SIGINT, SIGTERM).
func (c *ConsoleCmd) Run(ctx context.Context, g *Globals) error {
	streams, host, err := c.parse(g)
	if err != nil {
		return err
	}
	if _, err := g.loadApps(); err != nil {
		return err
	}
	log := g.logger()
	cfg := console.Config{Streams: streams, Group: g.RedisGroup, Apps: template.Dir(g.Apps),
		ReadOnly: c.ReadOnly, Token: c.Token, Hosts: c.Hosts, SecureCookies: c.Secure, DLQRetention: c.Retention,
		StreamRetention: c.StreamRetention, InvocationRetention: c.InvocationRetention,
		MaxEventBytes: int(c.MaxEventBytes), Logger: log, DefaultImage: ctrd.DefaultImage}
	closeRedis, err := c.connect(ctx, g, &cfg)
	if err != nil {
		return err
	}
	defer closeRedis()
	if c.Runner == "containerd" {
		// The Apps page shows each dependency image as relay app inspect
		// does, asking containerd.
		deps := &consoleDeps{open: func() (*openRunner, error) {
			return c.open(ctx, log, io.Discard, io.Discard, cliHostID(), ctrd.WithPreparedContainers(0))
		}}
		defer deps.Close()
		cfg.Deps = deps.lookUp
	}
	if !c.ReadOnly {
		// Handler output of replays goes to the console's stderr, prefixed
		// [app/handler], like relay dlq replay --json.
		runner := c.manualRunner(ctx, g, true)
		defer runner.Close()
		cfg.Runner = runner
	}
	srv, err := console.New(cfg)
	if err != nil {
		return err
	}
	defer srv.Close()
	return c.serve(ctx, g, srv, host, streams)
}

// parse checks the flags: the streams, the listen address and the token
// it needs; host is the address's host.
func (c *ConsoleCmd) parse(g *Globals) (streams []string, host string, err error) {
	if streams, err = g.startStreams(); err != nil {
		return nil, "", err
	}
	if err := c.check(); err != nil {
		return nil, "", err
	}
	host, _, err = net.SplitHostPort(c.Listen)
	if err != nil {
		return nil, "", usagef("--listen %q: want HOST:PORT, e.g. 127.0.0.1:8089", c.Listen)
	}
	if !console.Loopback(host) && c.Token == "" {
		return nil, "", usagef("--listen %s is not a loopback address: set RELAY_CONSOLE_TOKEN so that every request must carry it (the console shows event payloads and can replay work)", c.Listen)
	}
	if n := len([]rune(c.Token)); !console.Loopback(host) && n < console.MinTokenLength {
		return nil, "", usagef("RELAY_CONSOLE_TOKEN has %d characters: off loopback (--listen %s) it needs at least %d, e.g. openssl rand -hex 16", n, c.Listen, console.MinTokenLength)
	}
	return streams, host, nil
}

// connect sets cfg.Redis, or cfg.Connect when Redis is unreachable: the
// on-call engineer opens the console when things are broken, so it serves
// pages that say so and connects once Redis is back
// (docs/console.md#while-redis-is-unreachable). closeFn closes the client.
func (c *ConsoleCmd) connect(ctx context.Context, g *Globals, cfg *console.Config) (closeFn func(), err error) {
	// A page fails at once when Redis refuses the connection, rather than
	// retrying until its request timeout.
	fast := func(o *rueidis.ClientOption) { o.RetryDelay = console.RetryDelay }
	rc, err := g.redisClient(fast)
	switch {
	case err == nil:
		for _, st := range cfg.Streams {
			if err := redisstream.New(rc, st, g.RedisGroup, "relay-console").Ping(ctx); err != nil && !errors.Is(err, stream.ErrNoStream) && !errors.Is(err, stream.ErrNoGroup) {
				rc.Close()
				return nil, fmt.Errorf("redis at %s: %w", redactURI(g.RedisURI), err)
			}
		}
		cfg.Redis = rc
		return rc.Close, nil
	case unreachable(err):
		cfg.Logger.Warn("relay console: Redis is unreachable; the pages say so until it is back", "error", err)
		cfg.Connect = func(context.Context) (rueidis.Client, error) { return g.redisClient(fast) }
		return func() {}, nil
	}
	return nil, err
}

// serve serves srv on --listen, and its sampler, until ctx is done.
func (c *ConsoleCmd) serve(ctx context.Context, g *Globals, srv *console.Server, host string, streams []string) error {
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fmt.Errorf("--listen %s: %w", c.Listen, err)
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return ctx }}
	// The sampler stops before srv.Close (deferred by Run) closes the
	// client it reads through.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampling sync.WaitGroup
	sampling.Go(func() { srv.Sample(sampleCtx) })
	defer func() { stopSampling(); sampling.Wait() }()
	done := make(chan error, 1)
	go func() { done <- hs.Serve(ln) }()
	fmt.Fprintf(g.stdout, "relay console on http://%s (streams %v, group %s)\n", servedAt(host, ln.Addr()), streams, g.RedisGroup)
	select {
	case err := <-done:
		return fmt.Errorf("console server: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), consoleShutdown)
	defer cancel()
	_ = hs.Shutdown(sctx)
	return nil
}

// servedAt is the address to print for a listener on host: the host as
// given (Go reports 0.0.0.0 as [::]) with the port bound (for port 0).
func servedAt(host string, addr net.Addr) string {
	_, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return addr.String()
	}
	return net.JoinHostPort(host, port)
}

// unreachable reports whether err, from connecting, says that Redis could
// not be reached (refused, reset, timed out, no route, an unknown name),
// rather than that it answered and refused the settings (a wrong
// password, not a cluster).
func unreachable(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}

// depsRetry is how long the console's dependency look-ups report a
// failure to open containerd before they try again.
const depsRetry = 10 * time.Second

// consoleDeps looks up dependency images for the console's Apps page
// through one containerd Runner, opened on the first look-up and again
// (at most every depsRetry) after a failed open.
type consoleDeps struct {
	open func() (*openRunner, error)

	mu       sync.Mutex
	r        *openRunner
	err      error
	failedAt time.Time
}

func (d *consoleDeps) lookUp(ctx context.Context, spec runtime.Spec) (console.DepsImage, error) {
	d.mu.Lock()
	if d.r == nil && (d.err == nil || time.Since(d.failedAt) >= depsRetry) {
		d.r, d.err = d.open()
		d.failedAt = time.Now()
	}
	r, err := d.r, d.err
	d.mu.Unlock()
	if r == nil {
		return console.DepsImage{}, err
	}
	img, _, err := r.containerd.DepsImageOf(ctx, spec)
	return console.DepsImage{Name: img.Name, Built: img.Built, BuiltAt: img.At, BuildTime: img.Duration, Size: img.Size}, err
}

// Close releases the Runner, if one was opened.
func (d *consoleDeps) Close() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.r != nil {
		d.r.Close()
	}
}
