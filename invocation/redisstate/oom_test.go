package redisstate

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
)

// outOfMemory makes srv's client c refuse every write that could grow
// memory, as a Redis at maxmemory with noeviction does, and returns a
// function that frees it again.
func outOfMemory(t *testing.T, c rueidis.Client) (free func()) {
	t.Helper()
	set := func(kv ...string) {
		t.Helper()
		cmd := c.B().ConfigSet().ParameterValue()
		for i := 0; i < len(kv); i += 2 {
			cmd = cmd.ParameterValue(kv[i], kv[i+1])
		}
		if err := c.Do(t.Context(), cmd.Build()).Error(); err != nil {
			t.Fatalf("CONFIG SET %v: %v", kv, err)
		}
	}
	set("maxmemory-policy", "noeviction", "maxmemory", "1")
	return func() { set("maxmemory", "0") }
}

// isOOM reports whether err carries Redis' OOM error reply.
func isOOM(err error) bool {
	var re *rueidis.RedisError
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "OOM ")
}

// TestOutOfMemoryFailsClosed: a Redis at maxmemory with noeviction
// refuses Claim's write, so Claim returns the OOM error and nothing is
// written: the caller does not run the handler and the message stays
// pending (docs/delivery.md#claim-errors-fail-closed). So does a probe,
// and a settlement that does not acknowledge (a retry, a release, an
// exhaust with its dead-letter entry): its first write is refused, and
// nothing of it is written. A settlement that acknowledges drains: its
// XACK needs no memory and comes first, after which the script may
// finish its writes (settle.lua). A Cleared settlement's retention needs
// memory and is refused; a hash leaked before is repaired by
// RetainLeaked once memory is free.
func TestOutOfMemoryFailsClosed(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	ctx := t.Context()
	f := leakFixture{t: t, c: c, stream: "events"}
	claimKey := f.message("relay", false, 0) // pending, hash {app/handler: ok}
	ackKey := f.message("relay", false, 0)
	dropKey := f.message("relay", false, 0)
	runKey := f.message("relay", false, 0)
	leakKey := f.message("relay", true, 0)    // acknowledged without its retention
	clearedKey := f.message("relay", true, 0) // its reference cleared, its retention not applied yet
	lease := invocation.Lease{Key: runKey, Field: "app/other", Attempt: 1, Token: "tok"}
	(&env{c: c, hash: hashOf(runKey)}).seed(t, map[string]string{lease.Field: running(9999999999999, 1, "tok")}, 0)
	runState := map[string]string{testField: "ok", lease.Field: running(9999999999999, 1, "tok")}
	free := outOfMemory(t, c)

	for _, probe := range []bool{false, true} {
		_, err := claimOne(ctx, s, invocation.ClaimRequest{Key: claimKey, Field: "app/other", Lease: time.Minute, MaxAttempts: 5, Probe: probe})
		if !isOOM(err) {
			t.Fatalf("Claim (probe %v) on a full Redis: %v, want an OOM error", probe, err)
		}
	}
	if got, pttl := hashState(t, c, claimKey); !cmp.Equal(got, map[string]string{testField: "ok"}) || pttl != -1 {
		t.Errorf("hash after the refused claim: %v (PTTL %d), want it unchanged", got, pttl)
	}
	if pending(t, c, claimKey) != 1 {
		t.Errorf("the message of the refused claim is not pending")
	}

	for name, st := range map[string]invocation.Settlement{
		"retry":   one(invocation.Retry, lease),
		"release": one(invocation.Release, lease),
		"exhaust": one(invocation.Exhaust, lease),
	} {
		if err := apply(ctx, s, st); !isOOM(err) {
			t.Errorf("%s on a full Redis: %v, want an OOM error", name, err)
		}
	}
	if got, pttl := hashState(t, c, runKey); !cmp.Equal(got, runState) || pttl != -1 || pending(t, c, runKey) != 1 {
		t.Errorf("after the refused settlements: hash %v (PTTL %d), pending %d; want it unchanged and pending", got, pttl, pending(t, c, runKey))
	}
	if got := dlqEntries(t, c, f.stream); len(got) != 0 {
		t.Errorf("a refused exhaust wrote dead-letter entries %v", got)
	}

	if err := apply(ctx, s, ack(ackKey, time.Hour)); err != nil {
		t.Fatalf("Ack with retention 1h on a full Redis = %v; want it done", err)
	}
	got, pttl := hashState(t, c, ackKey)
	if pending(t, c, ackKey) != 0 || !cmp.Equal(got, map[string]string{testField: "ok", terminalField: "1"}) {
		t.Errorf("after the Ack on a full Redis: pending %d, hash %v; want it acknowledged and retained", pending(t, c, ackKey), got)
	}
	checkPTTL(t, time.Hour, pttl)
	if err := apply(ctx, s, ack(dropKey, 0)); err != nil {
		t.Fatalf("Ack with retention 0 on a full Redis = %v; want it done", err)
	}
	if got, _ := hashState(t, c, dropKey); pending(t, c, dropKey) != 0 || len(got) != 0 {
		t.Errorf("after Ack with retention 0: pending %d, hash %v; want neither", pending(t, c, dropKey), got)
	}
	if err := apply(ctx, s, invocation.Settlement{Key: clearedKey, Cleared: true, Retention: time.Hour}); !isOOM(err) {
		t.Errorf("Cleared with retention 1h on a full Redis: %v, want an OOM error", err)
	}
	if got, pttl := hashState(t, c, clearedKey); !cmp.Equal(got, map[string]string{testField: "ok"}) || pttl != -1 {
		t.Errorf("hash after the refused Cleared: %v (PTTL %d), want it unchanged", got, pttl)
	}
	if _, err := s.RetainLeaked(ctx, f.stream, "relay", 0, 100, time.Hour); !isOOM(err) {
		t.Errorf("RetainLeaked on a full Redis: %v, want an OOM error", err)
	}

	free()
	if sum := pass(t, s, f.stream, "relay", 100, time.Hour); sum.Retained != 2 || sum.Pending != 2 {
		t.Errorf("pass after memory was freed = %+v; want the leaks retained, the pending ones left", sum)
	}
	for _, k := range []invocation.Key{leakKey, clearedKey} {
		got, pttl := hashState(t, c, k)
		if got[terminalField] != "1" {
			t.Errorf("leaked hash %v, want retained", got)
		}
		checkPTTL(t, time.Hour, pttl)
	}
	if cl, err := claimOne(ctx, s, invocation.ClaimRequest{Key: claimKey, Field: "app/other", Lease: time.Minute, MaxAttempts: 5}); err != nil || cl.Status != invocation.Claimed {
		t.Errorf("Claim after memory was freed = %+v, %v; want Claimed", cl, err)
	}
}

