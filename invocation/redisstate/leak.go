package redisstate

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
	relaystream "github.com/relaydev/relay/stream"
)

// DefaultLeakScanCount is the SCAN COUNT of one RetainLeaked call: about
// how many keys of the scanned node it examines.
const DefaultLeakScanCount = 1000

// LeakStatus is what RetainAcked found, and did, for one hash.
type LeakStatus int

const (
	// LeakRetained: the hash had no TTL and its message is not pending;
	// it is now deleted (retention 0) or has __terminal and the retention
	// TTL, as a Cleared settlement leaves it.
	LeakRetained LeakStatus = iota + 1
	// LeakHasTTL: the hash has a TTL already (retained, or expiring
	// anyway); nothing changed.
	LeakHasTTL
	// LeakPending: the message is still in the group's PEL, so the hash is
	// live state; nothing changed.
	LeakPending
	// LeakMissing: there is no hash; nothing changed.
	LeakMissing
	// LeakNoGroup: the stream or the consumer group does not exist;
	// nothing changed (a group recreated from id 0 delivers the message
	// again, and its markers then still count).
	LeakNoGroup
)

func (s LeakStatus) String() string {
	switch s {
	case LeakRetained:
		return "retained"
	case LeakHasTTL:
		return "has TTL"
	case LeakPending:
		return "pending"
	case LeakMissing:
		return "missing"
	case LeakNoGroup:
		return "no group"
	}
	return "LeakStatus(" + strconv.Itoa(int(s)) + ")"
}

// RetainAcked applies the retention to the hash of message key, as a Cleared
// settlement does (deleted with retention 0, else __terminal and a TTL of
// retention), if it has no TTL and the message is no longer in the PEL of
// key.Group (retain_acked.lua): the repair of a hash leaked by a crash
// between an XAUTOCLAIM that cleared the reference and its Cleared
// settlement, or by an XACK from outside Settle
// (docs/delivery.md#invocation-state). The PEL check (XPENDING <stream>
// <group> <id> <id> 1) and the write are one script, so a hash whose message
// is pending is never touched. retention is invocation.CheckRetention's.
// Under Redis Cluster the stream and the hash must share a slot (a stream
// name with a hash tag, docs/deployment.md). Idempotent.
func (s *Store) RetainAcked(ctx context.Context, key invocation.Key, retention time.Duration) (LeakStatus, error) {
	hash := hashOf(key)
	if err := invocation.CheckRetention(retention); err != nil {
		return 0, fmt.Errorf("retain acked %s: %w", hash, err)
	}
	e := retainAckedExec(key, retention)
	st, err := leakStatus(retainAckedScript.Exec(ctx, s.client, e.Keys, e.Args))
	if err != nil {
		return 0, fmt.Errorf("retain acked %s: %w", hash, err)
	}
	return st, nil
}

func retainAckedExec(key invocation.Key, retention time.Duration) rueidis.LuaExec {
	return rueidis.LuaExec{
		Keys: []string{hashOf(key), key.Stream},
		Args: []string{key.Group, key.MessageID, retentionArg(retention)},
	}
}

func leakStatus(res rueidis.RedisResult) (LeakStatus, error) {
	r, err := decode(res)
	if err != nil {
		return 0, err
	}
	switch r.code {
	case codeApplied:
		return LeakRetained, nil
	case codeAlready:
		return LeakHasTTL, nil
	case codePending:
		return LeakPending, nil
	case codeMissing:
		return LeakMissing, nil
	case codeNoGroup:
		return LeakNoGroup, nil
	}
	return 0, r.unknown()
}

// LeakScan is what one RetainLeaked call did.
type LeakScan struct {
	// Cursor is the SCAN cursor to pass to the next call; 0 when Done.
	Cursor uint64
	// Done reports that this call finished a pass over the node's keys.
	Done bool
	// Seen is how many invocation hashes of the stream and group the
	// call's SCAN returned.
	Seen int
	// Retained is how many leaked hashes were deleted (retention 0) or
	// got __terminal and the TTL (for a counter).
	Retained int
	// Pending is how many hashes without a TTL belong to messages still
	// pending: live state, left alone.
	Pending int
	// NoGroup is how many hashes without a TTL were left alone because
	// the stream or the group does not exist.
	NoGroup int
	// Keys is the number of keys on the scanned node (DBSIZE), which a
	// pass examines once: see RetainLeaked for pacing.
	Keys int64
}

