package redisstate

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// pendingMessage adds one entry to key.Stream, delivers it to a consumer
// of key.Group so that it is pending, and returns key with its id.
func pendingMessage(t *testing.T, c rueidis.Client, key invocation.Key) invocation.Key {
	t.Helper()
	ctx := t.Context()
	err := c.Do(ctx, c.B().XgroupCreate().Key(key.Stream).Group(key.Group).Id("0").Mkstream().Build()).Error()
	if e, ok := rueidis.IsRedisErr(err); err != nil && (!ok || !strings.HasPrefix(e.Error(), "BUSYGROUP")) {
		t.Fatalf("XGROUP CREATE: %v", err)
	}
	id, err := c.Do(ctx, c.B().Xadd().Key(key.Stream).Id("*").FieldValue().FieldValue("event", "{}").Build()).ToString()
	if err != nil {
		t.Fatalf("XADD: %v", err)
	}
	if err := c.Do(ctx, c.B().Xreadgroup().Group(key.Group, "c1").Count(1).Streams().Key(key.Stream).Id(">").Build()).Error(); err != nil {
		t.Fatalf("XREADGROUP: %v", err)
	}
	key.MessageID = id
	if n := pendingIDs(t, c, key); !slices.Contains(n, id) {
		t.Fatalf("setup: %s not pending (%v)", id, n)
	}
	return key
}

// pending returns 1 when key's message is in its group's PEL, else 0.
func pending(t *testing.T, c rueidis.Client, key invocation.Key) int64 {
	t.Helper()
	if slices.Contains(pendingIDs(t, c, key), key.MessageID) {
		return 1
	}
	return 0
}

// pendingIDs returns the ids in key.Group's PEL (XPENDING - + 100).
func pendingIDs(t *testing.T, c rueidis.Client, key invocation.Key) []string {
	t.Helper()
	rows, err := c.Do(t.Context(), c.B().Xpending().Key(key.Stream).Group(key.Group).Start("-").End("+").Count(100).Build()).ToArray()
	if err != nil {
		t.Fatalf("XPENDING: %v", err)
	}
	var ids []string
	for _, r := range rows {
		f, err := r.ToArray()
		if err != nil || len(f) == 0 {
			t.Fatalf("XPENDING row: %v", err)
		}
		id, _ := f[0].ToString()
		ids = append(ids, id)
	}
	return ids
}

func hashState(t *testing.T, c rueidis.Client, key invocation.Key) (map[string]string, int64) {
	t.Helper()
	e := &env{c: c, hash: hashOf(key), key: key}
	return e.state(t)
}

// ack is the settlement that acknowledges key's message without
// transitions and applies retention to its hash.
func ack(key invocation.Key, retention time.Duration) invocation.Settlement {
	return invocation.Settlement{Key: key, Ack: true, Retention: retention}
}

