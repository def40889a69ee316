package keys

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrClusterLayout marks a stream whose derived keys would not share its
// Redis Cluster hash slot (CheckClusterLayout).
var ErrClusterLayout = errors.New("stream breaks the Redis Cluster key layout")

// CheckClusterLayout enforces the Redis Cluster rule of
// docs/deployment.md#redis-cluster-one-hash-slot-per-stream:
// every key Relay derives from a stream (its DLQ stream, invocation hashes,
// stats hash, schedule and idempotent-publish dedup keys) must hash to the
// stream's own slot, because Lua scripts, the schedule publisher and the
// idempotent producer touch several of them at once and a cluster refuses cross-slot scripts. That holds when the stream
// name carries a hash tag ("{orders}", "{orders}.events") free of ':' and
// '%', which internal/keys escapes. It returns one warning per hash tag
// that several streams share: legal, but those streams then live on one
// master and do not spread the load.
func CheckClusterLayout(streams []string, group string) (warnings []string, err error) {
	if group == "" {
		group = "relay" // the group follows the stream in every key: it cannot move the slot
	}
	var errs []error
	byTag := map[string][]string{}
	var tags []string
	for _, s := range streams {
		tag, ok := HashTag(s)
		if !ok {
			errs = append(errs, fmt.Errorf("stream %q has no hash tag, so under Redis Cluster its invocation state, DLQ and schedule keys would land in other hash slots than the stream: rename it to %q, in REDIS_STREAM and in the publishers",
				s, "{"+s+"}"))
			continue
		}
		want := Slot(s)
		for _, k := range Derived(s, group) {
			if got := Slot(k); got != want {
				errs = append(errs, fmt.Errorf("stream %q: key %s hashes to slot %d, not the stream's slot %d: a hash tag must not contain ':' or '%%' (Relay escapes them in key names); use a tag such as {%s}",
					s, k, got, want, strings.NewReplacer(":", "-", "%", "-").Replace(tag)))
				break
			}
		}
		if byTag[tag] == nil {
			tags = append(tags, tag)
		}
		byTag[tag] = append(byTag[tag], s)
	}
	for _, tag := range tags {
		if ss := byTag[tag]; len(ss) > 1 {
			warnings = append(warnings, fmt.Sprintf("streams %s share the hash tag {%s}: they live in one slot on one master, so they do not spread the load; give each its own tag to scale out", strings.Join(ss, ", "), tag))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return warnings, layoutError{err}
	}
	return warnings, nil
}

// Derived are the keys Relay builds from a stream for group, with
// placeholder ids where only their shape matters: the DLQ stream, an
// invocation hash, the stats hash, the feed, a flow-control limit key, a
// schedule dedup key and an idempotent-publish dedup key
// (docs/delivery.md#data-layout-in-redis).
func Derived(stream, group string) []string {
	return []string{
		DLQ(stream),
		Invocation(stream, group, "0-0"),
		Stats(stream, group),
		Feed(stream, group),
		Limit(stream, group, "slots", "app/handler", "key"),
		ScheduleOccurrence(stream, "app", "schedule", time.Unix(0, 0)),
		Idempotency(stream, "key"),
	}
}

// StreamAndDerived is stream followed by Derived(stream, group): every key
// a worker of group touches for stream, as an access check probes them.
func StreamAndDerived(stream, group string) []string {
	return append([]string{stream}, Derived(stream, group)...)
}

// slotCount is the number of Redis Cluster hash slots.
const slotCount = 16384

// Slot returns the Redis Cluster hash slot of key: CRC16 (XMODEM)
// of its hash tag, or of the whole key without one, modulo 16384 (Redis
// Cluster specification, "Key distribution model").
func Slot(key string) uint16 {
	if tag, ok := HashTag(key); ok {
		key = tag
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc % slotCount
}

// layoutError is CheckClusterLayout's error: it reads as the problems found
// and matches ErrClusterLayout.
type layoutError struct{ error }

func (e layoutError) Unwrap() error { return e.error }

func (layoutError) Is(target error) bool { return target == ErrClusterLayout }
