package invocation

import (
	"context"
	"fmt"
	"strconv"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/combine"
	"github.com/relaydev/relay/internal/keys"
)

// DefaultMaxBatch is how many claims, or settlements, of concurrent
// deliveries one script call takes at most (WithMaxBatch).
const DefaultMaxBatch = 32

// WithMaxBatch sets how many concurrent Claim calls, and how many
// concurrent FinishSettle calls, one script call may serve
// (docs/delivery.md#batched-transitions). A call that finds no other in
// flight runs at once; calls that arrive while one runs wait for it and go
// together in the next. n <= 1 runs every call alone. Default
// DefaultMaxBatch.
func WithMaxBatch(n int) Option {
	return func(s *Store) { s.maxBatch = max(n, 1) }
}

// claimItem is one Claim in a batch: its hash and stream, and its segment
// of claim.lua's ARGV.
type claimItem struct {
	hash, stream string
	args         []string
}

// settleItem is one FinishSettle in a batch: its hash and its segment of
// finish_settle.lua's ARGV.
type settleItem struct {
	hash string
	args [4]string // field, attempt, token, message id
}

// settleGroup is what every FinishSettle of one batch shares: the script's
// KEYS[1], ARGV[1] and ARGV[2].
type settleGroup struct {
	stream, group, ttl string
}

func (s *Store) initBatches() {
	s.claims = combine.New(s.maxBatch, s.runClaims)
	s.settles = combine.New(s.maxBatch, s.runSettles)
	s.cluster = s.client.Mode() == rueidis.ClientModeCluster
}

// claimGroup is the batch a claim of hash in stream may join. Keys of one
// script must share a hash slot under Redis Cluster; a stream with a hash
// tag puts all of its hashes in its slot, and without Cluster any keys go
// together.
func (s *Store) claimGroup(stream, hash string) string {
	if s.cluster {
		return strconv.Itoa(int(keys.Slot(hash)))
	}
	return stream
}

func (s *Store) runClaims(ctx context.Context, _ string, items []claimItem) []combine.Result[reply] {
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
	return splitClaimReplies(claimScript.Exec(ctx, s.client, ks, args), len(items))
}

// splitClaimReplies cuts claim.lua's flat reply into the replies of its n
// claims: each starts with its code, and claimReplyLen of the code says how
// many elements it takes. A reply that does not split into exactly n
// replies, or an error of the call, fails every claim.
func splitClaimReplies(res rueidis.RedisResult, n int) []combine.Result[reply] {
	out := make([]combine.Result[reply], n)
	arr, err := res.ToArray()
	pos := 0
	for i := 0; err == nil && i < n; i++ {
		if pos >= len(arr) {
			err = fmt.Errorf("claim script reply: %d elements hold fewer than %d claims", len(arr), n)
			break
		}
		code, cerr := arr[pos].AsInt64()
		size := claimReplyLen(code)
		switch {
		case cerr != nil:
			err = fmt.Errorf("claim script reply: element %d, the code of claim %d: %w", pos, i, cerr)
		case size == 0:
			err = fmt.Errorf("claim script reply: element %d, the code of claim %d: unknown code %d", pos, i, code)
		case pos+size > len(arr):
			err = fmt.Errorf("claim script reply: claim %d (code %d) wants %d elements, %d left", i, code, size, len(arr)-pos)
		default:
			out[i].Value = reply{code: code, arr: arr[pos : pos+size]}
			pos += size
		}
	}
	if err == nil && pos != len(arr) {
		err = fmt.Errorf("claim script reply: %d elements left after %d claims", len(arr)-pos, n)
	}
	if err != nil {
		for i := range out {
			out[i] = combine.Result[reply]{Err: err}
		}
	}
	return out
}

func (s *Store) runSettles(ctx context.Context, g settleGroup, items []settleItem) []combine.Result[int64] {
	ks := make([]string, 1, len(items)+1)
	ks[0] = g.stream
	args := make([]string, 2, 2+4*len(items))
	args[0], args[1] = g.group, g.ttl
	for _, it := range items {
		ks = append(ks, it.hash)
		args = append(args, it.args[:]...)
	}
	return batchReplies(finishSettleScript.Exec(ctx, s.client, ks, args), len(items), func(m rueidis.RedisMessage) (int64, error) {
		return m.AsInt64()
	})
}

// batchReplies splits a batch script's reply, an array of one element per
// item, into per-item results; an error of the call fails every item.
func batchReplies[R any](res rueidis.RedisResult, n int, decode func(rueidis.RedisMessage) (R, error)) []combine.Result[R] {
	out := make([]combine.Result[R], n)
	arr, err := res.ToArray()
	if err == nil && len(arr) != n {
		err = fmt.Errorf("batch script reply: %d elements for %d items", len(arr), n)
	}
	if err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	for i, m := range arr {
		out[i].Value, out[i].Err = decode(m)
	}
	return out
}
