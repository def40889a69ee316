package relaytest

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/relaydev/relay/producer"
	"github.com/relaydev/relay/stream"
)

// Stream is an in-memory Redis Stream with one consumer group, created from
// id 0: the delivery semantics redisstream.Source gets from Redis
// (docs/delivery.md#from-entry-to-acknowledgement). Consumer returns the
// relay.StreamSource of one consumer; any number of consumers share the
// group's PEL.
//
//   - Publish appends an entry with id "<ms>-<seq>" from the clock, strictly
//     increasing even when the clock stands still or goes back (XADD *).
//   - Read delivers entries no consumer of the group was given yet, in id
//     order, and records them in the PEL with delivery count 1 (XREADGROUP >).
//   - Reclaim takes over at most max PEL entries idle for at least minIdle,
//     from any consumer, walking the PEL across calls, and raises their
//     delivery count; PEL entries whose stream entry was deleted are
//     reported as deleted and dropped (XAUTOCLAIM on Redis 7).
//   - Heartbeat resets idle times without raising delivery counts (XCLAIM
//     ... 0 JUSTID); Ack removes entries from the PEL (XACK), as does the
//     Settle of a StateStore given WithStream.
//   - SetID rewinds the group (XGROUP SETID), so that acknowledged entries
//     are delivered again.
//   - PublishOnce appends at most one entry per idempotency key and window,
//     as producer.RedisStream's does (producer.IdempotentStream).
//
// Idle time is measured on the Stream's clock with millisecond precision.
//
// Safe for concurrent use.
type Stream struct {
	clock Clock
	block time.Duration

	mu        sync.Mutex
	entries   []streamEntry // by id, ascending; deleted ones removed
	last      streamID      // the newest id ever generated
	delivered streamID      // the group's last-delivered-id
	pel       map[streamID]*pelEntry
	// wake is closed and replaced by every Publish, to end blocked Reads.
	wake chan struct{}
	// once maps PublishOnce's idempotency keys to what they record; made
	// by the first PublishOnce.
	once map[string]onceKey
}

// onceKey is what an idempotency key records: the entry its first
// PublishOnce added, and when, in Unix ms on the clock.
type onceKey struct {
	id      string
	addedMS int64
}

type streamID struct{ ms, seq uint64 }

func (id streamID) String() string { return fmt.Sprintf("%d-%d", id.ms, id.seq) }

func (id streamID) compare(o streamID) int {
	if c := cmp.Compare(id.ms, o.ms); c != 0 {
		return c
	}
	return cmp.Compare(id.seq, o.seq)
}

func parseID(s string) (streamID, error) {
	ms, seq, err := stream.ParseID(s)
	return streamID{ms, seq}, err
}

type streamEntry struct {
	id     streamID
	fields map[string]string
}

type pelEntry struct {
	consumer    string
	deliveries  int64
	deliveredMS int64 // last delivery or heartbeat, Unix ms on the clock
}

// NewStream returns an empty stream whose consumer group exists. Options:
// WithClock, WithBlock.
func NewStream(opts ...Option) *Stream {
	o := buildConfig("NewStream", opts, "WithClock", "WithBlock")
	return &Stream{clock: o.clock, block: o.block, pel: map[streamID]*pelEntry{}, wake: make(chan struct{})}
}

// Consumer returns the source of consumer name, reading through the
// Stream's group. Consumers are identified by name alone: two calls with one
// name return sources of the same consumer. It panics on an empty name.
func (s *Stream) Consumer(name string) *Consumer {
	if name == "" {
		panic("relaytest: Stream.Consumer: empty consumer name")
	}
	return &Consumer{s: s, name: name}
}

