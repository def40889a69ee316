package redisstream

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stream"
)

// Reclaim takes over at most max (> 0) of the group's entries that have been
// pending for at least minIdle, whichever consumer held them (XAUTOCLAIM: the
// message-level recovery backstop of docs/delivery.md). relay.Engine asks
// for as many entries as it has free message slots, so that idle entries it
// could not start stay in the PEL for any consumer to reclaim instead of
// waiting in its memory.
//
// Successive calls walk the XAUTOCLAIM cursor around the PEL, each
// XAUTOCLAIM with COUNT min(WithReclaimCount, entries still wanted); done
// reports that this call finished going around, so the next starts a new
// pass from "0-0". A call makes at most an internal bound of XAUTOCLAIM
// calls: one that returns fewer than max entries without done has reached
// that bound, and the next call goes on.
//
// msgs are the claimed entries, now owned by this consumer with their idle
// time reset, in PEL order. Deliveries is the delivery count after this claim
// as XPENDING reports it (diagnostic only; 0 if XPENDING did not list the
// entry). deleted lists the PEL ids whose stream entry no longer exists
// (deleted or trimmed while pending, docs/delivery.md#missing-payloads).
// Redis 7 drops those from the PEL itself; Reclaim also acknowledges them, so
// no dangling reference remains on any Redis version.
//
// When an error ends the call, msgs and deleted hold what was claimed before
// it: those entries now belong to this consumer. The error wraps stream.ErrNoGroup
// when the group is missing.
func (s *Source) Reclaim(ctx context.Context, minIdle time.Duration, max int) (msgs []stream.Message, deleted []string, done bool, err error) {
	if minIdle < 0 {
		return nil, nil, false, fmt.Errorf("stream: reclaim %s: minIdle must be >= 0, got %s", s.stream, minIdle)
	}
	if max <= 0 {
		return nil, nil, false, fmt.Errorf("stream: reclaim %s: max must be > 0, got %d", s.stream, max)
	}
	s.mu.Lock()
	cursor := s.cursor
	s.mu.Unlock()
	// Keep the cursor reached even when an error ends the call: what was
	// claimed before it belongs to this consumer and must not be skipped.
	defer func() {
		s.mu.Lock()
		s.cursor = cursor
		s.mu.Unlock()
	}()

	minIdleMS := strconv.FormatInt(minIdle.Milliseconds(), 10)
	for range maxReclaimCalls {
		// A Source whose COUNT is what is still wanted: autoclaim and
		// fillDeliveries size XAUTOCLAIM and the XPENDING range from it.
		want := min(s.opts.reclaimCount, int64(max-len(msgs)))
		call := &Source{client: s.client, stream: s.stream, group: s.group, consumer: s.consumer, opts: s.opts}
		call.opts.reclaimCount = want
		next, claimed, gone, err := call.autoclaim(ctx, minIdleMS, cursor)
		if err != nil {
			return msgs, deleted, false, err
		}
		s.seen.Store(true)
		if len(gone) > 0 {
			// Redis 7 already removed these from the PEL; Redis 6.2 reports
			// them as entries without fields and keeps them. XACK clears
			// both and is a no-op for ids that are not pending.
			if err := s.Ack(ctx, gone...); err != nil {
				return msgs, deleted, false, fmt.Errorf("stream: reclaim %s: clear deleted ids: %w", s.stream, err)
			}
			deleted = append(deleted, gone...)
		}
		cursor = next
		if len(claimed) > 0 {
			if err := call.fillDeliveries(ctx, claimed); err != nil {
				return append(msgs, claimed...), deleted, false, err
			}
			msgs = append(msgs, claimed...)
		}
		if cursor == "0-0" {
			return msgs, deleted, true, nil
		}
		if len(msgs) >= max {
			return msgs, deleted, false, nil
		}
	}
	return msgs, deleted, false, nil
}

// autoclaim runs one XAUTOCLAIM and splits its reply. The reply is
// [next-cursor, [[id, [field, value, ...]] ...], [deleted-id ...]]; the third
// element exists since Redis 7.0, and Redis 6.2 instead lists a deleted entry
// among the claimed ones with nil fields, which autoclaim also counts as
// deleted.
func (s *Source) autoclaim(ctx context.Context, minIdleMS, start string) (next string, claimed []stream.Message, deleted []string, err error) {
	cmd := s.client.B().Xautoclaim().Key(s.stream).Group(s.group).Consumer(s.consumer).
		MinIdleTime(minIdleMS).Start(start).Count(s.opts.reclaimCount).Build()
	reply, err := s.client.Do(ctx, cmd).ToArray()
	if err != nil {
		return "", nil, nil, s.wrap("reclaim", err)
	}
	if len(reply) < 2 {
		return "", nil, nil, fmt.Errorf("stream: reclaim %s: XAUTOCLAIM reply has %d elements, want 2 or 3", s.stream, len(reply))
	}
	if next, err = reply[0].ToString(); err != nil {
		return "", nil, nil, fmt.Errorf("stream: reclaim %s: cursor: %w", s.stream, err)
	}
	entries, err := reply[1].ToArray()
	if err != nil {
		return "", nil, nil, fmt.Errorf("stream: reclaim %s: entries: %w", s.stream, err)
	}
	for _, raw := range entries {
		e, err := raw.AsXRangeEntry()
		if err != nil {
			return "", nil, nil, fmt.Errorf("stream: reclaim %s: entry: %w", s.stream, err)
		}
		if e.FieldValues == nil {
			deleted = append(deleted, e.ID)
			continue
		}
		claimed = append(claimed, stream.Message{ID: e.ID, Fields: e.FieldValues})
	}
	if len(reply) > 2 {
		ids, err := reply[2].AsStrSlice()
		if err != nil && !rueidis.IsRedisNil(err) {
			return "", nil, nil, fmt.Errorf("stream: reclaim %s: deleted ids: %w", s.stream, err)
		}
		deleted = append(deleted, ids...)
	}
	return next, claimed, deleted, nil
}

// fillDeliveries sets Deliveries on msgs, in PEL (id) order, from one
// extended XPENDING over their id range, restricted to this consumer. One
// XAUTOCLAIM call examines at most ten times its COUNT PEL entries, so that
// many bounds what the range can hold.
func (s *Source) fillDeliveries(ctx context.Context, msgs []stream.Message) error {
	first, last := msgs[0].ID, msgs[len(msgs)-1].ID
	cmd := s.client.B().Xpending().Key(s.stream).Group(s.group).Start(first).End(last).
		Count(10 * s.opts.reclaimCount).Consumer(s.consumer).Build()
	rows, err := s.client.Do(ctx, cmd).ToArray()
	if err != nil {
		return s.wrap("reclaim: delivery counts", err)
	}
	counts := make(map[string]int64, len(rows))
	for _, row := range rows {
		// [id, consumer, idle-ms, delivery-count]
		f, err := row.ToArray()
		if err != nil || len(f) != 4 {
			return fmt.Errorf("stream: reclaim %s: delivery counts: malformed XPENDING row", s.stream)
		}
		id, err := f[0].ToString()
		if err != nil {
			return fmt.Errorf("stream: reclaim %s: delivery counts: %w", s.stream, err)
		}
		n, err := f[3].AsInt64()
		if err != nil {
			return fmt.Errorf("stream: reclaim %s: delivery counts: %w", s.stream, err)
		}
		counts[id] = n
	}
	for i := range msgs {
		msgs[i].Deliveries = counts[msgs[i].ID]
	}
	return nil
}
