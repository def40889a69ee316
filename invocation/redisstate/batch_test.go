package redisstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/topology"
	"github.com/relaydev/relay/invocation"
)

// deliver adds entries with ids to stream (none: the caller did), creates
// group from 0 unless it exists and reads every new entry as consumer "c",
// so that they are pending as a delivery finds them.
func deliver(t *testing.T, c rueidis.Client, stream, group string, ids ...string) {
	t.Helper()
	ctx := t.Context()
	for _, id := range ids {
		if err := c.Do(ctx, c.B().Xadd().Key(stream).Id(id).FieldValue().FieldValue("event", "{}").Build()).Error(); err != nil {
			t.Fatalf("XADD %s: %v", id, err)
		}
	}
	err := c.Do(ctx, c.B().XgroupCreate().Key(stream).Group(group).Id("0").Mkstream().Build()).Error()
	if err != nil && !strings.HasPrefix(err.Error(), "BUSYGROUP") {
		t.Fatalf("XGROUP CREATE: %v", err)
	}
	if err := c.Do(ctx, c.B().Xreadgroup().Group(group, "c").Streams().Key(stream).Id(">").Build()).Error(); err != nil && !rueidis.IsRedisNil(err) {
		t.Fatalf("XREADGROUP: %v", err)
	}
}

// countedStore is a Store on a private redis-server, whose script runs
// the test can count.
type countedStore struct {
	s     *Store
	c     rueidis.Client // the Store's client
	admin rueidis.Client // reads INFO
}

func newCountedStore(t *testing.T, opts ...Option) *countedStore {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	return &countedStore{s: New(c, opts...), c: c, admin: redistest.Connect(t, srv.Addr)}
}

// scriptRuns is how many EVALSHA and EVAL commands the server has run,
// not counting failed ones (the NOSCRIPT of a script's first EVALSHA).
func (p *countedStore) scriptRuns(t *testing.T) int {
	t.Helper()
	n, _ := scriptStats(t, p.admin)
	return n
}

// scriptStats returns how many EVALSHA and EVAL commands the server of c
// has run, not counting failed ones (the NOSCRIPT of a script's first
// EVALSHA), and the server time they took in µs (INFO commandstats).
func scriptStats(t testing.TB, c rueidis.Client) (runs int, usec int64) {
	t.Helper()
	info, err := c.Do(context.Background(), c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		t.Fatalf("INFO commandstats: %v", err)
	}
	for _, line := range strings.Split(info, "\n") {
		name, stats, _ := strings.Cut(strings.TrimSpace(line), ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			continue
		}
		for _, kv := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "calls" && k != "failed_calls" && k != "usec" {
				continue
			}
			c, err := strconv.ParseInt(v, 10, 64)
			switch {
			case err != nil:
				t.Fatalf("INFO line %q: %v", line, err)
			case k == "calls":
				runs += int(c)
			case k == "failed_calls":
				runs -= int(c)
			default:
				usec += c
			}
		}
	}
	return runs, usec
}

