package redisstate

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"
)

// DefaultMaxBatch is how many claims, or settlements, one script call
// carries at most (WithMaxBatch).
const DefaultMaxBatch = 64

// WithMaxBatch sets how many claims, and how many settlements, one script
// call may carry: a longer batch is cut into calls of n, sent together.
// n <= 1 sends one call per item. Default DefaultMaxBatch.
func WithMaxBatch(n int) Option {
	return func(s *Store) { s.maxBatch = max(n, 1) }
}

// claimItem is one claim of a call: its hash and stream, and its segment
// of claim.lua's ARGV.
type claimItem struct {
	hash, stream string
	args         []string
}

// settleItem is one settlement of a call: its hash and its segment of
// settle.lua's ARGV.
type settleItem struct {
	hash string
	args []string
	n    int  // transitions
	ack  bool // the settlement acknowledges its message
}

// result is one item's reply in a call, or the call's error.
type result struct {
	reply reply
	err   error
}

func (s *Store) runClaims(ctx context.Context, items []claimItem) []result {
	ks := make([]string, 0, 2*len(items))
	n := 0
	for _, it := range items {
		ks = append(ks, it.hash, it.stream)
		n += len(it.args)
	}
	args := make([]string, 0, n)
	for _, it := range items {
		args = append(args, it.args...)
	}
	return splitReplies(claimScript.Exec(ctx, s.client, ks, args), len(items), claimReplyLen)
}

// runSettles runs items in one settle.lua call and returns their results,
// in the order of items. The call takes them in settleOrder.
func (s *Store) runSettles(ctx context.Context, stream, group string, items []settleItem) []result {
	order := settleOrder(items)
	call := make([]settleItem, len(items))
	ks := make([]string, 2, len(items)+2)
	ks[0], ks[1] = stream, dlqKey(stream)
	n := 1
	for k, i := range order {
		call[k] = items[i]
		ks = append(ks, items[i].hash)
		n += len(items[i].args)
	}
	args := make([]string, 1, n)
	args[0] = group
	for _, it := range call {
		args = append(args, it.args...)
	}
	res := splitReplies(settleScript.Exec(ctx, s.client, ks, args), len(call), settleReplyLen(call))
	out := make([]result, len(items))
	for k, i := range order {
		out[i] = res[k]
	}
	return out
}

// settleOrder returns the positions of items in the order settle.lua
// takes them: the settlements that acknowledge first, then the others,
// each in the order of items, except that those of one message keep
// their order (an acknowledgement that follows another settlement of its
// message stays behind it). On a Redis at maxmemory only a script's first
// write that needs memory is refused; the XACK needs none, so once a
// call's first settlement acknowledged its message the others may write.
// Taken first, the settlements that acknowledge drain a full Redis even in
// a call with others, which would otherwise fail the whole call with the
// first write of one that does not
// (docs/delivery.md#claim-errors-fail-closed).
func settleOrder(items []settleItem) []int {
	first := make([]int, 0, len(items))
	var rest []int
	held := map[string]bool{} // the hashes of the settlements in rest
	for i, it := range items {
		if it.ack && !held[it.hash] {
			first = append(first, i)
			continue
		}
		held[it.hash] = true
		rest = append(rest, i)
	}
	return append(first, rest...)
}

// settleReplyLen returns splitReplies' size function for a settle.lua
// call of items: called once per item, in order, it returns how many
// elements the item's reply of code takes, code included (applied: one
// more per transition), or 0 for an unknown code.
func settleReplyLen(items []settleItem) func(code int64) int {
	k := 0
	return func(code int64) int {
		n := items[k].n
		k++
		switch code {
		case settleApplied:
			return 1 + n
		case settleStale, settleTerminal, settlePending:
			return 1
		}
		return 0
	}
}

// splitReplies cuts a batch script's flat reply into the replies of its n
// items: each starts with its code, and size(code) says how many elements
// it takes (0: an unknown code). A reply that does not split into exactly
// n replies, or an error of the call, fails every item.
func splitReplies(res rueidis.RedisResult, n int, size func(code int64) int) []result {
	out := make([]result, n)
	arr, err := res.ToArray()
	pos := 0
	for i := 0; err == nil && i < n; i++ {
		if pos >= len(arr) {
			err = fmt.Errorf("batch script reply: %d elements hold fewer than %d items", len(arr), n)
			break
		}
		code, cerr := arr[pos].AsInt64()
		k := 0
		if cerr == nil {
			k = size(code)
		}
		switch {
		case cerr != nil:
			err = fmt.Errorf("batch script reply: element %d, the code of item %d: %w", pos, i, cerr)
		case k == 0:
			err = fmt.Errorf("batch script reply: element %d, the code of item %d: unknown code %d", pos, i, code)
		case pos+k > len(arr):
			err = fmt.Errorf("batch script reply: item %d (code %d) wants %d elements, %d left", i, code, k, len(arr)-pos)
		default:
			out[i].reply = reply{code: code, arr: arr[pos : pos+k]}
			pos += k
		}
	}
	if err == nil && pos != len(arr) {
		err = fmt.Errorf("batch script reply: %d elements left after %d items", len(arr)-pos, n)
	}
	if err != nil {
		for i := range out {
			out[i] = result{err: err}
		}
	}
	return out
}
