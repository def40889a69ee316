package relay

import (
	"context"

	"github.com/relaydev/relay/internal/combine"
	"github.com/relaydev/relay/invocation"
)

// The one batching layer (docs/delivery.md#batched-transitions): the
// claims of concurrent deliveries go to the StateStore together, in one
// Claim call, and so do their settlements, in one Settle call. A call that
// finds none in flight goes at once, after letting the deliveries made
// ready with it (the messages of one read) join; calls that arrive while
// one is in flight go together in the next, up to maxBatch. So a lone
// event never waits for company, and a busy worker pays one round trip
// for many messages. The stores do not batch again: they cut a long batch
// into script calls of their size, sent together.

// maxBatch bounds the claims, or settlements, of one call.
const maxBatch = 64

// newClaims batches the claims of state.
func newClaims(state StateStore) *combine.Combiner[struct{}, invocation.ClaimRequest, invocation.Claim] {
	return combine.New(maxBatch, func(ctx context.Context, _ struct{}, reqs []invocation.ClaimRequest) []combine.Result[invocation.Claim] {
		res := state.Claim(ctx, reqs)
		out := make([]combine.Result[invocation.Claim], len(reqs))
		for i := range out {
			if i < len(res) {
				out[i] = combine.Result[invocation.Claim]{Value: res[i].Claim, Err: res[i].Err}
			} else {
				out[i].Err = errShortReply
			}
		}
		return out
	})
}

// newSettles batches the settlements of state.
func newSettles(state StateStore) *combine.Combiner[struct{}, invocation.Settlement, []invocation.TransitionResult] {
	return combine.New(maxBatch, func(ctx context.Context, _ struct{}, ss []invocation.Settlement) []combine.Result[[]invocation.TransitionResult] {
		res := state.Settle(ctx, ss)
		out := make([]combine.Result[[]invocation.TransitionResult], len(ss))
		for i := range out {
			switch {
			case i >= len(res):
				out[i].Err = errShortReply
			case res[i].Err == nil && len(res[i].Transitions) != len(ss[i].Transitions):
				out[i].Err = errShortReply
			default:
				out[i] = combine.Result[[]invocation.TransitionResult]{Value: res[i].Transitions, Err: res[i].Err}
			}
		}
		return out
	})
}

// errShortReply is the error of a claim or settlement the StateStore
// returned no result for: a broken implementation.
var errShortReply = shortReplyError{}

type shortReplyError struct{}

func (shortReplyError) Error() string {
	return "relay: the StateStore returned fewer results than it was given claims or settlements, or fewer than a settlement's transitions"
}