// TestClaimBatch: one Claim call of several messages' claims runs in
// one script call per WithMaxBatch claims, and each claim gets the answer
// a claim of its own would have got: a live lease, a retained hash, a
// malformed value and an acknowledged message among fresh ones.
func TestClaimBatch(t *testing.T) {
	const limit, n = 4, 10
	p := newCountedStore(t, WithMaxBatch(limit))
	stream := "orders"
	key := func(i int) invocation.Key {
		return invocation.Key{Stream: stream, Group: "g", MessageID: fmt.Sprintf("1-%d", i)}
	}
	// Message 1 has a live lease, message 2 is retained, message 3 is
	// malformed: their claims share batches with fresh ones.
	seed := map[int][]string{
		1: {testField, "running:99999999999999:1:other"},
		2: {testField, "ok", "__terminal", "1"},
		3: {testField, "garbage"},
	}
	for i, kv := range seed {
		if err := p.c.Do(t.Context(), p.c.B().Hset().Key(hashOf(key(i))).FieldValue().FieldValue(kv[0], kv[1]).Build()).Error(); err != nil {
			t.Fatal(err)
		}
		if len(kv) > 2 {
			if err := p.c.Do(t.Context(), p.c.B().Hset().Key(hashOf(key(i))).FieldValue().FieldValue(kv[2], kv[3]).Build()).Error(); err != nil {
				t.Fatal(err)
			}
		}
	}
	ids := make([]string, n)
	for i := range n {
		ids[i] = key(i).MessageID
	}
	deliver(t, p.c, stream, "g", ids...)
	// Message 4 was acknowledged by another worker: its claim is inert.
	if err := p.c.Do(t.Context(), p.c.B().Xack().Key(stream).Group("g").Id(key(4).MessageID).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	reqs := make([]invocation.ClaimRequest, n)
	for i := range n {
		reqs[i] = invocation.ClaimRequest{Key: key(i), Field: testField, Lease: time.Minute, MaxAttempts: 3,
			Record: invocation.Record{Fields: []string{"app/other"}, Complete: true}}
	}
	reqs[7].Lease = 0 // invalid: refused alone, before any call

	before := p.scriptRuns(t)
	results := p.s.Claim(t.Context(), reqs)
	// 9 valid claims in batches of 4, 4, 1.
	if got, want := p.scriptRuns(t)-before, 3; got != want {
		t.Errorf("%d script runs for %d valid claims, want %d (batches of at most %d)", got, n-1, want, limit)
	}
	if len(results) != n {
		t.Fatalf("%d results for %d claims", len(results), n)
	}
	for i, r := range results {
		switch i {
		case 1:
			if r.Err != nil || r.Status != invocation.Running {
				t.Errorf("claim %d (live lease) = %+v; want Running", i, r)
			}
		case 2, 4:
			if r.Err != nil || r.Status != invocation.Terminal {
				t.Errorf("claim %d (retained, or acknowledged) = %+v; want Terminal", i, r)
			}
			if got, _ := hashState(t, p.c, key(4)); i == 4 && len(got) != 0 {
				t.Errorf("claim of an acknowledged message wrote %v", got)
			}
		case 3:
			if r.Err == nil || !strings.Contains(r.Err.Error(), `malformed state "garbage"`) {
				t.Errorf("claim %d (malformed) = %+v; want the malformed-state error", i, r)
			}
		case 7:
			if r.Err == nil || !strings.Contains(r.Err.Error(), "lease 0s") {
				t.Errorf("claim %d (invalid) = %+v; want its own error", i, r)
			}
			if got, _ := hashState(t, p.c, key(7)); len(got) != 0 {
				t.Errorf("an invalid claim wrote %v", got)
			}
		default:
			if r.Err != nil || r.Status != invocation.Claimed || r.Lease.Attempt != 1 || r.Lease.Key != key(i) {
				t.Errorf("claim %d (fresh) = %+v; want attempt 1 of its own key", i, r)
				continue
			}
			got, err := p.c.Do(t.Context(), p.c.B().Hgetall().Key(hashOf(key(i))).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			wantRunning := fmt.Sprintf("running:%d:1:%s", r.Lease.Deadline.UnixMilli(), r.Lease.Token)
			if got[testField] != wantRunning || !strings.HasPrefix(got["app/other"], "next_attempt_at:") || got[matchedField] != "1" {
				t.Errorf("claim %d stored %v, want its own lease %s and its record", i, got, wantRunning)
			}
		}
	}
	tokens := map[string]bool{}
	for _, r := range results {
		if r.Err == nil && r.Status == invocation.Claimed {
			if tokens[r.Lease.Token] {
				t.Errorf("token %s claimed twice", r.Lease.Token)
			}
			tokens[r.Lease.Token] = true
		}
	}
}

// TestSettleBatch: the settlements of several messages of one read go in
// one script run, each applied or refused on its own: a stale lease among
// them changes nothing of its message, and the others are finished,
// acknowledged and retained.
func TestSettleBatch(t *testing.T) {
	p := newCountedStore(t)
	stream, group := "{orders}", "g"
	const n = 6
	ids := make([]string, n)
	reqs := make([]invocation.ClaimRequest, n)
	for i := range n {
		ids[i] = fmt.Sprintf("1-%d", i+1)
		reqs[i] = invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: ids[i]}, Field: testField, Lease: time.Minute, MaxAttempts: 3}
	}
	deliver(t, p.c, stream, group, ids...)
	leases := make([]invocation.Lease, n)
	for i, c := range p.s.Claim(t.Context(), reqs) {
		if c.Err != nil || c.Status != invocation.Claimed {
			t.Fatalf("claim %d: %+v", i, c)
		}
		leases[i] = c.Lease
	}
	leases[4].Token = "someone-else" // stale
	ss := make([]invocation.Settlement, n)
	for i, l := range leases {
		ss[i] = acked(one(invocation.Finish, l), time.Hour)
	}
	before := p.scriptRuns(t)
	rs := p.s.Settle(t.Context(), ss)
	if got := p.scriptRuns(t) - before; got != 1 {
		t.Errorf("%d script runs, want 1", got)
	}
	if diff := cmp.Diff([]string{ids[4]}, pendingIDs(t, p.c, leases[0].Key)); diff != "" {
		t.Errorf("pending after the batch (-want +got):\n%s", diff)
	}
	for i, l := range leases {
		state, ttl := hashState(t, p.c, l.Key)
		if i == 4 {
			if !errors.Is(rs[i].Err, invocation.ErrStale) || state[terminalField] != "" || state[testField] == "ok" || ttl != -1 {
				t.Errorf("stale lease: %+v, state %v ttl %d; want ErrStale and nothing changed", rs[i], state, ttl)
			}
			continue
		}
		if rs[i].Err != nil || state[testField] != "ok" || state[terminalField] != "1" || ttl <= 0 {
			t.Errorf("message %d: %+v, state %v ttl %d; want ok, retained", i, rs[i], state, ttl)
		}
	}
}

