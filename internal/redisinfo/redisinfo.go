// Package redisinfo reads facts about the Redis servers a client talks to
// that Relay's guarantees depend on, for relay start and relay health to
// warn about (docs/operations.md#redis-memory).
//
// It reads INFO, not CONFIG GET, since managed Redis services often
// disable CONFIG. It never changes a server and never closes the client.
package redisinfo

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/redis/rueidis"

	relaykeys "github.com/relaydev/relay/internal/keys"
)

// NoEviction is the maxmemory-policy under which Redis refuses writes
// instead of evicting keys when it reaches maxmemory.
const NoEviction = "noeviction"

// Memory is the memory policy of one Redis server (INFO memory).
type Memory struct {
	// Addr is the server's address as the client knows it.
	Addr string
	// Policy is maxmemory_policy, for example "noeviction" or
	// "allkeys-lru".
	Policy string
	// MaxMemory is maxmemory in bytes; 0 means no limit.
	MaxMemory int64
}

// Evicts reports whether the server may evict keys to stay under
// maxmemory: any policy but noeviction. Eviction can remove a stream, a
// pending message's invocation state (with its dead-letter markers) or a
// dedup key, which breaks Relay's delivery guarantees; volatile-* policies
// evict only keys with a TTL (retained invocation state, dedup keys),
// which weakens them. With noeviction a full Redis refuses writes and Relay fails
// closed: messages stay pending until memory is freed.
func (m Memory) Evicts() bool { return m.Policy != NoEviction }

// MayEvict says what of Relay's data the policy lets Redis evict, for a
// warning (docs/operations.md#redis-memory): "" under noeviction; under a
// volatile-* policy only keys with a TTL (retained invocation state and
// the dedup keys), which can never be the stream or the state of a
// pending message; under any other policy every key.
func (m Memory) MayEvict() string {
	switch {
	case !m.Evicts():
		return ""
	case strings.HasPrefix(m.Policy, "volatile-"):
		return "retained invocation state and dedup keys (keys with a TTL)"
	default:
		return "the stream, pending messages' invocation state and dedup keys"
	}
}

func (m Memory) String() string {
	limit := "no maxmemory"
	if m.MaxMemory > 0 {
		limit = "maxmemory " + strconv.FormatInt(m.MaxMemory, 10) + " bytes"
	}
	return fmt.Sprintf("%s: maxmemory-policy %s, %s", m.Addr, m.Policy, limit)
}

// MemoryPolicies returns the memory policy of every server client knows
// (client.Nodes(): the server, the Sentinel master, or every node of a
// Cluster), sorted by address. The error names the servers whose INFO
// memory could not be read; what was read is returned with it.
func MemoryPolicies(ctx context.Context, client rueidis.Client) ([]Memory, error) {
	nodes := client.Nodes()
	var out []Memory
	var errs []error
	for _, addr := range slices.Sorted(maps.Keys(nodes)) {
		n := nodes[addr]
		info, err := n.Do(ctx, n.B().Info().Section("memory").Build()).ToString()
		if err != nil {
			errs = append(errs, fmt.Errorf("redisinfo: INFO memory on %s: %w", addr, err))
			continue
		}
		m, err := ParseMemory(info)
		if err != nil {
			errs = append(errs, fmt.Errorf("redisinfo: INFO memory on %s: %w", addr, err))
			continue
		}
		m.Addr = addr
		out = append(out, m)
	}
	return out, errors.Join(errs...)
}

// Evicting returns the servers of MemoryPolicies that may evict keys.
func Evicting(ctx context.Context, client rueidis.Client) ([]Memory, error) {
	all, err := MemoryPolicies(ctx, client)
	return slices.DeleteFunc(all, func(m Memory) bool { return !m.Evicts() }), err
}

// ParseMemory reads maxmemory_policy and maxmemory from the text of INFO
// memory ("field:value" lines). Addr is left empty.
func ParseMemory(info string) (Memory, error) {
	var m Memory
	var havePolicy, haveMax bool
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch k {
		case "maxmemory_policy":
			m.Policy, havePolicy = v, true
		case "maxmemory":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return Memory{}, fmt.Errorf("maxmemory %q: %w", v, err)
			}
			m.MaxMemory, haveMax = n, true
		}
	}
	if !havePolicy || !haveMax {
		return Memory{}, errors.New("no maxmemory_policy or maxmemory field")
	}
	return m, nil
}

// ErrNoPermission marks an Access probe that the server's ACL refused
// (NOPERM): the user Relay connects as lacks a command or a key that
// docs/deployment.md#connecting-to-redis lists.
var ErrNoPermission = errors.New("the Redis user lacks a permission Relay needs")

// accessProbe reads, never writes: TIME (the clock every transition
// uses), TYPE on every key and, by what it holds, HEXISTS (a hash, or a
// key not there yet), XLEN (a stream), ZCARD (a sorted set, or a key
// ARGV marks 'z': a flow-control slots key, not there yet) or EXISTS.
// Redis checks the declared keys against the user's key patterns before the script runs, and each
// call inside it against the user's commands.
var accessProbe = rueidis.NewLuaScript(`
redis.call('TIME')
for i, k in ipairs(KEYS) do
  local t = redis.call('TYPE', k)['ok']
  if t == 'zset' or (t == 'none' and ARGV[i] == 'z') then
    redis.call('ZCARD', k)
  elseif t == 'hash' or t == 'none' then
    redis.call('HEXISTS', k, '__probe')
  elseif t == 'stream' then
    redis.call('XLEN', k)
  else
    redis.call('EXISTS', k)
  end
end
return 1
`)

// refused tells an ACL refusal from other errors: NOPERM for the script
// or its keys, and, from Redis 7.0, a command refused inside the script
// ("The user executing the script can't run this command", which later
// versions report as NOPERM).
func refused(msg string) bool {
	return strings.HasPrefix(msg, "NOPERM") || strings.Contains(msg, "user executing the script can't run")
}

// Access checks that the client's user may run scripts (EVALSHA, EVAL),
// TIME, and hash, stream and keyspace reads on keys: the stream and the
// keys Relay derives from it (keys.Derived), whatever each holds. It
// changes nothing. Under Redis Cluster every key must share one hash
// slot. A refusal by the ACL returns an error wrapping ErrNoPermission
// with the server's message (NOPERM, naming the command or saying a key
// was refused) and the keys probed; other errors (the server unreachable) are returned as they are.
func Access(ctx context.Context, client rueidis.Client, keys []string) error {
	if len(keys) == 0 {
		return errors.New("redisinfo: access probe: no keys")
	}
	kinds := make([]string, len(keys))
	for i, k := range keys {
		kinds[i] = "-"
		if relaykeys.IsSlots(k) {
			kinds[i] = "z"
		}
	}
	err := accessProbe.Exec(ctx, client, keys, kinds).Error()
	if e, ok := rueidis.IsRedisErr(err); ok && refused(e.Error()) {
		return fmt.Errorf("%w: %s (keys probed: %s)", ErrNoPermission, e.Error(), strings.Join(keys, ", "))
	}
	if err != nil {
		return fmt.Errorf("redisinfo: access probe: %w", err)
	}
	return nil
}
