package invocation

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/topology"
)

// pendingMessage adds one entry to key.Stream, delivers it to a consumer
// of key.Group so that it is pending, and returns key with its id.
func pendingMessage(t *testing.T, c rueidis.Client, key Key) Key {
	t.Helper()
	ctx := t.Context()
	if err := c.Do(ctx, c.B().XgroupCreate().Key(key.Stream).Group(key.Group).Id("0").Mkstream().Build()).Error(); err != nil {
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
	if n := pending(t, c, key); n != 1 {
		t.Fatalf("setup: %d entries pending, want 1", n)
	}
	return key
}

func pending(t *testing.T, c rueidis.Client, key Key) int64 {
	t.Helper()
	summary, err := c.Do(t.Context(), c.B().Xpending().Key(key.Stream).Group(key.Group).Build()).ToArray()
	if err != nil || len(summary) == 0 {
		t.Fatalf("XPENDING: %v", err)
	}
	n, err := summary[0].AsInt64()
	if err != nil {
		t.Fatalf("XPENDING count: %v", err)
	}
	return n
}

func hashState(t *testing.T, c rueidis.Client, key Key) (map[string]string, int64) {
	t.Helper()
	e := &env{c: c, hash: hashOf(key)}
	return e.state(t)
}

// TestSettleSHA pins the digest Settle sends in EVALSHA to the one
// Redis computes for retain.lua as the Store loads it.
func TestSettleSHA(t *testing.T) {
	c := redistest.Client(t)
	sha, err := c.Do(t.Context(), c.B().ScriptLoad().Script(withHelpers(scriptSources["retain.lua"])).Build()).ToString()
	if err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	if sha != retainSHA {
		t.Errorf("retainSHA = %s, SCRIPT LOAD says %s", retainSHA, sha)
	}
}

// TestSettle: the message leaves the PEL and its hash keeps its fields
// and gains __terminal and the TTL, as XACK followed by Retain would leave
// them; a repeated call changes nothing, TTL included.
func TestSettle(t *testing.T) {
	e := newEnv(t, "")
	key := pendingMessage(t, e.c, e.key)
	e.key, e.hash = key, hashOf(key)
	e.seed(t, map[string]string{testField: "ok"}, 0)

	ackErr, retainErr := e.s.Settle(t.Context(), key, time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("Settle = %v, %v", ackErr, retainErr)
	}
	if n := pending(t, e.c, key); n != 0 {
		t.Errorf("%d entries pending after Settle, want 0", n)
	}
	got, pttl := e.state(t)
	if diff := cmp.Diff(map[string]string{testField: "ok", terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)

	ackErr, retainErr = e.s.Settle(t.Context(), key, 2*time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("second Settle = %v, %v", ackErr, retainErr)
	}
	_, again := e.state(t)
	checkPTTL(t, time.Hour, again) // the running TTL is kept, not extended
}

// TestSettleWithoutScriptCache: after SCRIPT FLUSH (a restarted server)
// the EVALSHA fails with NOSCRIPT and the retain is sent again in full.
func TestSettleWithoutScriptCache(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	key := pendingMessage(t, c, Key{Stream: redistest.Name(t, "stream"), Group: "group"})
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	ackErr, retainErr := s.Settle(t.Context(), key, time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("Settle = %v, %v", ackErr, retainErr)
	}
	if n := pending(t, c, key); n != 0 {
		t.Errorf("%d entries pending, want 0", n)
	}
	got, pttl := hashState(t, c, key)
	if diff := cmp.Diff(map[string]string{terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)
}

// TestSettleWrongType: an XACK error reply is ackErr. The pipelined
// retain has run anyway (documented on Settle): a key that holds no
// stream holds no PEL either.
func TestSettleWrongType(t *testing.T) {
	e := newEnv(t, "")
	if err := e.c.Do(t.Context(), e.c.B().Set().Key(e.key.Stream).Value("not a stream").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	ackErr, retainErr := e.s.Settle(t.Context(), e.key, time.Hour)
	if ackErr == nil {
		t.Fatalf("Settle on a string key: ackErr = nil, want WRONGTYPE")
	}
	if retainErr != nil {
		t.Errorf("retainErr = %v, want nil when the ack failed", retainErr)
	}
	got, _ := e.state(t)
	if diff := cmp.Diff(map[string]string{terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
}

// TestSettleUnknownGroup: Redis acknowledges ids of a group it does not
// know with 0, so this is no error; the hash is retained.
func TestSettleUnknownGroup(t *testing.T) {
	e := newEnv(t, "")
	ackErr, retainErr := e.s.Settle(t.Context(), e.key, time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("Settle = %v, %v", ackErr, retainErr)
	}
	got, pttl := e.state(t)
	if diff := cmp.Diff(map[string]string{terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)
}

func TestSettleInvalidTTL(t *testing.T) {
	e := newEnv(t, "")
	ackErr, retainErr := e.s.Settle(t.Context(), e.key, 0)
	if ackErr == nil || retainErr == nil {
		t.Fatalf("Settle with ttl 0 = %v, %v; want both errors", ackErr, retainErr)
	}
	if got, pttl := e.state(t); len(got) != 0 || pttl != -2 {
		t.Errorf("hash after a refused call: %v (PTTL %d), want none", got, pttl)
	}
}

// TestSettleCluster runs Settle on Redis Cluster for a stream with a
// hash tag, whose hash shares its slot (one pipeline), and for one without,
// whose hash lives elsewhere (XACK, then the retain): both end acknowledged
// and retained.
func TestSettleCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	s := New(c)
	for _, name := range []string{"{" + redistest.Name(t, "tagged") + "}", redistest.Name(t, "untagged")} {
		key := pendingMessage(t, c, Key{Stream: name, Group: "group"})
		t.Logf("stream %s: hash in the same slot: %v", name, slot(t, c, key.Stream) == slot(t, c, keys.Invocation(key.Stream, key.Group, key.MessageID)))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		ackErr, retainErr := s.Settle(ctx, key, time.Hour)
		cancel()
		if ackErr != nil || retainErr != nil {
			t.Fatalf("%s: Settle = %v, %v", name, ackErr, retainErr)
		}
		if n := pending(t, c, key); n != 0 {
			t.Errorf("%s: %d entries pending, want 0", name, n)
		}
		got, pttl := hashState(t, c, key)
		if diff := cmp.Diff(map[string]string{terminalField: "1"}, got); diff != "" {
			t.Errorf("%s: hash (-want +got):\n%s", name, diff)
		}
		checkPTTL(t, time.Hour, pttl)
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

// TestFinishSettleScript: the last invocation's success, the XACK and the
// retention are one script. A running lease of this attempt and token
// finishes, leaves the PEL and gets the TTL; a stale lease or a retained
// hash changes nothing and acknowledges nothing.
func TestFinishSettleScript(t *testing.T) {
	for _, tc := range []struct {
		name    string
		seed    func(l Lease) map[string]string
		wantErr error
	}{
		{"running", func(l Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt, l.Token), "other/done": "ok"}
		}, nil},
		{"expired lease nobody took", func(l Lease) map[string]string {
			return map[string]string{l.Field: running(1, l.Attempt, l.Token)}
		}, nil},
		{"another token", func(l Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt, "other")}
		}, ErrStale},
		{"another attempt", func(l Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt+1, l.Token)}
		}, ErrStale},
		{"already ok", func(l Lease) map[string]string { return map[string]string{l.Field: "ok"} }, ErrStale},
		{"no state", func(Lease) map[string]string { return nil }, ErrStale},
		{"retained", func(l Lease) map[string]string {
			return map[string]string{l.Field: running(9999999999999, l.Attempt, l.Token), terminalField: "1"}
		}, ErrTerminal},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, "")
			key := pendingMessage(t, e.c, e.key)
			l := Lease{Key: key, Field: testField, Attempt: 2, Token: "tok"}
			seeded := tc.seed(l)
			if seeded != nil {
				(&env{c: e.c, hash: hashOf(key)}).seed(t, seeded, 0)
			}
			err := e.s.FinishSettle(t.Context(), l, time.Hour)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("FinishSettle = %v, want %v", err, tc.wantErr)
			}
			st, pttl := hashState(t, e.c, key)
			if tc.wantErr != nil {
				if n := pending(t, e.c, key); n != 1 {
					t.Errorf("a refused FinishSettle acknowledged the message (%d pending)", n)
				}
				if seeded == nil {
					seeded = map[string]string{}
				}
				if diff := cmp.Diff(seeded, st); diff != "" {
					t.Errorf("a refused FinishSettle changed the hash (-want +got):\n%s", diff)
				}
				return
			}
			if n := pending(t, e.c, key); n != 0 {
				t.Errorf("%d entries pending after FinishSettle, want 0", n)
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
			if pttl <= 0 || pttl > int64(time.Hour/time.Millisecond) {
				t.Errorf("PTTL %d, want the retention of 1h", pttl)
			}
		})
	}
}