// TestClaimBatchPELRangeFallsBack: a batch checks its claims' PEL entries
// with one XPENDING range (prelude.lua pel_set), which holds at most twice
// as many entries as the batch has claims; a claim whose id the range did
// not reach, because other pending entries filled it, is checked alone and
// claimed all the same.
func TestClaimBatchPELRangeFallsBack(t *testing.T) {
	p := newCountedStore(t)
	stream := "orders"
	key := func(i int) invocation.Key {
		return invocation.Key{Stream: stream, Group: "g", MessageID: fmt.Sprintf("1-%d", i)}
	}
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = key(i).MessageID
	}
	deliver(t, p.c, stream, "g", ids...)

	before := p.scriptRuns(t)
	// 1-0 .. 1-9 holds ten entries; the range reads four.
	res := p.s.Claim(t.Context(), []invocation.ClaimRequest{
		{Key: key(0), Field: testField, Lease: time.Minute, MaxAttempts: 3},
		{Key: key(9), Field: testField, Lease: time.Minute, MaxAttempts: 3},
	})
	if got := p.scriptRuns(t) - before; got != 1 {
		t.Errorf("%d script runs, want 1", got)
	}
	for i, r := range res {
		if r.Err != nil || r.Status != invocation.Claimed {
			t.Errorf("claim %d = %+v; want Claimed", i, r)
		}
	}
}

// TestClaimBatchPELOfOneGroupAnswersForItAlone: the batch's XPENDING range
// is of its first claim's stream and group; a claim of the same message id
// in another group that acknowledged it is checked on its own, and stays
// inert (a Store shared by two groups of one stream batches their claims
// together).
func TestClaimBatchPELOfOneGroupAnswersForItAlone(t *testing.T) {
	p := newCountedStore(t)
	stream := "orders"
	deliver(t, p.c, stream, "a", "1-1", "1-2", "1-3")
	deliver(t, p.c, stream, "b")
	if err := p.c.Do(t.Context(), p.c.B().Xack().Key(stream).Group("b").Id("1-2").Build()).Error(); err != nil {
		t.Fatal(err) // group b is done with 1-2
	}
	var reqs []invocation.ClaimRequest
	for _, c := range [][2]string{{"a", "1-3"}, {"a", "1-1"}, {"a", "1-2"}, {"b", "1-2"}} {
		reqs = append(reqs, invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: c[0], MessageID: c[1]}, Field: testField, Lease: time.Minute, MaxAttempts: 3})
	}
	before := p.scriptRuns(t)
	got := p.s.Claim(t.Context(), reqs)
	if runs := p.scriptRuns(t) - before; runs != 1 {
		t.Errorf("%d script runs, want 1", runs)
	}
	for i, r := range got[:3] {
		if r.Err != nil || r.Status != invocation.Claimed {
			t.Errorf("claim a/%s = %+v; want Claimed", reqs[i].Key.MessageID, r)
		}
	}
	if r := got[3]; r.Err != nil || r.Status != invocation.Terminal {
		t.Errorf("claim b/1-2 (acknowledged by b, pending in a) = %+v; want Terminal", r)
	}
	if st, _ := hashState(t, p.c, invocation.Key{Stream: stream, Group: "b", MessageID: "1-2"}); len(st) != 0 {
		t.Errorf("claim of an acknowledged message wrote %v", st)
	}
}