// Publish appends an entry with a copy of fields and returns its id, as
// Consumer.Publish does. fields must not be empty.
func (s *Stream) Publish(ctx context.Context, fields map[string]string) (string, error) {
	if len(fields) == 0 {
		return "", fmt.Errorf("relaytest: publish: no fields")
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("relaytest: publish: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.add(fields), nil
}

// PublishOnce appends an entry with a copy of fields, as Publish does,
// unless a PublishOnce of key added one less than window ago on the
// Stream's clock; it returns the id the key records and whether this call
// added it (producer.IdempotentStream, docs/producing.md#idempotent-publish).
// Deleting the entry does not free the key, as on Redis. key and window
// must pass producer.ValidateIdempotency, and fields must not be empty.
func (s *Stream) PublishOnce(ctx context.Context, key string, window time.Duration, fields map[string]string) (id string, first bool, err error) {
	if err := producer.ValidateIdempotency(key, window); err != nil {
		return "", false, fmt.Errorf("relaytest: publish once: %w", err)
	}
	if len(fields) == 0 {
		return "", false, fmt.Errorf("relaytest: publish once: no fields")
	}
	if err := ctx.Err(); err != nil {
		return "", false, fmt.Errorf("relaytest: publish once: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	if k, ok := s.once[key]; ok && now-k.addedMS < window.Milliseconds() {
		return k.id, false, nil
	}
	if s.once == nil {
		s.once = map[string]onceKey{}
	}
	id = s.add(fields)
	s.once[key] = onceKey{id: id, addedMS: now}
	return id, true, nil
}

// add appends an entry with a copy of fields, wakes blocked Reads and
// returns its id. s.mu must be held.
func (s *Stream) add(fields map[string]string) string {
	id := streamID{ms: uint64(max(nowMS(s.clock), 0))}
	if id.compare(s.last) <= 0 {
		id = streamID{ms: s.last.ms, seq: s.last.seq + 1}
	}
	s.last = id
	s.entries = append(s.entries, streamEntry{id: id, fields: maps.Clone(fields)})
	close(s.wake)
	s.wake = make(chan struct{})
	return id.String()
}

// Delete removes entries from the stream, pending or not, as XDEL does (an
// operator's delete or an unsafe trim): their PEL references stay until a
// Reclaim reports them as deleted. It returns how many existed; unknown and
// ill-formed ids are ignored.
func (s *Stream) Delete(ids ...string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, raw := range ids {
		id, err := parseID(raw)
		if err != nil {
			continue
		}
		if i, ok := s.find(id); ok {
			s.entries = slices.Delete(s.entries, i, i+1)
			n++
		}
	}
	return n
}

// SetID sets the group's last-delivered id, as XGROUP SETID does: Read
// then delivers the entries after id again, acknowledged ones included,
// as a rewound group does (docs/delivery.md#replaying-and-reused-message-ids);
// an entry still pending goes to the reading consumer with its delivery
// count back at 1, as XREADGROUP gives it. "0-0" rewinds to the start.
// An id that is not of the form "<ms>-<seq>" is an error.
func (s *Stream) SetID(id string) error {
	sid, err := parseID(id)
	if err != nil {
		return fmt.Errorf("relaytest: set id: %w", err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delivered = sid
	return nil
}

// Len returns the number of entries in the stream (XLEN).
func (s *Stream) Len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries)
}

// Lag returns how many entries of the stream the group has not delivered
// to any consumer yet (the lag of XINFO GROUPS). With Pending it tells when
// a consumer has nothing left to do: Lag() == 0 and no entry pending.
func (s *Stream) Lag() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.entries) - s.firstUndelivered()
}

// PendingEntry is one entry of the group's PEL.
type PendingEntry struct {
	ID         string
	Consumer   string
	Deliveries int64
	// Idle is the time since the entry was last delivered or heartbeated,
	// on the Stream's clock, in whole milliseconds.
	Idle time.Duration
}

// Pending returns the group's PEL in id order (extended XPENDING), for
// assertions: an id that is not in it was acknowledged, or never read.
func (s *Stream) Pending() []PendingEntry {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	out := make([]PendingEntry, 0, len(s.pel))
	for _, id := range s.pelIDs() {
		p := s.pel[id]
		out = append(out, PendingEntry{
			ID: id.String(), Consumer: p.consumer, Deliveries: p.deliveries,
			Idle: time.Duration(max(now-p.deliveredMS, 0)) * time.Millisecond,
		})
	}
	return out
}

// IsPending reports whether id is in the group's PEL.
func (s *Stream) IsPending(id string) bool {
	sid, err := parseID(id)
	if err != nil {
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.pel[sid]
	return ok
}

// find returns the index of id in s.entries. s.mu must be held.
func (s *Stream) find(id streamID) (int, bool) {
	return slices.BinarySearchFunc(s.entries, id, func(e streamEntry, id streamID) int { return e.id.compare(id) })
}

// firstUndelivered returns the index of the first entry after the group's
// last-delivered-id. s.mu must be held.
func (s *Stream) firstUndelivered() int {
	i, _ := slices.BinarySearchFunc(s.entries, s.delivered, func(e streamEntry, id streamID) int {
		if e.id.compare(id) <= 0 {
			return -1
		}
		return 1
	})
	return i
}

// pelIDs returns the PEL's ids in ascending order. s.mu must be held.
func (s *Stream) pelIDs() []streamID {
	ids := slices.Collect(maps.Keys(s.pel))
	slices.SortFunc(ids, streamID.compare)
	return ids
}

// Consumer is one consumer of a Stream's group. It implements
// relay.StreamSource, relay.GroupEnsurer, relay.PendingReporter,
// relay.OwnerChecker and relay.Pinger, with the semantics of the same
// methods of redisstream.Source.
// Safe for concurrent use.
type Consumer struct {
	s    *Stream
	name string
	// cursor is where the next Reclaim walks the PEL from; guarded by s.mu.
	cursor streamID
}

// Name returns the consumer's name.
func (c *Consumer) Name() string { return c.name }

// Read returns up to count entries that no consumer of the group was given
// yet, oldest first, each with Deliveries 1 and now pending for this
// consumer (XREADGROUP ... >). When there are none it waits for a Publish
// for up to the WithBlock duration and then returns (nil, nil); when ctx
// ends first it returns ctx's error. count must be > 0.
func (c *Consumer) Read(ctx context.Context, count int) ([]stream.Message, error) {
	if count <= 0 {
		return nil, fmt.Errorf("relaytest: read: count must be > 0, got %d", count)
	}
	s := c.s
	var timeout <-chan time.Time
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("relaytest: read: %w", err)
		}
		s.mu.Lock()
		if i := s.firstUndelivered(); i < len(s.entries) {
			now := nowMS(s.clock)
			batch := s.entries[i:min(i+count, len(s.entries))]
			msgs := make([]stream.Message, len(batch))
			for j, e := range batch {
				s.pel[e.id] = &pelEntry{consumer: c.name, deliveries: 1, deliveredMS: now}
				msgs[j] = stream.Message{ID: e.id.String(), Fields: maps.Clone(e.fields), Deliveries: 1}
			}
			s.delivered = batch[len(batch)-1].id
			s.mu.Unlock()
			return msgs, nil
		}
		wake := s.wake
		s.mu.Unlock()
		if timeout == nil {
			t := time.NewTimer(s.block)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-wake:
		case <-timeout:
			return nil, nil
		case <-ctx.Done():
			return nil, fmt.Errorf("relaytest: read: %w", ctx.Err())
		}
	}
}