// TestSettle: an Ack settlement takes the message out of the PEL and its
// hash keeps its fields and gains __terminal and the TTL; a repeated one
// changes nothing, TTL included, and reports ErrTerminal. With retention 0
// the hash is gone with the XACK.
func TestSettle(t *testing.T) {
	e := newEnv(t, "")
	e.seed(t, map[string]string{testField: "ok"}, 0)

	if err := apply(t.Context(), e.s, ack(e.key, time.Hour)); err != nil {
		t.Fatalf("Settle = %v", err)
	}
	if n := pending(t, e.c, e.key); n != 0 {
		t.Errorf("%d entries pending after Settle, want 0", n)
	}
	got, pttl := e.state(t)
	if diff := cmp.Diff(map[string]string{testField: "ok", terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)

	if err := apply(t.Context(), e.s, ack(e.key, 2*time.Hour)); !errors.Is(err, invocation.ErrTerminal) {
		t.Fatalf("second Settle = %v, want ErrTerminal", err)
	}
	again, pttl := e.state(t)
	checkPTTL(t, time.Hour, pttl) // the running TTL is kept, not extended
	if diff := cmp.Diff(got, again); diff != "" {
		t.Errorf("the second Settle changed the hash (-before +after):\n%s", diff)
	}

	// Retention 0: the other message's hash is deleted in the XACK's script.
	other := &env{c: e.c, hash: hashOf(e.other)}
	other.seed(t, map[string]string{testField: "ok", "__trace:" + testField: "x"}, 0)
	if err := apply(t.Context(), e.s, ack(e.other, 0)); err != nil {
		t.Fatalf("Settle with retention 0 = %v", err)
	}
	if n := pending(t, e.c, e.other); n != 0 {
		t.Errorf("%d entries pending after Settle with retention 0, want 0", n)
	}
	if got, pttl := other.state(t); len(got) != 0 || pttl != -2 {
		t.Errorf("hash after Settle with retention 0: %v (PTTL %d), want none", got, pttl)
	}
}

// TestSettleNotPending: a message no longer in its group's PEL (another
// delivery settled it, or the group does not know it) is left alone:
// ErrTerminal, and no hash changed or created, whatever the retention.
func TestSettleNotPending(t *testing.T) {
	for _, retention := range []time.Duration{0, time.Hour} {
		e := newEnv(t, "")
		e.seed(t, map[string]string{testField: running(9999999999999, 1, "tok")}, 0)
		e.ack(t, e.key)
		unknown := e.key
		unknown.Group = "unknown"
		for _, k := range []invocation.Key{e.key, unknown} {
			for _, st := range []invocation.Settlement{ack(k, retention), acked(one(invocation.Finish, invocation.Lease{Key: k, Field: testField, Attempt: 1, Token: "tok"}), retention)} {
				if err := apply(t.Context(), e.s, st); !errors.Is(err, invocation.ErrTerminal) {
					t.Fatalf("Settle (retention %v, %d transitions) = %v, want ErrTerminal", retention, len(st.Transitions), err)
				}
			}
		}
		got, pttl := e.state(t)
		if diff := cmp.Diff(map[string]string{testField: running(9999999999999, 1, "tok")}, got); diff != "" || pttl != -1 {
			t.Errorf("retention %v: hash (-want +got):\n%s PTTL %d", retention, diff, pttl)
		}
		if got, _ := hashState(t, e.c, unknown); len(got) != 0 {
			t.Errorf("retention %v: Settle created %v", retention, got)
		}
	}
}

// TestSettleWrongType: a key that holds no stream fails the call, with an
// error that is neither ErrStale nor ErrTerminal, and nothing is written.
func TestSettleWrongType(t *testing.T) {
	e := newEnv(t, "")
	if err := e.c.Do(t.Context(), e.c.B().Set().Key(e.key.Stream).Value("not a stream").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	for _, st := range []invocation.Settlement{ack(e.key, time.Hour), one(invocation.Exhaust, e.lease(1, "tok")), {Key: e.key, Cleared: true}} {
		err := apply(t.Context(), e.s, st)
		if err == nil || errors.Is(err, invocation.ErrStale) || errors.Is(err, invocation.ErrTerminal) {
			t.Errorf("Settle on a string key: %v, want WRONGTYPE", err)
		}
	}
	if got, pttl := e.state(t); len(got) != 0 || pttl != -2 {
		t.Errorf("hash after a failed call: %v (PTTL %d), want none", got, pttl)
	}
}

func TestSettleInvalidRetention(t *testing.T) {
	e := newEnv(t, "")
	e.seed(t, map[string]string{testField: "ok"}, 0)
	if err := apply(t.Context(), e.s, ack(e.key, -time.Second)); err == nil {
		t.Fatalf("Settle with retention -1s = nil, want an error")
	}
	if n := pending(t, e.c, e.key); n != 1 {
		t.Errorf("a refused Settle acknowledged the message")
	}
	if got, pttl := e.state(t); len(got) != 1 || pttl != -1 {
		t.Errorf("hash after a refused call: %v (PTTL %d), want it unchanged", got, pttl)
	}
}

// TestSettleRetentionZeroLeavesOnlyDeadLetters: an Ack at retention 0 of
// a message whose invocations exhausted leaves no key of the message but
// its dead-letter entries: no hash, no trace, no marker, and the message
// out of the PEL.
func TestSettleRetentionZeroLeavesOnlyDeadLetters(t *testing.T) {
	e := newEnv(t, "")
	now := e.nowMS(t)
	a := invocation.Lease{Key: e.key, Field: "a/one", Attempt: 3, Token: "ta", Trace: tp1}
	b := invocation.Lease{Key: e.key, Field: "b/two", Attempt: 2, Token: "tb"}
	e.seed(t, map[string]string{a.Field: running(now+hourMS, 3, "ta"), b.Field: exhausted(2, "tb"),
		"c/three": "ok", invocation.TraceField(a.Field): tp2, matchedField: "1", "__schedule": "pin"}, 0)
	st := one(invocation.Exhaust, a)
	st.Transitions = append(st.Transitions, one(invocation.DeadLetter, b).Transitions...)
	r := settleOne(t.Context(), e.s, acked(st, 0))
	if r.Err != nil {
		t.Fatalf("Settle: %v", r.Err)
	}
	ids, got := withoutIDs(dlqEntries(t, e.c, e.key.Stream))
	if diff := cmp.Diff([]dlq.Entry{stored(a), stored(b)}, got); diff != "" {
		t.Errorf("dead-letter entries (-want +got):\n%s", diff)
	}
	if len(ids) == 2 {
		if diff := cmp.Diff([]invocation.TransitionResult{{DLQID: ids[0]}, {DLQID: ids[1]}}, r.Transitions); diff != "" {
			t.Errorf("results (-want +got):\n%s", diff)
		}
	}
	// Every key of the test's stream: the stream and its dead-letter
	// stream, nothing of the message.
	all, err := e.c.Do(t.Context(), e.c.B().Keys().Pattern("*"+e.key.Stream+"*").Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(all)
	want := []string{e.key.Stream, keys.DLQ(e.key.Stream)}
	slices.Sort(want)
	if diff := cmp.Diff(want, all); diff != "" {
		t.Errorf("keys after the settlement (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{e.other.MessageID}, pendingIDs(t, e.c, e.key)); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
}

// TestSettleCluster runs Settle on Redis Cluster for a stream with a hash
// tag, whose hash and dead-letter stream share its slot: it ends
// acknowledged and retained. A stream without one is refused with an
// error that says so, and nothing is acknowledged.
func TestSettleCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	s := New(c)
	key := pendingMessage(t, c, invocation.Key{Stream: "{" + redistest.Name(t, "tagged") + "}", Group: "group"})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	(&env{c: c, hash: hashOf(key)}).seed(t, map[string]string{testField: "ok"}, 0)
	if err := apply(ctx, s, ack(key, time.Hour)); err != nil {
		t.Fatalf("Settle = %v", err)
	}
	if n := pending(t, c, key); n != 0 {
		t.Errorf("%d entries pending, want 0", n)
	}
	got, pttl := hashState(t, c, key)
	if diff := cmp.Diff(map[string]string{testField: "ok", terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)

	// Every transition runs there too: claim, then finish and ack in one
	// script, and exhaust with its dead-letter entry and the ack.
	next := pendingMessage(t, c, invocation.Key{Stream: key.Stream, Group: "group"})
	last := pendingMessage(t, c, invocation.Key{Stream: key.Stream, Group: "group"})
	res := s.Claim(ctx, []invocation.ClaimRequest{
		{Key: next, Field: testField, Lease: time.Minute, MaxAttempts: 3},
		{Key: last, Field: testField, Lease: time.Minute, MaxAttempts: 1},
	})
	for i, r := range res {
		if r.Err != nil || r.Status != invocation.Claimed {
			t.Fatalf("Claim %d = %+v", i, r)
		}
	}
	rs := s.Settle(ctx, []invocation.Settlement{acked(one(invocation.Finish, res[0].Lease), 0), acked(one(invocation.Exhaust, res[1].Lease), 0)})
	for i, r := range rs {
		if r.Err != nil {
			t.Fatalf("Settle %d = %v", i, r.Err)
		}
	}
	for _, k := range []invocation.Key{next, last} {
		if got, _ := hashState(t, c, k); pending(t, c, k) != 0 || len(got) != 0 {
			t.Errorf("after Settle with retention 0: pending %d, hash %v; want neither", pending(t, c, k), got)
		}
	}
	if _, got := withoutIDs(dlqEntries(t, c, key.Stream)); !cmp.Equal([]dlq.Entry{stored(res[1].Lease)}, got) {
		t.Errorf("dead-letter entries %+v, want the exhausted one", got)
	}

	untagged := pendingMessage(t, c, invocation.Key{Stream: redistest.Name(t, "untagged"), Group: "group"})
	if slot(t, c, untagged.Stream) == slot(t, c, keys.Invocation(untagged.Stream, untagged.Group, untagged.MessageID)) {
		t.Skip("the untagged stream happens to share its hash's slot")
	}
	err := apply(ctx, s, ack(untagged, time.Hour))
	if err == nil || !strings.Contains(err.Error(), "hash tag") {
		t.Errorf("Settle of an untagged stream = %v, want an error naming the hash tag", err)
	}
	if _, err := claimOne(ctx, s, invocation.ClaimRequest{Key: untagged, Field: testField, Lease: time.Minute, MaxAttempts: 3}); err == nil || !strings.Contains(err.Error(), "hash tag") {
		t.Errorf("Claim of an untagged stream = %v, want an error naming the hash tag", err)
	}
	if n := pending(t, c, untagged); n != 1 {
		t.Errorf("a refused Settle acknowledged the message")
	}
}

func slot(t *testing.T, c rueidis.Client, key string) int64 {
	t.Helper()
	n, err := c.Do(t.Context(), c.B().ClusterKeyslot().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("CLUSTER KEYSLOT %s: %v", key, err)
	}
	return n
}

// TestSettleFinishAck: the last invocation's success, the XACK and the
// retention are one settlement. A running lease of this attempt and token
// finishes, leaves the PEL and gets the TTL, or with retention 0 its hash
// is deleted; a stale lease, a retained hash or a message no longer pending
// changes nothing and acknowledges nothing.
func TestSettleFinishAck(t *testing.T) {
	live := func(l invocation.Lease) map[string]string {
		return map[string]string{l.Field: running(9999999999999, l.Attempt, l.Token), "other/done": "ok"}
	}
	for _, tc := range []struct {
		name    string
		seed    func(l invocation.Lease) map[string]string
		acked   bool // another delivery acknowledged the message first
		wantErr error
	}{
		{"running", live, false, nil},
		{"expired lease nobody took", func(l invocation.Lease) map[string]string {
			return map[string]string{l.Field: running(1, l.Attempt, l.Token)}
		}, false, nil},
		{"another token", func(l invocation.Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt, "other")}
		}, false, invocation.ErrStale},
		{"another attempt", func(l invocation.Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt+1, l.Token)}
		}, false, invocation.ErrStale},
		{"already ok", func(l invocation.Lease) map[string]string { return map[string]string{l.Field: "ok"} }, false, invocation.ErrStale},
		{"no state", func(invocation.Lease) map[string]string { return nil }, false, invocation.ErrStale},
		{"retained", func(l invocation.Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt, l.Token), terminalField: "1"}
		}, false, invocation.ErrTerminal},
		{"acknowledged", live, true, invocation.ErrTerminal},
		{"acknowledged without state", func(invocation.Lease) map[string]string { return nil }, true, invocation.ErrTerminal},
	} {
		for _, retention := range []time.Duration{0, time.Hour} {
			t.Run(fmt.Sprintf("%s/retention %v", tc.name, retention), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, "")
				l := invocation.Lease{Key: e.key, Field: testField, Attempt: 2, Token: "tok"}
				seeded := tc.seed(l)
				e.seed(t, seeded, 0)
				if tc.acked {
					e.ack(t, e.key)
				}
				err := apply(t.Context(), e.s, acked(one(invocation.Finish, l), retention))
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
					t.Fatalf("Settle = %v, want %v", err, tc.wantErr)
				}
				checkFinishAcked(t, e, l, seeded, retention, tc.wantErr == nil, tc.acked)
			})
		}
	}
}