// TestSettleBatchChunks: Settle answers each settlement as a call of its
// own would, in script calls of at most WithMaxBatch settlements, at
// either retention: a stale lease, a message acknowledged elsewhere and an
// invalid lease each get their own error and change nothing, and the
// others are finished, acknowledged and retained or deleted.
func TestSettleBatchChunks(t *testing.T) {
	for _, retention := range []time.Duration{time.Hour, 0} {
		t.Run(retention.String(), func(t *testing.T) {
			p := newCountedStore(t, WithMaxBatch(2))
			stream, group := "{orders}", "g"
			const n = 7
			leases := make([]invocation.Lease, n)
			ids := make([]string, n)
			reqs := make([]invocation.ClaimRequest, n)
			for i := range n {
				ids[i] = fmt.Sprintf("1-%d", i+1)
				reqs[i] = invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: ids[i]}, Field: testField, Lease: time.Minute, MaxAttempts: 3}
			}
			deliver(t, p.c, stream, group, ids...)
			before := p.scriptRuns(t)
			for i, c := range p.s.Claim(t.Context(), reqs) {
				if c.Err != nil || c.Status != invocation.Claimed {
					t.Fatalf("claim %d: %+v", i, c)
				}
				leases[i] = c.Lease
			}
			if got := p.scriptRuns(t) - before; got != 4 {
				t.Errorf("%d script runs for 7 claims in batches of 2, want 4", got)
			}
			leases[2].Token = "someone-else" // stale
			if err := p.c.Do(t.Context(), p.c.B().Xack().Key(stream).Group(group).Id(ids[4]).Build()).Error(); err != nil {
				t.Fatal(err) // acknowledged by another worker
			}
			leases[6].Attempt = 0 // invalid
			ss := make([]invocation.Settlement, n)
			for i, l := range leases {
				ss[i] = acked(one(invocation.Finish, l), retention)
			}

			before = p.scriptRuns(t)
			rs := p.s.Settle(t.Context(), ss)
			if got := p.scriptRuns(t) - before; got != 3 {
				t.Errorf("%d script runs for 6 valid settlements in batches of 2, want 3", got)
			}
			if len(rs) != n {
				t.Fatalf("%d results for %d settlements", len(rs), n)
			}
			if diff := cmp.Diff([]string{ids[2], ids[6]}, pendingIDs(t, p.c, leases[0].Key)); diff != "" {
				t.Errorf("pending after the batch (-want +got):\n%s", diff)
			}
			for i, l := range leases {
				state, ttl := hashState(t, p.c, l.Key)
				switch i {
				case 2:
					if !errors.Is(rs[i].Err, invocation.ErrStale) || state[testField] == "ok" || ttl != -1 {
						t.Errorf("stale lease: %v, state %v ttl %d; want ErrStale and nothing changed", rs[i].Err, state, ttl)
					}
				case 4:
					if !errors.Is(rs[i].Err, invocation.ErrTerminal) || state[testField] == "ok" {
						t.Errorf("lease of an acknowledged message: %v, state %v; want ErrTerminal and nothing changed", rs[i].Err, state)
					}
				case 6:
					if rs[i].Err == nil || !strings.Contains(rs[i].Err.Error(), "finish: lease attempt 0") || state[testField] == "ok" {
						t.Errorf("invalid lease: %v, state %v; want its own error naming the transition", rs[i].Err, state)
					}
				default:
					switch {
					case rs[i].Err != nil:
						t.Errorf("lease %d: %v", i, rs[i].Err)
					case retention == 0 && len(state) != 0:
						t.Errorf("lease %d: state %v left at retention 0", i, state)
					case retention > 0 && (state[testField] != "ok" || state[terminalField] != "1" || ttl <= 0):
						t.Errorf("lease %d: state %v ttl %d; want ok and retained", i, state, ttl)
					}
				}
			}
		})
	}
}

