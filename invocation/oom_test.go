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
// state acknowledges (XACK may not grow memory) but cannot retain: the
// hash leaks, and RetainLeaked repairs it once memory is free.
func TestOutOfMemoryFailsClosed(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	ctx := t.Context()
	f := leakFixture{t: t, c: c, stream: "events"}
	claimKey := f.message("relay", false, 0) // pending, hash {app/handler: ok}
	ackKey := f.message("relay", false, 0)
	free := outOfMemory(t, c)

	_, err := s.Claim(ctx, claimKey, "app/other", time.Minute, 5, Record{})
	if !isOOM(err) {
		t.Fatalf("Claim on a full Redis: %v, want an OOM error", err)
	}
	if got, pttl := hashState(t, c, claimKey); !cmp.Equal(got, map[string]string{testField: "ok"}) || pttl != -1 {
		t.Errorf("hash after the refused claim: %v (PTTL %d), want it unchanged", got, pttl)
	}
	if n := pending(t, c, claimKey); n != 2 {
		t.Errorf("%d pending, want both messages", n)
	}

	ackErr, retainErr := s.Settle(ctx, ackKey, time.Hour)
	if ackErr != nil || !isOOM(retainErr) {
		t.Fatalf("Settle on a full Redis = %v, %v; want the XACK done and an OOM retain", ackErr, retainErr)
	}
	if _, pttl := hashState(t, c, ackKey); pttl != -1 {
		t.Fatalf("PTTL %d after the refused retain, want -1 (leaked)", pttl)
	}
	if _, err := s.RetainLeaked(ctx, f.stream, "relay", 0, 100, time.Hour); !isOOM(err) {
		t.Errorf("RetainLeaked on a full Redis: %v, want an OOM error", err)
	}

	free()
	if sum := pass(t, s, f.stream, "relay", 100, time.Hour); sum.Retained != 1 || sum.Pending != 1 {
		t.Errorf("pass after memory was freed = %+v; want the leak retained, the pending one left", sum)
	}
	got, pttl := hashState(t, c, ackKey)
	if got[terminalField] != "1" {
		t.Errorf("leaked hash %v, want retained", got)
	}
	checkPTTL(t, time.Hour, pttl)
	if cl, err := s.Claim(ctx, claimKey, "app/other", time.Minute, 5, Record{}); err != nil || cl.Status != Claimed {
		t.Errorf("Claim after memory was freed = %+v, %v; want Claimed", cl, err)
	}
}
