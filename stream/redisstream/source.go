package redisstream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stream"
)

// Source reads one Redis Stream as one consumer of one consumer group. It
// implements relay.StreamSource and the optional relay.GroupEnsurer,
// relay.PendingReporter, relay.OwnerChecker and relay.Pinger.
//
// A Source is safe for concurrent use.
type Source struct {
	client   rueidis.Client
	stream   string
	group    string
	consumer string
	opts     options

	mu     sync.Mutex
	cursor string // where the next Reclaim starts; "0-0" for a new pass
	// seen records that this Source created the group or found it (a
	// command on it succeeded): a group Read must create after that was
	// lost, while one never seen may just be new.
	seen atomic.Bool
	// recreations counts the groups Read created again after seen was
	// set; recreatedAt is the last one's time (Unix ms).
	recreations, recreatedAt atomic.Int64
}

// New returns a Source for consumer of group on stream. It neither connects
// nor creates the group (see EnsureGroup), and it never closes client.
//
// New panics when client is nil, a name is empty or an option is invalid:
// those are programming errors, never runtime conditions.
func New(client rueidis.Client, stream, group, consumer string, opts ...Option) *Source {
	switch {
	case client == nil:
		panic("stream: New: nil client")
	case stream == "":
		panic("stream: New: empty stream name")
	case group == "":
		panic("stream: New: empty group name")
	case consumer == "":
		panic("stream: New: empty consumer name")
	}
	o := options{block: DefaultBlock, reclaimCount: DefaultReclaimCount, trimLimit: DefaultTrimLimit, logger: slog.Default()}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			panic("stream: " + err.Error())
		}
	}
	return &Source{client: client, stream: stream, group: group, consumer: consumer, opts: o, cursor: "0-0"}
}

// Stream returns the stream name.
func (s *Source) Stream() string { return s.stream }

// Group returns the consumer group name.
func (s *Source) Group() string { return s.group }

// Consumer returns the consumer name.
func (s *Source) Consumer() string { return s.consumer }

// Client returns the Redis client the Source uses, so that a caller can
// tell whether another component talks to the same server (the Engine then
// pipelines the XACK with the state store's retain).
func (s *Source) Client() rueidis.Client { return s.client }

// EnsureGroup creates the consumer group from id 0, creating the stream if it
// does not exist (XGROUP CREATE ... 0 MKSTREAM). An existing group is left
// as it is. Idempotent. A refused XGROUP CREATE is no error when the group
// exists: Redis at maxmemory refuses it (OOM) whether or not the group is
// there, and a worker must still start then, to trim and free memory.
func (s *Source) EnsureGroup(ctx context.Context) error {
	_, err := s.createGroup(ctx)
	return err
}

// createGroup is EnsureGroup, and reports whether it created the group.
func (s *Source) createGroup(ctx context.Context) (created bool, err error) {
	cmd := s.client.B().XgroupCreate().Key(s.stream).Group(s.group).Id("0").Mkstream().Build()
	switch err := s.client.Do(ctx, cmd).Error(); {
	case err == nil:
		s.seen.Store(true)
		return true, nil
	case rueidis.IsRedisBusyGroup(err):
		s.seen.Store(true)
		return false, nil
	default:
		if s.Ping(ctx) == nil {
			return false, nil // there already: the refusal (OOM) did not matter
		}
		return false, fmt.Errorf("stream: create group %s on %s: %w", s.group, s.stream, err)
	}
}