// TestSettleChunksKeepTheirOrder: a batch of 5 settlements of different
// transitions cut into calls of 2 (WithMaxBatch(2)) returns each
// settlement its own result: the retry its own next time, the exhausts
// their own entries, in the order of the batch.
func TestSettleChunksKeepTheirOrder(t *testing.T) {
	p := newCountedStore(t, WithMaxBatch(2))
	stream, group := "{orders}", "g"
	ids := []string{"1-1", "1-2", "1-3", "1-4", "1-5"}
	deliver(t, p.c, stream, group, ids...)
	var reqs []invocation.ClaimRequest
	for _, id := range ids {
		reqs = append(reqs, invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: id}, Field: testField, Lease: time.Minute, MaxAttempts: 5})
	}
	var leases []invocation.Lease
	for i, c := range p.s.Claim(t.Context(), reqs) {
		if c.Err != nil || c.Status != invocation.Claimed {
			t.Fatalf("claim %d: %+v", i, c)
		}
		leases = append(leases, c.Lease)
	}
	retry := func(l invocation.Lease, backoff time.Duration) invocation.Settlement {
		st := one(invocation.Retry, l)
		st.Transitions[0].Backoff = backoff
		return st
	}
	ss := []invocation.Settlement{
		retry(leases[0], time.Hour),
		acked(one(invocation.Exhaust, leases[1]), time.Hour),
		retry(leases[2], 2*time.Hour),
		acked(one(invocation.Exhaust, leases[3]), 0),
		one(invocation.Release, leases[4]),
	}
	before := p.scriptRuns(t)
	rs := p.s.Settle(t.Context(), ss)
	if got := p.scriptRuns(t) - before; got != 3 {
		t.Errorf("%d script runs for 5 settlements in batches of 2, want 3", got)
	}
	for i, r := range rs {
		if r.Err != nil || len(r.Transitions) != 1 {
			t.Fatalf("settlement %d: %+v", i, r)
		}
	}
	for i, want := range map[int]string{0: nextAt(rs[0].Transitions[0].Next.UnixMilli(), 1, leases[0].Token),
		2: nextAt(rs[2].Transitions[0].Next.UnixMilli(), 1, leases[2].Token)} {
		if got, _ := hashState(t, p.c, leases[i].Key); got[testField] != want {
			t.Errorf("settlement %d stored %q, want %q from its result", i, got[testField], want)
		}
	}
	if d := rs[2].Transitions[0].Next.Sub(rs[0].Transitions[0].Next); d < 59*time.Minute || d > 61*time.Minute {
		t.Errorf("retry of 2h is due %v after the retry of 1h, want about 1h", d)
	}
	entries := dlqEntries(t, p.c, stream)
	if len(entries) != 2 {
		t.Fatalf("%d dead-letter entries, want 2", len(entries))
	}
	entryOfMessage := map[string]string{} // original id → entry id
	for _, e := range entries {
		entryOfMessage[e.OriginalID] = e.ID
	}
	for _, i := range []int{1, 3} {
		if got, want := rs[i].Transitions[0].DLQID, entryOfMessage[ids[i]]; got == "" || got != want {
			t.Errorf("settlement %d: entry %q, want %q, the entry of %s", i, got, want, ids[i])
		}
	}
	if diff := cmp.Diff([]string{ids[0], ids[2], ids[4]}, pendingIDs(t, p.c, leases[0].Key)); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
}

