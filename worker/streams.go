package worker

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/invocation/redisstate"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream/redisstream"
)

// streamParts are the Redis-backed parts of one stream, the Engine that
// consumes it through them, and the services that keep it: the retainer,
// the janitor and the memory watch.
type streamParts struct {
	name   string
	engine *relay.Engine
	source *redisstream.Source
	// ping is the Engine's source as a relay.Pinger, for readiness: the
	// wrapped one when WrapComponents wrapped it (checkWrapped keeps its
	// Pinger), else source.
	ping     relay.Pinger
	retainer *retainer
	janitor  *janitor
	memory   *memoryWatch // nil: Config.MemoryCheckInterval is Disabled
}

// newStreamParts builds the parts of stream name: its source, invocation
// store (which settles the source's messages: one Redis client),
// dead-letter writer (for trimming) and stats recorder, the Engine over them, and its retainer and janitor. reg
// is where the parts register their metrics, labelled by stream when the
// worker has several.
func newStreamParts(cfg Config, name string, reg prometheus.Registerer, log *slog.Logger) (*streamParts, error) {
	ecfg := cfg.Engine
	if len(cfg.Streams) > 1 {
		reg = prometheus.WrapRegistererWith(prometheus.Labels{"stream": name}, reg)
		ecfg.Metrics = reg
	}
	if !cfg.DisableStats {
		ecfg.Stats = redisstats.NewRecorder(cfg.Redis, name, cfg.Group)
	}
	var srcOpts []redisstream.Option
	if ecfg.Logger != nil {
		srcOpts = append(srcOpts, redisstream.WithLogger(ecfg.Logger))
	}
	src := redisstream.New(cfg.Redis, name, cfg.Group, cfg.Consumer, srcOpts...)
	// The store settles the source's messages: one Redis client, so a
	// message's last transitions, its dead-letter entries, its XACK and
	// its retention take one script (docs/delivery.md#invocation-state).
	store := redisstate.New(cfg.Redis)
	dlqw := redisdlq.NewWriter(cfg.Redis, name)
	c := relay.Components{
		Source: src, State: store, Runner: cfg.Runner,
		Stream: name, Group: cfg.Group, Consumer: cfg.Consumer,
	}
	if cfg.WrapComponents != nil {
		orig := c
		c = cfg.WrapComponents(c)
		if err := checkWrapped(orig, c); err != nil {
			return nil, fmt.Errorf("worker: New: stream %s: WrapComponents: %w", name, err)
		}
	}
	var ping relay.Pinger = src
	if p, ok := c.Source.(relay.Pinger); ok {
		ping = p
	}
	empty, _ := app.NewSet()
	e, err := relay.NewEngine(empty, c, ecfg)
	if err != nil {
		return nil, fmt.Errorf("worker: New: stream %s: %w", name, err)
	}
	m, err := newStreamMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("worker: New: stream %s: register metrics: %w", name, err)
	}
	log = log.With(slog.String("stream", name))
	p := &streamParts{
		name: name, engine: e, source: src, ping: ping,
		retainer: &retainer{cfg: retainerConfigOf(cfg), source: src, dlq: dlqw, log: log, m: m},
		janitor: &janitor{interval: cfg.JanitorInterval, ttl: cfg.stateRetention(), state: store,
			stream: name, group: cfg.Group, log: log, retained: m.leaksRetained},
	}
	if cfg.MemoryCheckInterval > 0 {
		p.memory = &memoryWatch{interval: cfg.MemoryCheckInterval, redis: cfg.Redis, stream: name, group: cfg.Group,
			retentions: memoryRetentions(cfg), log: log, projected: m.memoryProjected, maxmemory: m.maxmemory, used: m.usedMemory}
	}
	return p, nil
}

// checkWrapped refuses wrapped parts that break a promise of the parts the
// Worker built (docs/embedding.md#wrapping-the-parts): a Source that lost
// an optional capability (the group would not be created, the PEL gauges
// would stay 0, readiness would not ask the stream).
func checkWrapped(orig, c relay.Components) error {
	var errs []error
	for _, capability := range []struct {
		name string
		has  func(relay.StreamSource) bool
	}{
		{"relay.GroupEnsurer", func(s relay.StreamSource) bool { _, ok := s.(relay.GroupEnsurer); return ok }},
		{"relay.PendingReporter", func(s relay.StreamSource) bool { _, ok := s.(relay.PendingReporter); return ok }},
		{"relay.Pinger", func(s relay.StreamSource) bool { _, ok := s.(relay.Pinger); return ok }},
	} {
		if c.Source != nil && capability.has(orig.Source) && !capability.has(c.Source) {
			errs = append(errs, fmt.Errorf("the Source %T hides %s of the Worker's source: implement it and forward the call", c.Source, capability.name))
		}
	}
	return errors.Join(errs...)
}