// Read returns up to count new entries for this consumer (XREADGROUP ... >),
// blocking at most the WithBlock duration; it returns (nil, nil) when none
// arrived. Every message has Deliveries 1. If the group is missing (deleted
// by an operator, or the stream key removed, also while Read was blocked;
// or never created), Read creates it once as EnsureGroup does and reads
// again. A created group starts at id 0 and so delivers every entry still
// in the stream: when this Source had found the group before (EnsureGroup,
// a read or another command on the group), they are delivered again, which
// Read logs as a warning (WithLogger); creating a group it never saw, as
// at the first start of an Engine whose source hides relay.GroupEnsurer,
// is logged at INFO. count must be > 0.
func (s *Source) Read(ctx context.Context, count int) ([]stream.Message, error) {
	if count <= 0 {
		return nil, fmt.Errorf("stream: read %s: count must be > 0, got %d", s.stream, count)
	}
	msgs, err := s.read(ctx, count)
	if errors.Is(err, stream.ErrNoGroup) || errors.Is(err, errUnblocked) {
		seen := s.seen.Load()
		created, cerr := s.createGroup(ctx)
		if cerr != nil {
			return nil, cerr
		}
		switch {
		case created && seen:
			s.recreatedAt.Store(time.Now().UnixMilli())
			s.recreations.Add(1)
			s.opts.logger.LogAttrs(ctx, slog.LevelWarn, "the consumer group was missing and has been created again from id 0: "+
				"every entry still in the stream is delivered again (Redis lost its data, or the group or the stream was deleted)",
				slog.String("stream", s.stream), slog.String("group", s.group))
		case created:
			s.opts.logger.LogAttrs(ctx, slog.LevelInfo, "created the consumer group from id 0: every entry already in the stream is delivered",
				slog.String("stream", s.stream), slog.String("group", s.group))
		}
		msgs, err = s.read(ctx, count)
	}
	return msgs, err
}

// GroupRecreations reports how many times Read created the consumer
// group again after this Source had found it (the warning Read logs:
// Redis lost its data, or the group or the stream was deleted), and the
// local time of the last one; 0 and the zero time when it never did.
// Creating a group never seen, as at a first start, does not count. The
// worker publishes both (docs/delivery.md#worker-status). Safe for
// concurrent use.
func (s *Source) GroupRecreations() (n int, last time.Time) {
	at := s.recreatedAt.Load()
	if at == 0 {
		return 0, time.Time{}
	}
	return int(s.recreations.Load()), time.UnixMilli(at)
}

func (s *Source) read(ctx context.Context, count int) ([]stream.Message, error) {
	cmd := s.client.B().Xreadgroup().Group(s.group, s.consumer).Count(int64(count)).
		Block(s.opts.block.Milliseconds()).Streams().Key(s.stream).Id(">").Build()
	res, err := s.client.Do(ctx, cmd).AsXRead()
	if rueidis.IsRedisNil(err) {
		s.seen.Store(true)
		return nil, nil
	}
	if isUnblocked(err) {
		// Redis 7 ends a blocked XREADGROUP with UNBLOCKED when the stream
		// key is deleted (the group goes with it).
		return nil, fmt.Errorf("stream: read %s: %w: %w", s.stream, errUnblocked, err)
	}
	if err != nil {
		return nil, s.wrap("read", err)
	}
	s.seen.Store(true)
	entries := res[s.stream]
	if len(entries) == 0 {
		return nil, nil
	}
	msgs := make([]stream.Message, len(entries))
	for i, e := range entries {
		msgs[i] = stream.Message{ID: e.ID, Fields: e.FieldValues, Deliveries: 1}
	}
	return msgs, nil
}

// Ack acknowledges ids (XACK). Acknowledging an id that is not pending, or
// no id at all, is not an error. Idempotent.
func (s *Source) Ack(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	cmd := s.client.B().Xack().Key(s.stream).Group(s.group).Id(ids...).Build()
	if err := s.client.Do(ctx, cmd).Error(); err != nil {
		return s.wrap("ack", err)
	}
	return nil
}

// Publish appends an entry with fields to the stream (XADD * in sorted field
// order) and returns its id. fields must not be empty. Not idempotent: a
// retried Publish may append a second entry.
func (s *Source) Publish(ctx context.Context, fields map[string]string) (string, error) {
	if len(fields) == 0 {
		return "", fmt.Errorf("stream: publish to %s: no fields", s.stream)
	}
	cmd := s.client.B().Xadd().Key(s.stream).Id("*").FieldValue()
	for _, k := range slices.Sorted(maps.Keys(fields)) {
		cmd = cmd.FieldValue(k, fields[k])
	}
	id, err := s.client.Do(ctx, cmd.Build()).ToString()
	if err != nil {
		return "", fmt.Errorf("stream: publish to %s: %w", s.stream, err)
	}
	return id, nil
}

