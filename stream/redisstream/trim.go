package redisstream

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stream"
)

// DefaultTrimLimit is the most entries one Trim removes as whole stream
// nodes before it leaves the rest to the next call (WithTrimLimit). On
// Redis 7.0 XTRIM frees about a million entries in 12ms, so one call
// holds the server for about a millisecond at most.
const DefaultTrimLimit = 100_000

//go:embed scripts/trim.lua
var trimSource string

// trimScript is retryable: a repeated run trims what is due by then and
// never past the floor it reads itself.
var trimScript = rueidis.NewLuaScriptRetryable(trimSource)

// Reply codes of trim.lua.
const (
	trimDone     = 1
	trimNoStream = 2
	trimNoGroup  = 3
)

// Trim removes the entries of the stream that are older than retention
// (by the time in their ids, against the Redis server's TIME) and that no
// consumer group still needs (docs/operations.md#retention): it never
// removes an entry at or after the safe floor, the smallest, over every
// consumer group of the stream (Relay's or not), of the group's oldest
// pending id and its last-delivered-id. So nothing pending and nothing
// not yet delivered to some group is removed, and the newest delivered
// entry stays. Reading the floor and trimming are one Lua script, so a
// group that reads or claims meanwhile cannot slip under the trim, and
// any number of workers may call Trim at once: each call removes only
// what is due by then.
//
// The script reads XINFO GROUPS and, for each group with entries
// pending, the first one (XPENDING <stream> <group> - + 1), so its cost
// does not grow with the PEL. It removes whole stream nodes first (XTRIM
// MINID ~ ... LIMIT), at most WithTrimLimit entries, and then the due
// entries left in the boundary node exactly; when the node pass may have
// stopped at the limit it skips the exact step and reports More.
// XTRIM leaves the stream's entries-added counter and the groups'
// entries-read and lag as they are. Trim does not use XTRIM ACKED (Redis
// 8.2+): the script gives the same guarantee on Redis 7.0 and reports
// which group holds the floor.
//
// retention 0 disables trimming: Trim returns a zero stream.TrimResult without
// calling Redis; a negative retention is an error. When the stream or
// this Source's group does not exist, nothing is trimmed and the error
// wraps stream.ErrNoStream or stream.ErrNoGroup: Read recreates the group from id 0
// and would then want every entry still there.
func (s *Source) Trim(ctx context.Context, retention time.Duration) (stream.TrimResult, error) {
	switch {
	case retention == 0:
		return stream.TrimResult{}, nil
	case retention < time.Millisecond:
		return stream.TrimResult{}, fmt.Errorf("stream: trim %s: retention must be 0 (off) or >= 1ms, got %s", s.stream, retention)
	}
	args := []string{
		strconv.FormatInt(retention.Milliseconds(), 10),
		s.group,
		strconv.FormatInt(s.opts.trimLimit, 10),
	}
	arr, err := trimScript.Exec(ctx, s.client, []string{s.stream}, args).ToArray()
	if err != nil {
		return stream.TrimResult{}, s.wrap("trim", err)
	}
	fail := func(err error) (stream.TrimResult, error) {
		return stream.TrimResult{}, fmt.Errorf("stream: trim %s: script reply: %w", s.stream, err)
	}
	if len(arr) == 0 {
		return fail(fmt.Errorf("empty"))
	}
	code, err := arr[0].AsInt64()
	if err != nil {
		return fail(err)
	}
	switch code {
	case trimNoStream:
		return stream.TrimResult{}, fmt.Errorf("stream: trim %s: %w", s.stream, stream.ErrNoStream)
	case trimNoGroup:
		return stream.TrimResult{}, fmt.Errorf("stream: trim %s: group %s: %w", s.stream, s.group, stream.ErrNoGroup)
	case trimDone:
	default:
		return fail(fmt.Errorf("unknown code %d", code))
	}
	if len(arr) != 9 {
		return fail(fmt.Errorf("%d elements, want 9", len(arr)))
	}
	var r stream.TrimResult
	var nowMS, pending, more int64
	for i, p := range []*int64{&r.Trimmed, &nowMS} {
		if *p, err = arr[1+i].AsInt64(); err != nil {
			return fail(err)
		}
	}
	for i, p := range []*string{&r.MinID, &r.Floor, &r.FloorGroup} {
		if *p, err = arr[3+i].ToString(); err != nil {
			return fail(err)
		}
	}
	for i, p := range []*int64{&pending, &more} {
		if *p, err = arr[6+i].AsInt64(); err != nil {
			return fail(err)
		}
	}
	floorMS, _, err := stream.ParseID(r.Floor)
	if err != nil {
		return fail(err)
	}
	r.Cutoff = time.UnixMilli(nowMS - retention.Milliseconds())
	r.FloorTime = time.UnixMilli(int64(floorMS))
	r.FloorPending, r.More = pending == 1, more == 1
	next, err := arr[8].ToString()
	if err != nil {
		return fail(err)
	}
	due := func(ms uint64) bool { return ms < uint64(max(r.Cutoff.UnixMilli(), 0)) }
	if r.FloorPending {
		r.HeldBack = due(floorMS)
	} else if next != "" {
		nextMS, _, err := stream.ParseID(next)
		if err != nil {
			return fail(err)
		}
		r.HeldBack = due(nextMS)
	}
	return r, nil
}