// checkFinishAcked asserts the message's PEL entry and hash after a
// Finish and Ack of l on a hash seeded with seeded, which applied or not.
func checkFinishAcked(t *testing.T, e *env, l invocation.Lease, seeded map[string]string, retention time.Duration, applied, acked bool) {
	t.Helper()
	st, pttl := e.state(t)
	if !applied {
		if n := pending(t, e.c, e.key); n != 1 && !acked {
			t.Errorf("a refused settlement acknowledged the message (%d pending)", n)
		}
		if seeded == nil {
			seeded = map[string]string{}
		}
		if diff := cmp.Diff(seeded, st); diff != "" {
			t.Errorf("a refused settlement changed the hash (-want +got):\n%s", diff)
		}
		return
	}
	if n := pending(t, e.c, e.key); n != 0 {
		t.Errorf("%d entries pending after the settlement, want 0", n)
	}
	if retention == 0 {
		if len(st) != 0 || pttl != -2 {
			t.Errorf("hash after the settlement with retention 0: %v (PTTL %d), want none", st, pttl)
		}
		return
	}
	want := map[string]string{l.Field: "ok", terminalField: "1"}
	for f, v := range seeded {
		if f != l.Field {
			want[f] = v
		}
	}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, retention, pttl)
}

// TestSettleTakesOverALegacyDeadLetter: a worker of the previous version
// wrote an invocation's dead-letter entry and its written marker, then
// stopped before marking the field (exhausted:<a>:<t>, no ":dlq"). The
// DeadLetter of this version's redelivery takes that entry over, as
// written before: no second entry, the field marked and the entry's id in
// __dlq:<field>. Without a marker it writes the entry.
func TestSettleTakesOverALegacyDeadLetter(t *testing.T) {
	e := newEnv(t, "")
	ctx := t.Context()
	l := invocation.Lease{Key: e.key, Field: testField, Attempt: 2, Token: "tok"}
	old := stored(l)
	add := e.c.B().Xadd().Key(keys.DLQ(e.key.Stream)).Id("*").FieldValue()
	pairs := dlq.EncodePairs(old)
	for i := 0; i+1 < len(pairs); i += 2 {
		add = add.FieldValue(pairs[i], pairs[i+1])
	}
	id, err := e.c.Do(ctx, add.Build()).ToString()
	if err != nil {
		t.Fatal(err)
	}
	app, handler := invocation.SplitField(testField)
	marker := keys.LegacyDLQWritten(e.key.Stream, e.key.Group, e.key.MessageID, app, handler)
	if err := e.c.Do(ctx, e.c.B().Set().Key(marker).Value(id).Px(time.Hour).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	e.seed(t, map[string]string{testField: "exhausted:2:tok"}, 0)
	before := len(dlqEntries(t, e.c, e.key.Stream))

	dead := invocation.Transition{Kind: invocation.DeadLetter, Lease: l, Entry: entryOf(l)}
	r := settleOne(ctx, e.s, invocation.Settlement{Key: e.key, Transitions: []invocation.Transition{dead}, Ack: true, Retention: time.Hour})
	if r.Err != nil || len(r.Transitions) != 1 || r.Transitions[0].DLQID != "" {
		t.Fatalf("DeadLetter over a legacy marker = %+v, want applied, its entry written before (no DLQID)", r)
	}
	if after := len(dlqEntries(t, e.c, e.key.Stream)); after != before {
		t.Errorf("%d dead-letter entries written, want none: the previous version wrote it", after-before)
	}
	// state checks that __dlq:<field> names an entry of the message, and
	// drops it.
	if got, _ := e.state(t); got[testField] != "exhausted:2:tok:dlq" {
		t.Errorf("state %v, want %s marked :dlq", got, testField)
	}
	if got, err := e.c.Do(ctx, e.c.B().Hget().Key(e.hash).Field(invocation.DLQField(testField)).Build()).ToString(); err != nil || got != id {
		t.Errorf("%s = %q (%v), want the previous version's entry %s", invocation.DLQField(testField), got, err, id)
	}

	// The other message has no marker: its entry is written.
	lo := invocation.Lease{Key: e.other, Field: testField, Attempt: 1, Token: "t2"}
	other := &env{c: e.c, hash: hashOf(e.other)}
	other.seed(t, map[string]string{testField: "exhausted:1:t2"}, 0)
	deadOther := invocation.Transition{Kind: invocation.DeadLetter, Lease: lo, Entry: entryOf(lo)}
	r = settleOne(ctx, e.s, invocation.Settlement{Key: e.other, Transitions: []invocation.Transition{deadOther}})
	if r.Err != nil || len(r.Transitions) != 1 || r.Transitions[0].DLQID == "" {
		t.Fatalf("DeadLetter without a marker = %+v, want its entry written", r)
	}
}