// Heartbeat resets the idle time of the entries of ids that are still
// pending in the group and makes them this consumer's (XCLAIM <min-idle 0>
// ... JUSTID, which leaves their delivery counts alone), so that no other
// consumer's XAUTOCLAIM takes live work, and returns the ids that are not
// pending: acknowledged, or lost with Redis's data (a restart without
// it). A pending id whose stream entry was deleted is dropped from the PEL
// by Redis and returned too. It implements relay.StreamSource.
func (s *Source) Heartbeat(ctx context.Context, ids ...string) (gone []string, err error) {
	if len(ids) == 0 {
		return nil, nil
	}
	cmd := s.client.B().Xclaim().Key(s.stream).Group(s.group).Consumer(s.consumer).
		MinIdleTime("0").Id(ids...).Justid().Build()
	claimed, err := s.client.Do(ctx, cmd).AsStrSlice()
	if err != nil {
		return nil, s.wrap("heartbeat", err)
	}
	s.seen.Store(true)
	if len(claimed) == len(ids) {
		return nil, nil
	}
	pending := make(map[string]bool, len(claimed))
	for _, id := range claimed {
		pending[id] = true
	}
	for _, id := range ids {
		if !pending[id] {
			gone = append(gone, id)
		}
	}
	return gone, nil
}

// Owned reports which of ids are in the group's PEL and delivered to this
// consumer (a single-id XPENDING each, pipelined): an id missing from the
// map was acknowledged, or another consumer took it over. It implements
// relay.OwnerChecker, which keeps held counts true
// (docs/delivery.md#held-messages).
func (s *Source) Owned(ctx context.Context, ids []string) (map[string]bool, error) {
	owned := make(map[string]bool, len(ids))
	b := s.client.B()
	for from := 0; from < len(ids); from += ownedChunk {
		chunk := ids[from:min(from+ownedChunk, len(ids))]
		cmds := make(rueidis.Commands, len(chunk))
		for i, id := range chunk {
			cmds[i] = b.Xpending().Key(s.stream).Group(s.group).Start(id).End(id).Count(1).Build()
		}
		for i, res := range s.client.DoMulti(ctx, cmds...) {
			rows, err := res.ToArray()
			if err != nil {
				return nil, s.wrap("owned", err)
			}
			if len(rows) == 0 {
				continue
			}
			row, err := rows[0].ToArray()
			if err != nil || len(row) < 2 {
				return nil, fmt.Errorf("stream: owned %s: XPENDING entry of %s: %v", s.stream, chunk[i], err)
			}
			if consumer, _ := row[1].ToString(); consumer == s.consumer {
				owned[chunk[i]] = true
			}
		}
		s.seen.Store(true)
	}
	return owned, nil
}

// ownedChunk bounds the commands of one Owned round trip.
const ownedChunk = 1000

// Ping checks that Redis answers and that the stream and its consumer group
// exist. The error wraps stream.ErrNoStream or stream.ErrNoGroup and names what is missing.
func (s *Source) Ping(ctx context.Context) error {
	b := s.client.B()
	res := s.client.DoMulti(ctx,
		b.Ping().Build(),
		b.Exists().Key(s.stream).Build(),
		b.XinfoGroups().Key(s.stream).Build(),
	)
	if err := res[0].Error(); err != nil {
		return fmt.Errorf("stream: ping: %w", err)
	}
	n, err := res[1].AsInt64()
	if err != nil {
		return fmt.Errorf("stream: ping: exists %s: %w", s.stream, err)
	}
	if n == 0 {
		return fmt.Errorf("stream: ping: stream %q: %w", s.stream, stream.ErrNoStream)
	}
	groups, err := res[2].ToArray()
	if err != nil {
		return fmt.Errorf("stream: ping: xinfo groups %s: %w", s.stream, err)
	}
	for _, g := range groups {
		info, err := g.AsMap()
		if err != nil {
			return fmt.Errorf("stream: ping: xinfo groups %s: %w", s.stream, err)
		}
		name := info["name"]
		if v, err := name.ToString(); err == nil && v == s.group {
			s.seen.Store(true)
			return nil
		}
	}
	return fmt.Errorf("stream: ping: group %q on stream %q: %w", s.group, s.stream, stream.ErrNoGroup)
}

