package worker

import (
	"context"
	"log/slog"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/ctxtime"
	"github.com/relaydev/relay/internal/redisinfo"
)

// policyWatch warns when a Redis server of the worker may evict keys: an
// evicted invocation hash, dedup key or stream loses work
// (docs/operations.md#redis-memory). It reads maxmemory-policy at start
// (check) and again every interval (Run), so that a CONFIG SET after start
// to a policy that evicts is warned about as at start.
type policyWatch struct {
	redis    rueidis.Client
	interval time.Duration
	log      *slog.Logger
	// policies holds, by server address, the policy last read; nil before
	// the first check. Used by check at start, then by Run alone.
	policies map[string]string
}

// Run checks every interval until ctx ends.
func (p *policyWatch) Run(ctx context.Context) {
	ctxtime.Every(ctx, p.interval, func() { p.check(ctx) })
}

// check warns when a server may evict keys, or says it no longer does; a
// server that does not tell (INFO refused) is noted once.
func (p *policyWatch) check(ctx context.Context) {
	first := p.policies == nil
	if first {
		p.policies = map[string]string{}
	}
	mems, err := redisinfo.MemoryPolicies(ctx, p.redis)
	if err != nil && first {
		// Once: a user without INFO cannot read it at any check.
		p.log.LogAttrs(ctx, slog.LevelInfo, "cannot read Redis's maxmemory-policy; make sure it is noeviction", slog.Any("error", err))
	}
	for _, m := range mems {
		last, seen := p.policies[m.Addr]
		p.policies[m.Addr] = m.Policy
		switch {
		case m.Evicts() && m.Policy != last:
			p.log.LogAttrs(ctx, slog.LevelWarn, "Redis may evict keys (maxmemory-policy is not noeviction); set maxmemory-policy noeviction",
				slog.String("redis", m.Addr), slog.String("maxmemory_policy", m.Policy), slog.String("may_evict", m.MayEvict()))
		case !m.Evicts() && seen && last != m.Policy:
			p.log.LogAttrs(ctx, slog.LevelInfo, "Redis no longer evicts keys (maxmemory-policy is noeviction)",
				slog.String("redis", m.Addr), slog.String("was", last))
		}
	}
}