// Reclaim takes over at most max PEL entries of the group idle for at
// least minIdle (on the Stream's clock, ms precision), whichever consumer
// held them, in id order, walking the PEL from where this Consumer's last
// Reclaim stopped: each becomes this consumer's with its idle time reset and
// its delivery count raised by one, which Deliveries reports. done reports
// that the walk reached the end of the PEL; the next call starts over.
// deleted lists the idle PEL ids passed whose stream entry no longer
// exists; they are dropped from the PEL. minIdle must be >= 0 and max > 0.
func (c *Consumer) Reclaim(ctx context.Context, minIdle time.Duration, max int) (msgs []stream.Message, deleted []string, done bool, err error) {
	if minIdle < 0 {
		return nil, nil, false, fmt.Errorf("relaytest: reclaim: minIdle must be >= 0, got %s", minIdle)
	}
	if max <= 0 {
		return nil, nil, false, fmt.Errorf("relaytest: reclaim: max must be > 0, got %d", max)
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, false, fmt.Errorf("relaytest: reclaim: %w", err)
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	for _, id := range s.pelIDs() {
		if id.compare(c.cursor) < 0 {
			continue
		}
		if len(msgs) == max {
			c.cursor = id // the next call goes on from here
			return msgs, deleted, false, nil
		}
		p := s.pel[id]
		if now-p.deliveredMS < minIdle.Milliseconds() {
			continue
		}
		i, ok := s.find(id)
		if !ok {
			delete(s.pel, id)
			deleted = append(deleted, id.String())
			continue
		}
		p.consumer, p.deliveries, p.deliveredMS = c.name, p.deliveries+1, now
		msgs = append(msgs, stream.Message{ID: id.String(), Fields: maps.Clone(s.entries[i].fields), Deliveries: p.deliveries})
	}
	c.cursor = streamID{}
	return msgs, deleted, true, nil
}

// Ack removes ids from the group's PEL (XACK). Ids that are not pending, and
// no ids at all, are not an error; an id that is not of the form
// "<ms>-<seq>" is, and then nothing is acknowledged. Idempotent.
func (c *Consumer) Ack(ctx context.Context, ids ...string) error {
	parsed, err := parseIDs("ack", ids)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("relaytest: ack: %w", err)
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, id := range parsed {
		delete(s.pel, id)
	}
	return nil
}

// ack removes id from the PEL, for a StateStore's Settle (WithStream).
func (s *Stream) ack(id string) {
	parsed, err := parseID(id)
	if err != nil {
		return
	}
	s.mu.Lock()
	delete(s.pel, parsed)
	s.mu.Unlock()
}

// Publish appends an entry to the Stream; see Stream.Publish.
func (c *Consumer) Publish(ctx context.Context, fields map[string]string) (string, error) {
	return c.s.Publish(ctx, fields)
}

// PublishOnce appends an entry to the Stream at most once per key and
// window; see Stream.PublishOnce.
func (c *Consumer) PublishOnce(ctx context.Context, key string, window time.Duration, fields map[string]string) (string, bool, error) {
	return c.s.PublishOnce(ctx, key, window, fields)
}

// Heartbeat resets the idle time of those ids that are pending and makes
// them this consumer's, without raising their delivery count (XCLAIM ... 0
// JUSTID), and returns the others: not pending. A pending id whose stream
// entry was deleted is dropped from the PEL, as Redis 7 does, and
// returned too.
func (c *Consumer) Heartbeat(ctx context.Context, ids ...string) (gone []string, err error) {
	parsed, err := parseIDs("heartbeat", ids)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("relaytest: heartbeat: %w", err)
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := nowMS(s.clock)
	for i, id := range parsed {
		p, ok := s.pel[id]
		if !ok {
			gone = append(gone, ids[i])
			continue
		}
		if _, exists := s.find(id); !exists {
			delete(s.pel, id)
			gone = append(gone, ids[i])
			continue
		}
		p.consumer, p.deliveredMS = c.name, now
	}
	return gone, nil
}

// Pending returns the size of the group's PEL and the age of its oldest
// entry: the clock's time minus the millisecond part of that entry's id, 0
// when nothing is pending (redisstream.Source.Pending).
func (c *Consumer) Pending(ctx context.Context) (count int64, oldestAge time.Duration, err error) {
	if err := ctx.Err(); err != nil {
		return 0, 0, fmt.Errorf("relaytest: pending: %w", err)
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.pel) == 0 {
		return 0, 0, nil
	}
	oldest := s.pelIDs()[0]
	if age := nowMS(s.clock) - int64(oldest.ms); age > 0 {
		oldestAge = time.Duration(age) * time.Millisecond
	}
	return int64(len(s.pel)), oldestAge, nil
}

// EnsureGroup returns nil, or ctx's error: the in-memory stream's group
// always exists, from its first entry (relay.GroupEnsurer).
func (c *Consumer) EnsureGroup(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("relaytest: ensure group: %w", err)
	}
	return nil
}