// Pending returns how many entries of the group are pending (XPENDING
// summary) and the age of the oldest one: the Redis server's TIME minus the
// millisecond part of its id, that is, how long ago the oldest
// unacknowledged entry was added (0 when nothing is pending). Idle time is
// not used, since every reclaim resets it. The error wraps stream.ErrNoGroup when
// the group is missing.
func (s *Source) Pending(ctx context.Context) (count int64, oldestAge time.Duration, err error) {
	b := s.client.B()
	res := s.client.DoMulti(ctx,
		b.Xpending().Key(s.stream).Group(s.group).Build(),
		b.Time().Build(),
	)
	summary, err := res[0].ToArray()
	if err != nil {
		return 0, 0, s.wrap("pending", err)
	}
	s.seen.Store(true)
	now, err := res[1].AsStrSlice()
	if err != nil {
		return 0, 0, fmt.Errorf("stream: pending %s: time: %w", s.stream, err)
	}
	if len(summary) < 2 {
		return 0, 0, fmt.Errorf("stream: pending %s: summary has %d elements, want 4", s.stream, len(summary))
	}
	if count, err = summary[0].AsInt64(); err != nil {
		return 0, 0, fmt.Errorf("stream: pending %s: count: %w", s.stream, err)
	}
	if count == 0 {
		return 0, 0, nil
	}
	oldest, err := summary[1].ToString()
	if err != nil {
		return 0, 0, fmt.Errorf("stream: pending %s: oldest id: %w", s.stream, err)
	}
	nowMS, err := serverMillis(now)
	if err != nil {
		return 0, 0, fmt.Errorf("stream: pending %s: time: %w", s.stream, err)
	}
	idMS, err := idMillis(oldest)
	if err != nil {
		return 0, 0, fmt.Errorf("stream: pending %s: %w", s.stream, err)
	}
	if age := nowMS - idMS; age > 0 {
		oldestAge = time.Duration(age) * time.Millisecond
	}
	return count, oldestAge, nil
}

// wrap adds the operation and stream to err and maps NOGROUP to stream.ErrNoGroup.
func (s *Source) wrap(op string, err error) error {
	if isNoGroup(err) {
		return fmt.Errorf("stream: %s %s: group %s: %w", op, s.stream, s.group, stream.ErrNoGroup)
	}
	return fmt.Errorf("stream: %s %s: %w", op, s.stream, err)
}

// errUnblocked marks a blocked read that Redis ended early.
var errUnblocked = errors.New("blocked read ended by the server")

// isNoGroup reports a Redis NOGROUP error reply: the key or the group does
// not exist, or the group was destroyed while a read was blocked on it.
func isNoGroup(err error) bool { return hasErrorCode(err, "NOGROUP") }

// isUnblocked reports a Redis UNBLOCKED error reply: the key of a blocked
// read was deleted (or CLIENT UNBLOCK ... ERROR was used).
func isUnblocked(err error) bool { return hasErrorCode(err, "UNBLOCKED") }

// hasErrorCode reports whether err is a Redis error reply with code, its
// first word. rueidis has helpers only for some codes (BUSYGROUP, NOSCRIPT)
// and matches them the same way.
func hasErrorCode(err error, code string) bool {
	ret, ok := rueidis.IsRedisErr(err)
	return ok && strings.HasPrefix(ret.Error(), code+" ")
}

// serverMillis converts a TIME reply (seconds, microseconds) to Unix ms.
func serverMillis(t []string) (int64, error) {
	if len(t) != 2 {
		return 0, fmt.Errorf("reply has %d elements, want 2", len(t))
	}
	sec, err := strconv.ParseInt(t[0], 10, 64)
	if err != nil {
		return 0, err
	}
	usec, err := strconv.ParseInt(t[1], 10, 64)
	if err != nil {
		return 0, err
	}
	return sec*1000 + usec/1000, nil
}

// idMillis returns the millisecond part of a stream id "<ms>-<seq>".
func idMillis(id string) (int64, error) {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("bad stream id %q", id)
	}
	return v, nil
}