// RetainLeaked is one step of the janitor that applies the retention to
// leaked invocation hashes of stream and group
// (docs/delivery.md#invocation-state): hashes left without a TTL after their
// message left the PEL, by a crash between an XAUTOCLAIM that cleared the
// reference and its Cleared settlement, or by an XACK from outside Settle.
// With retention 0 it deletes them, else it gives them __terminal and a TTL
// of retention. It runs SCAN cursor MATCH <the stream and group's invocation
// hashes> COUNT count on the node that owns the stream (under Redis Cluster
// the stream's keys share its hash tag, docs/deployment.md), reads the PTTL
// of what it found and runs RetainAcked's script on each hash without a TTL:
// a hash whose message is still pending is never retained. Pass the returned
// Cursor to the next call; start a pass with cursor 0.
//
// One call examines about count keys of the node (count > 0), whatever
// they are. A pass over a node with LeakScan.Keys keys takes about
// Keys/count calls, so a caller that must repair a leak within a time
// window w, calling every interval i, needs count >= Keys*i/w. SCAN holds
// Redis 7.0 about 1ms per 1,000 keys examined, so prefer short intervals:
// with Keys=10M and w=1h, i=1s needs count >= 2,778 (about 3ms per call).
// Every worker sharing the stream may run it; each call is safe
// alongside any other and alongside Settle. retention is
// invocation.CheckRetention's.
//
// On an error the caller retries with the same cursor: nothing is lost
// by repeating a step.
func (s *Store) RetainLeaked(ctx context.Context, stream, group string, cursor uint64, count int, retention time.Duration) (LeakScan, error) {
	fail := func(err error) (LeakScan, error) {
		return LeakScan{}, fmt.Errorf("retain leaked in %s group %s: %w", stream, group, err)
	}
	switch {
	case stream == "" || group == "":
		return fail(errors.New("empty stream or group name"))
	case count <= 0:
		return fail(fmt.Errorf("count %d: must be > 0", count))
	}
	if err := invocation.CheckRetention(retention); err != nil {
		return fail(err)
	}
	b := s.client.B()
	if s.client.Mode() == rueidis.ClientModeCluster && !sameSlot(b, stream, keys.Invocation(stream, group, "0-0")) {
		return fail(fmt.Errorf("stream %q has no hash tag, so under Redis Cluster its invocation hashes are in other hash slots (docs/deployment.md); name it with a tag such as {%s}", stream, stream))
	}

	scan, err := s.scanNode(ctx, stream, group, cursor, count)
	if err != nil {
		return fail(err)
	}
	out := LeakScan{Cursor: scan.Cursor, Done: scan.Cursor == 0, Keys: scan.keys}
	var found []invocation.Key
	for _, k := range scan.Elements {
		id, ok := keys.InvocationMessageID(stream, group, k)
		if !ok || !relaystream.IsID(id) {
			continue // not a hash Relay wrote for this stream and group
		}
		found = append(found, invocation.Key{Stream: stream, Group: group, MessageID: id})
	}
	out.Seen = len(found)
	if len(found) == 0 {
		return out, nil
	}

	// Most hashes are retained already: read the TTLs first and run the
	// script only on hashes without one.
	cmds := make(rueidis.Commands, len(found))
	for i, k := range found {
		cmds[i] = b.Pttl().Key(hashOf(k)).Build()
	}
	var execs []rueidis.LuaExec
	for i, r := range s.client.DoMulti(ctx, cmds...) {
		pttl, err := r.AsInt64()
		if err != nil {
			return fail(fmt.Errorf("pttl %s: %w", hashOf(found[i]), err))
		}
		if pttl == -1 {
			execs = append(execs, retainAckedExec(found[i], retention))
		}
	}
	if len(execs) == 0 {
		return out, nil
	}
	var errs []error
	for i, r := range retainAckedScript.ExecMulti(ctx, s.client, execs...) {
		st, err := leakStatus(r)
		if err != nil {
			errs = append(errs, fmt.Errorf("retain acked %s: %w", execs[i].Keys[0], err))
			continue
		}
		switch st {
		case LeakRetained:
			out.Retained++
		case LeakPending:
			out.Pending++
		case LeakNoGroup:
			out.NoGroup++
		}
	}
	if len(errs) > 0 {
		// What was retained stays retained; the caller repeats the step.
		out.Cursor, out.Done = cursor, false
		return out, fmt.Errorf("retain leaked in %s group %s: %w", stream, group, errors.Join(errs...))
	}
	return out, nil
}

// scanPage is one SCAN reply and the node's DBSIZE.
type scanPage struct {
	rueidis.ScanEntry
	keys int64
}

// scanNode runs SCAN and DBSIZE on the node that owns stream's slot.
// Under Redis Cluster SCAN has no key, so a cluster client would send it
// to any node: a dedicated connection is pinned to the slot of its first
// keyed command (EXISTS stream), and the keyless commands after it in
// the same pipeline go to that node.
func (s *Store) scanNode(ctx context.Context, stream, group string, cursor uint64, count int) (scanPage, error) {
	build := func(b rueidis.Builder) rueidis.Commands {
		return rueidis.Commands{
			b.Scan().Cursor(cursor).Match(keys.InvocationPattern(stream, group)).Count(int64(count)).Build(),
			b.Dbsize().Build(),
		}
	}
	var res []rueidis.RedisResult
	if s.client.Mode() == rueidis.ClientModeCluster {
		err := s.client.Dedicated(func(dc rueidis.DedicatedClient) error {
			res = dc.DoMulti(ctx, append(rueidis.Commands{dc.B().Exists().Key(stream).Build()}, build(dc.B())...)...)
			if err := res[0].Error(); err != nil {
				return fmt.Errorf("find the node of %s: %w", stream, err)
			}
			res = res[1:]
			return nil
		})
		if err != nil {
			return scanPage{}, err
		}
	} else {
		res = s.client.DoMulti(ctx, build(s.client.B())...)
	}
	entry, err := res[0].AsScanEntry()
	if err != nil {
		return scanPage{}, fmt.Errorf("scan: %w", err)
	}
	n, err := res[1].AsInt64()
	if err != nil {
		return scanPage{}, fmt.Errorf("dbsize: %w", err)
	}
	return scanPage{ScanEntry: entry, keys: n}, nil
}

// sameSlot reports whether keys a and b hash to the same cluster slot.
func sameSlot(b rueidis.Builder, a, c string) bool {
	x, y := b.Exists().Key(a).Build(), b.Exists().Key(c).Build()
	return x.Slot() == y.Slot()
}