// Owned reports which of ids are in the group's PEL and delivered to this
// consumer, as redisstream.Source.Owned does (relay.OwnerChecker,
// docs/delivery.md#held-messages): an id missing from the map was
// acknowledged, never delivered, or taken over by another consumer (a
// Reclaim or Heartbeat of its). A pending id whose stream entry was deleted
// is owned until a Reclaim clears it. An id that is not of the form
// "<ms>-<seq>" is an error.
func (c *Consumer) Owned(ctx context.Context, ids []string) (map[string]bool, error) {
	parsed, err := parseIDs("owned", ids)
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("relaytest: owned: %w", err)
	}
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	owned := make(map[string]bool, len(ids))
	for i, id := range parsed {
		if p, ok := s.pel[id]; ok && p.consumer == c.name {
			owned[ids[i]] = true
		}
	}
	return owned, nil
}

// Ping returns nil, or ctx's error: an in-memory stream is always there.
func (c *Consumer) Ping(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("relaytest: ping: %w", err)
	}
	return nil
}

func parseIDs(op string, ids []string) ([]streamID, error) {
	out := make([]streamID, len(ids))
	for i, raw := range ids {
		id, err := parseID(raw)
		if err != nil {
			return nil, fmt.Errorf("relaytest: %s: %w", op, err)
		}
		out[i] = id
	}
	return out, nil
}
