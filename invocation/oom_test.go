package invocation

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
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
// pending (docs/delivery.md#claim-errors-fail-closed). Settle in that
// state fails before its XACK when retaining would need memory, so the
// message stays pending with its state; with retention 0 it deletes and
// acknowledges (neither needs memory). A hash leaked before is repaired
// by RetainLeaked once memory is free.
func TestOutOfMemoryFailsClosed(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	ctx := t.Context()
	f := leakFixture{t: t, c: c, stream: "events"}
	claimKey := f.message("relay", false, 0) // pending, hash {app/handler: ok}
	ackKey := f.message("relay", false, 0)
	dropKey := f.message("relay", false, 0)
	leakKey := f.message("relay", true, 0) // acknowledged without its retention
	free := outOfMemory(t, c)

	_, err := s.Claim(ctx, claimKey, "app/other", time.Minute, 5, Record{})
	if !isOOM(err) {
		t.Fatalf("Claim on a full Redis: %v, want an OOM error", err)
	}
	if got, pttl := hashState(t, c, claimKey); !cmp.Equal(got, map[string]string{testField: "ok"}) || pttl != -1 {
		t.Errorf("hash after the refused claim: %v (PTTL %d), want it unchanged", got, pttl)
	}
	if pending(t, c, claimKey) != 1 {
		t.Errorf("the message of the refused claim is not pending")
	}

	if ackErr, _ := s.Settle(ctx, ackKey, time.Hour); !isOOM(ackErr) {
		t.Fatalf("Settle on a full Redis = %v; want an OOM error", ackErr)
	}
	if got, pttl := hashState(t, c, ackKey); pending(t, c, ackKey) != 1 || len(got) != 1 || pttl != -1 {
		t.Fatalf("after the refused Settle: pending %d, hash %v PTTL %d; want it pending and unchanged", pending(t, c, ackKey), got, pttl)
	}
	if ackErr, retainErr := s.Settle(ctx, dropKey, 0); ackErr != nil || retainErr != nil {
		t.Fatalf("Settle with retention 0 on a full Redis = %v, %v; want it done", ackErr, retainErr)
	}
	if got, _ := hashState(t, c, dropKey); pending(t, c, dropKey) != 0 || len(got) != 0 {
		t.Errorf("after Settle with retention 0: pending %d, hash %v; want neither", pending(t, c, dropKey), got)
	}
	if _, err := s.RetainLeaked(ctx, f.stream, "relay", 0, 100, time.Hour); !isOOM(err) {
		t.Errorf("RetainLeaked on a full Redis: %v, want an OOM error", err)
	}

	free()
	if sum := pass(t, s, f.stream, "relay", 100, time.Hour); sum.Retained != 1 || sum.Pending != 2 {
		t.Errorf("pass after memory was freed = %+v; want the leak retained, the pending ones left", sum)
	}
	got, pttl := hashState(t, c, leakKey)
	if got[terminalField] != "1" {
		t.Errorf("leaked hash %v, want retained", got)
	}
	checkPTTL(t, time.Hour, pttl)
	if cl, err := s.Claim(ctx, claimKey, "app/other", time.Minute, 5, Record{}); err != nil || cl.Status != Claimed {
		t.Errorf("Claim after memory was freed = %+v, %v; want Claimed", cl, err)
	}
}

// TestOutOfMemoryFinishSettleDrains: on a Redis at maxmemory a claimed
// attempt's success still settles at either retention: the XACK, which
// needs no memory, is the script's first write, and a script that has
// written finishes (docs/delivery.md#claim-errors-fail-closed). So a full
// Redis drains its running work rather than holding it pending.
func TestOutOfMemoryFinishSettleDrains(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	ctx := t.Context()
	stream, group := "events", "g"
	deliver(t, c, stream, group, "1-1", "1-2")
	var leases []Lease
	for _, id := range []string{"1-1", "1-2"} {
		cl, err := s.Claim(ctx, Key{Stream: stream, Group: group, MessageID: id}, testField, time.Minute, 3, Record{})
		if err != nil || cl.Status != Claimed {
			t.Fatalf("claim %s: %+v %v", id, cl, err)
		}
		leases = append(leases, cl.Lease)
	}
	free := outOfMemory(t, c)
	defer free()
	if _, err := s.Claim(ctx, Key{Stream: stream, Group: group, MessageID: "1-1"}, "app/other", time.Minute, 3, Record{}); !isOOM(err) {
		t.Fatalf("Claim on a full Redis: %v, want an OOM error (the fixture is not full)", err)
	}
	if err := s.FinishSettle(ctx, leases[0], time.Hour); err != nil {
		t.Fatalf("FinishSettle with retention 1h on a full Redis: %v; want it done", err)
	}
	if got, pttl := hashState(t, c, leases[0].Key); got[testField] != "ok" || got[terminalField] != "1" || pttl <= 0 {
		t.Errorf("after FinishSettle on a full Redis: hash %v PTTL %d; want ok and retained", got, pttl)
	}
	if err := s.FinishSettle(ctx, leases[1], 0); err != nil {
		t.Fatalf("FinishSettle with retention 0 on a full Redis: %v; want it done", err)
	}
	if got, _ := hashState(t, c, leases[1].Key); len(got) != 0 {
		t.Errorf("after FinishSettle with retention 0: hash %v; want none", got)
	}
	if ids := pendingIDs(t, c, leases[0].Key); len(ids) != 0 {
		t.Errorf("pending after both settled: %v", ids)
	}
}