// TestBatchAcrossStreamsAndGroups: one Claim call and one Settle call
// may mix messages of two streams and of two groups of one stream, with
// the same message id: each claim and settlement applies to its own
// message, acknowledges only its own group's PEL entry and writes its
// dead-letter entry to its own stream's dead-letter stream.
func TestBatchAcrossStreamsAndGroups(t *testing.T) {
	p := newCountedStore(t)
	ctx := t.Context()
	s1, s2 := "{one}", "{two}"
	deliver(t, p.c, s1, "g1", "1-1")
	deliver(t, p.c, s1, "g2")
	deliver(t, p.c, s2, "g1", "1-1")
	keys := []invocation.Key{
		{Stream: s1, Group: "g1", MessageID: "1-1"},
		{Stream: s1, Group: "g2", MessageID: "1-1"},
		{Stream: s2, Group: "g1", MessageID: "1-1"},
	}
	var reqs []invocation.ClaimRequest
	for _, k := range keys {
		reqs = append(reqs, invocation.ClaimRequest{Key: k, Field: testField, Lease: time.Minute, MaxAttempts: 1})
	}
	var leases []invocation.Lease
	for i, c := range p.s.Claim(ctx, reqs) {
		if c.Err != nil || c.Status != invocation.Claimed || c.Lease.Key != keys[i] {
			t.Fatalf("claim %d: %+v, want claimed on its own key", i, c)
		}
		leases = append(leases, c.Lease)
	}
	rs := p.s.Settle(ctx, []invocation.Settlement{
		acked(one(invocation.Exhaust, leases[0]), time.Hour),
		one(invocation.Retry, leases[1]),
		acked(one(invocation.Exhaust, leases[2]), 0),
	})
	for i, r := range rs {
		if r.Err != nil {
			t.Fatalf("settlement %d: %v", i, r.Err)
		}
	}
	if got := pendingIDs(t, p.c, keys[0]); len(got) != 0 {
		t.Errorf("%s g1 pending %v, want none", s1, got)
	}
	if diff := cmp.Diff([]string{"1-1"}, pendingIDs(t, p.c, keys[1])); diff != "" {
		t.Errorf("%s g2 pending (-want +got):\n%s", s1, diff)
	}
	if got := pendingIDs(t, p.c, keys[2]); len(got) != 0 {
		t.Errorf("%s g1 pending %v, want none", s2, got)
	}
	want := []map[string]string{
		{testField: dead(1, leases[0].Token), terminalField: "1"},
		{testField: nextAt(rs[1].Transitions[0].Next.UnixMilli(), 1, leases[1].Token)},
		{},
	}
	for i, k := range keys {
		got, _ := hashState(t, p.c, k)
		if diff := cmp.Diff(want[i], got); diff != "" {
			t.Errorf("hash of %v (-want +got):\n%s", k, diff)
		}
	}
	for i, stream := range []string{s1, s2} {
		ids, got := withoutIDs(dlqEntries(t, p.c, stream))
		l := leases[2*i]
		if diff := cmp.Diff([]dlq.Entry{stored(l)}, got); diff != "" {
			t.Errorf("dead-letter entries of %s (-want +got):\n%s", stream, diff)
		}
		if len(ids) == 1 && rs[2*i].Transitions[0].DLQID != ids[0] {
			t.Errorf("settlement %d: entry %s, want %s", 2*i, rs[2*i].Transitions[0].DLQID, ids[0])
		}
	}
}

// TestSplitClaimReplies: claim.lua's flat reply is cut at the lengths its
// codes fix, and a reply that does not hold exactly the batch's claims
// fails every claim of the batch rather than hand one a neighbour's reply.
func TestSplitClaimReplies(t *testing.T) {
	c := redistest.Client(t)
	run := func(lua string, n int) []result {
		return splitReplies(rueidis.NewLuaScript(lua).Exec(t.Context(), c, nil, nil), n, claimReplyLen)
	}
	// One reply of every code.
	const all = `return {9, 1700000000000, 7, 1, 2, 1700000000000, 'tp', 1, 4, 2, 5, 3, 5, 2, 'tok', '', 0, 6, 2, 'tok', 'tp', 8, 'garbage', 3, 42, 2, 10, 11, 2, 1, 12, 'c', 5000, 13, 77, 14, '1-0'}`
	got := run(all, 14)
	wantCodes := []int64{9, 7, 1, 4, 2, 5, 6, 8, 3, 10, 11, 12, 13, 14}
	wantLast := []string{"1700000000000", "7", "1", "4", "3", "0", "tp", "garbage", "2", "10", "1", "5000", "77", "1-0"}
	for i, r := range got {
		if r.err != nil {
			t.Fatalf("claim %d: %v", i, r.err)
		}
		last, err := r.reply.arr[len(r.reply.arr)-1].ToString()
		if err != nil {
			if n, ierr := r.reply.arr[len(r.reply.arr)-1].AsInt64(); ierr == nil {
				last, err = strconv.FormatInt(n, 10), nil
			}
		}
		if r.reply.code != wantCodes[i] || len(r.reply.arr) != claimReplyLen(wantCodes[i]) || err != nil || last != wantLast[i] {
			t.Errorf("claim %d: code %d, %d elements ending in %q (%v); want code %d, %d elements ending in %q",
				i, r.reply.code, len(r.reply.arr), last, err, wantCodes[i], claimReplyLen(wantCodes[i]), wantLast[i])
		}
	}

	for i, r := range run(all, 10) {
		if r.err == nil || !strings.Contains(r.err.Error(), "left after 10 items") {
			t.Errorf("11 replies for 10 claims, claim %d: %v, want every claim failed", i, r.err)
		}
	}
	for _, bad := range []struct{ lua, why string }{
		{`return {9, 1, 99, 1}`, "unknown code"},
		{`return {9, 1, 'x'}`, "element 2"},
		{`return {9, 1, 1, 2}`, "wants 5 elements"},
		{`return {9, 1}`, "fewer than 2 items"},
		{`return {9, 1, 4, 4}`, "left after 2 items"},
		{`return 'x'`, ""},
	} {
		got := run(bad.lua, 2)
		for i, r := range got {
			if r.err == nil || !strings.Contains(r.err.Error(), bad.why) {
				t.Errorf("%s, claim %d: %v, want an error naming %q", bad.lua, i, r.err, bad.why)
			}
		}
	}
}