// TestOutOfMemoryAcknowledgingSettlementDrains: on a Redis at maxmemory a claimed
// attempt's success, or its exhaustion with its dead-letter entry, still
// settles at either retention: the XACK, which needs no memory, is the
// script's first write, and a script that has written finishes
// (docs/delivery.md#claim-errors-fail-closed). So a full Redis drains its
// running work rather than holding it pending.
func TestOutOfMemoryAcknowledgingSettlementDrains(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	ctx := t.Context()
	stream, group := "events", "g"
	ids := []string{"1-1", "1-2", "1-3", "1-4"}
	deliver(t, c, stream, group, ids...)
	var leases []invocation.Lease
	for _, id := range ids {
		cl, err := claimOne(ctx, s, invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: id}, Field: testField, Lease: time.Minute, MaxAttempts: 3})
		if err != nil || cl.Status != invocation.Claimed {
			t.Fatalf("claim %s: %+v %v", id, cl, err)
		}
		leases = append(leases, cl.Lease)
	}
	free := outOfMemory(t, c)
	defer free()
	if _, err := claimOne(ctx, s, invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: "1-1"}, Field: "app/other", Lease: time.Minute, MaxAttempts: 3}); !isOOM(err) {
		t.Fatalf("Claim on a full Redis: %v, want an OOM error (the fixture is not full)", err)
	}
	if err := apply(ctx, s, acked(one(invocation.Finish, leases[0]), time.Hour)); err != nil {
		t.Fatalf("Finish and Ack with retention 1h on a full Redis: %v; want it done", err)
	}
	if got, pttl := hashState(t, c, leases[0].Key); got[testField] != "ok" || got[terminalField] != "1" || pttl <= 0 {
		t.Errorf("after Finish and Ack on a full Redis: hash %v PTTL %d; want ok and retained", got, pttl)
	}
	if err := apply(ctx, s, acked(one(invocation.Finish, leases[1]), 0)); err != nil {
		t.Fatalf("Finish and Ack with retention 0 on a full Redis: %v; want it done", err)
	}
	if got, _ := hashState(t, c, leases[1].Key); len(got) != 0 {
		t.Errorf("after Finish and Ack with retention 0: hash %v; want none", got)
	}
	// Two in one call: the first one's XACK lets the second write.
	rs := s.Settle(ctx, []invocation.Settlement{acked(one(invocation.Exhaust, leases[2]), time.Hour), acked(one(invocation.Finish, leases[3]), time.Hour)})
	for i, r := range rs {
		if r.Err != nil {
			t.Fatalf("settlement %d of the batch on a full Redis: %v; want it done", i, r.Err)
		}
	}
	if got, _ := hashState(t, c, leases[2].Key); got[testField] != dead(leases[2].Attempt, leases[2].Token) {
		t.Errorf("after Exhaust and Ack on a full Redis: hash %v; want the entry marked written", got)
	}
	if _, got := withoutIDs(dlqEntries(t, c, stream)); !cmp.Equal([]dlq.Entry{stored(leases[2])}, got) {
		t.Errorf("dead-letter entries %+v, want the exhausted one", got)
	}
	if ids := pendingIDs(t, c, leases[0].Key); len(ids) != 0 {
		t.Errorf("pending after all settled: %v", ids)
	}
}