// TestSplitSettleReplies: settle.lua's flat reply is cut at its codes,
// an applied settlement taking one element per transition, and a reply
// that does not hold exactly the batch's settlements fails them all.
func TestSplitSettleReplies(t *testing.T) {
	c := redistest.Client(t)
	items := []settleItem{{n: 2}, {n: 0}, {n: 1}, {n: 3}, {n: 1}}
	run := func(lua string, items []settleItem) []result {
		return splitReplies(rueidis.NewLuaScript(lua).Exec(t.Context(), c, nil, nil), len(items), settleReplyLen(items))
	}
	got := run(`return {1, 0, '1-1', 1, 2, 3, 5}`, items)
	wantCodes := []int64{1, 1, 2, 3, 5}
	wantLen := []int{3, 1, 1, 1, 1}
	for i, r := range got {
		if r.err != nil || r.reply.code != wantCodes[i] || len(r.reply.arr) != wantLen[i] {
			t.Errorf("settlement %d: %+v, want code %d with %d elements", i, r, wantCodes[i], wantLen[i])
		}
	}
	for _, bad := range []struct{ lua, why string }{
		{`return {1, 0, '1-1', 4}`, "unknown code 4"},
		{`return {1, 0, '1-1', 11}`, "unknown code 11"},
		{`return {1, 0}`, "wants 3 elements"},
		{`return {1, 0, '1-1'}`, "fewer than 2 items"},
		{`return {1, 0, '1-1', 1, 2}`, "left after 2 items"},
		{`return {'x'}`, "the code of item 0"},
	} {
		for i, r := range run(bad.lua, items[:2]) {
			if r.err == nil || !strings.Contains(r.err.Error(), bad.why) {
				t.Errorf("%s, settlement %d: %v, want an error naming %q", bad.lua, i, r.err, bad.why)
			}
		}
	}
}

// TestBatchAcrossStreamsCluster: under Redis Cluster one Claim call and
// one Settle call may carry messages of streams in different hash slots
// (two hash tags): each stream's claims and settlements go in calls of
// their own, which a cluster serves, and each gets its own answer.
func TestBatchAcrossStreamsCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	s := New(c)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var streams []string
	for i := 0; len(streams) < 2; i++ {
		st := "{" + redistest.Name(t, "tag", strconv.Itoa(i)) + "}"
		if len(streams) == 1 && keys.Slot(st) == keys.Slot(streams[0]) {
			continue
		}
		streams = append(streams, st)
	}
	var reqs []invocation.ClaimRequest
	for _, st := range streams {
		for range 2 {
			k := pendingMessage(t, c, invocation.Key{Stream: st, Group: "group"})
			reqs = append(reqs, invocation.ClaimRequest{Key: k, Field: testField, Lease: time.Minute, MaxAttempts: 1})
		}
	}
	// Interleaved: a stream's claims need not be adjacent.
	reqs[1], reqs[2] = reqs[2], reqs[1]
	var ss []invocation.Settlement
	for i, r := range s.Claim(ctx, reqs) {
		if r.Err != nil || r.Status != invocation.Claimed || r.Lease.Key != reqs[i].Key {
			t.Fatalf("claim %d: %+v, want claimed on its own key", i, r)
		}
		ss = append(ss, acked(one(invocation.Exhaust, r.Lease), 0))
	}
	for i, r := range s.Settle(ctx, ss) {
		if r.Err != nil || len(r.Transitions) != 1 || r.Transitions[0].DLQID == "" {
			t.Fatalf("settlement %d: %+v, want applied with its entry", i, r)
		}
	}
	for _, st := range streams {
		var want []string
		for _, r := range reqs {
			if r.Key.Stream == st {
				want = append(want, r.Key.MessageID)
				if got, _ := hashState(t, c, r.Key); len(got) != 0 || pending(t, c, r.Key) != 0 {
					t.Errorf("%v: hash %v, pending %d; want neither", r.Key, got, pending(t, c, r.Key))
				}
			}
		}
		var got []string
		for _, e := range dlqEntries(t, c, st) {
			got = append(got, e.OriginalID)
		}
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("dead-letter entries of %s (-want +got):\n%s", st, diff)
		}
	}
}

// TestSettleOrder: a settle.lua call takes the settlements that
// acknowledge first, the others after, each in their order, and those of
// one message in theirs.
func TestSettleOrder(t *testing.T) {
	item := func(hash string, ack bool) settleItem { return settleItem{hash: hash, ack: ack} }
	for _, tc := range []struct {
		name  string
		items []settleItem
		want  []int
	}{
		{name: "none", items: nil, want: []int{}},
		{name: "acks only", items: []settleItem{item("a", true), item("b", true)}, want: []int{0, 1}},
		{name: "no acks", items: []settleItem{item("a", false), item("b", false)}, want: []int{0, 1}},
		{name: "an ack behind a retry", items: []settleItem{item("a", false), item("b", true), item("c", false), item("d", true)},
			want: []int{1, 3, 0, 2}},
		{name: "an ack behind a settlement of its message", items: []settleItem{item("a", false), item("a", true), item("b", true)},
			want: []int{2, 0, 1}},
		{name: "a settlement behind an ack of its message", items: []settleItem{item("a", true), item("a", false), item("a", true)},
			want: []int{0, 1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, settleOrder(tc.items)); diff != "" {
				t.Errorf("settleOrder (-want +got):\n%s", diff)
			}
		})
	}
}

// TestClaimBatchOfABrokenStreamFailsAlone: the claims of one stream go in
// script calls of their own, so a stream whose key is no stream (the
// call fails with WRONGTYPE) fails its own claims only, and the claims of
// another stream in the same batch are answered.
func TestClaimBatchOfABrokenStreamFailsAlone(t *testing.T) {
	p := newCountedStore(t)
	ctx := t.Context()
	deliver(t, p.c, "good", "g", "1-1", "1-2")
	if err := p.c.Do(ctx, p.c.B().Set().Key("broken").Value("not a stream").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	reqs := []invocation.ClaimRequest{
		{Key: invocation.Key{Stream: "good", Group: "g", MessageID: "1-1"}, Field: testField, Lease: time.Minute, MaxAttempts: 3},
		{Key: invocation.Key{Stream: "broken", Group: "g", MessageID: "1-1"}, Field: testField, Lease: time.Minute, MaxAttempts: 3},
		{Key: invocation.Key{Stream: "good", Group: "g", MessageID: "1-2"}, Field: testField, Lease: time.Minute, MaxAttempts: 3},
	}
	res := p.s.Claim(ctx, reqs)
	for _, i := range []int{0, 2} {
		if r := res[i]; r.Err != nil || r.Status != invocation.Claimed {
			t.Errorf("claim %d of the good stream = %+v; want Claimed", i, r)
		}
	}
	if r := res[1]; r.Err == nil || !strings.Contains(r.Err.Error(), "WRONGTYPE") {
		t.Errorf("claim of the broken stream = %+v; want its WRONGTYPE error", r)
	}
	if got, _ := hashState(t, p.c, reqs[1].Key); len(got) != 0 {
		t.Errorf("the failed claim wrote %v", got)
	}
}