// TestOutOfMemoryBatchDrains: on a Redis at maxmemory, a settlement that
// acknowledges drains even behind one that does not in the same batch
// (a retry, whose first write alone Redis would refuse): the batch does
// not fail as a whole, and the retry either applies or fails with the OOM
// error without changing anything.
func TestOutOfMemoryBatchDrains(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	ctx := t.Context()
	stream, group := "events", "g"
	ids := []string{"1-1", "1-2", "1-3"}
	deliver(t, c, stream, group, ids...)
	var reqs []invocation.ClaimRequest
	for _, id := range ids {
		reqs = append(reqs, invocation.ClaimRequest{Key: invocation.Key{Stream: stream, Group: group, MessageID: id}, Field: testField, Lease: time.Minute, MaxAttempts: 3})
	}
	var leases []invocation.Lease
	for i, cl := range s.Claim(ctx, reqs) {
		if cl.Err != nil || cl.Status != invocation.Claimed {
			t.Fatalf("claim %d: %+v", i, cl)
		}
		leases = append(leases, cl.Lease)
	}
	before, _ := hashState(t, c, leases[0].Key)
	free := outOfMemory(t, c)
	defer free()
	rs := s.Settle(ctx, []invocation.Settlement{one(invocation.Retry, leases[0]), acked(one(invocation.Finish, leases[1]), time.Hour), acked(one(invocation.Exhaust, leases[2]), 0)})
	for i, r := range rs[1:] {
		if r.Err != nil {
			t.Errorf("acknowledging settlement %d behind a retry on a full Redis: %v; want it done", i+1, r.Err)
		}
	}
	if got, _ := hashState(t, c, leases[1].Key); got[testField] != "ok" || got[terminalField] != "1" {
		t.Errorf("after Finish and Ack on a full Redis: hash %v; want ok and retained", got)
	}
	if got, _ := hashState(t, c, leases[2].Key); len(got) != 0 {
		t.Errorf("after Exhaust and Ack at retention 0 on a full Redis: hash %v; want none", got)
	}
	if diff := cmp.Diff([]string{leases[0].Key.MessageID}, pendingIDs(t, c, leases[0].Key)); diff != "" {
		t.Errorf("pending (-want +got):\n%s", diff)
	}
	got, _ := hashState(t, c, leases[0].Key)
	switch err := rs[0].Err; {
	case err == nil:
		if want := nextAt(rs[0].Transitions[0].Next.UnixMilli(), leases[0].Attempt, leases[0].Token); got[testField] != want {
			t.Errorf("applied retry stored %q, want %q", got[testField], want)
		}
	case isOOM(err):
		if diff := cmp.Diff(before, got); diff != "" {
			t.Errorf("a retry refused for memory changed the hash (-before +after):\n%s", diff)
		}
	default:
		t.Errorf("retry on a full Redis: %v, want it applied or an OOM error", err)
	}
}
