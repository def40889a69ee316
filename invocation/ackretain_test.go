package invocation

import (
	"context"
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

// TestAckRetainSHA pins the digest AckRetain sends in EVALSHA to the one
// Redis computes for retain.lua as the Store loads it.
func TestAckRetainSHA(t *testing.T) {
	c := redistest.Client(t)
	sha, err := c.Do(t.Context(), c.B().ScriptLoad().Script(withHelpers(scriptSources["retain.lua"])).Build()).ToString()
	if err != nil {
		t.Fatalf("SCRIPT LOAD: %v", err)
	}
	if sha != retainSHA {
		t.Errorf("retainSHA = %s, SCRIPT LOAD says %s", retainSHA, sha)
	}
}

// TestAckRetain: the message leaves the PEL and its hash keeps its fields
// and gains __terminal and the TTL, as XACK followed by Retain would leave
// them; a repeated call changes nothing, TTL included.
func TestAckRetain(t *testing.T) {
	e := newEnv(t, "")
	key := pendingMessage(t, e.c, e.key)
	e.key, e.hash = key, hashOf(key)
	e.seed(t, map[string]string{testField: "ok"}, 0)

	ackErr, retainErr := e.s.AckRetain(t.Context(), key, time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("AckRetain = %v, %v", ackErr, retainErr)
	}
	if n := pending(t, e.c, key); n != 0 {
		t.Errorf("%d entries pending after AckRetain, want 0", n)
	}
	got, pttl := e.state(t)
	if diff := cmp.Diff(map[string]string{testField: "ok", terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)

	ackErr, retainErr = e.s.AckRetain(t.Context(), key, 2*time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("second AckRetain = %v, %v", ackErr, retainErr)
	}
	_, again := e.state(t)
	checkPTTL(t, time.Hour, again) // the running TTL is kept, not extended
}

// TestAckRetainWithoutScriptCache: after SCRIPT FLUSH (a restarted server)
// the EVALSHA fails with NOSCRIPT and the retain is sent again in full.
func TestAckRetainWithoutScriptCache(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	s := New(c)
	key := pendingMessage(t, c, Key{Stream: redistest.Name(t, "stream"), Group: "group"})
	if err := c.Do(t.Context(), c.B().ScriptFlush().Build()).Error(); err != nil {
		t.Fatalf("SCRIPT FLUSH: %v", err)
	}
	ackErr, retainErr := s.AckRetain(t.Context(), key, time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("AckRetain = %v, %v", ackErr, retainErr)
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

// TestAckRetainWrongType: an XACK error reply is ackErr. The pipelined
// retain has run anyway (documented on AckRetain): a key that holds no
// stream holds no PEL either.
func TestAckRetainWrongType(t *testing.T) {
	e := newEnv(t, "")
	if err := e.c.Do(t.Context(), e.c.B().Set().Key(e.key.Stream).Value("not a stream").Build()).Error(); err != nil {
		t.Fatalf("SET: %v", err)
	}
	ackErr, retainErr := e.s.AckRetain(t.Context(), e.key, time.Hour)
	if ackErr == nil {
		t.Fatalf("AckRetain on a string key: ackErr = nil, want WRONGTYPE")
	}
	if retainErr != nil {
		t.Errorf("retainErr = %v, want nil when the ack failed", retainErr)
	}
	got, _ := e.state(t)
	if diff := cmp.Diff(map[string]string{terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
}

// TestAckRetainUnknownGroup: Redis acknowledges ids of a group it does not
// know with 0, so this is no error; the hash is retained.
func TestAckRetainUnknownGroup(t *testing.T) {
	e := newEnv(t, "")
	ackErr, retainErr := e.s.AckRetain(t.Context(), e.key, time.Hour)
	if ackErr != nil || retainErr != nil {
		t.Fatalf("AckRetain = %v, %v", ackErr, retainErr)
	}
	got, pttl := e.state(t)
	if diff := cmp.Diff(map[string]string{terminalField: "1"}, got); diff != "" {
		t.Errorf("hash (-want +got):\n%s", diff)
	}
	checkPTTL(t, time.Hour, pttl)
}

func TestAckRetainInvalidTTL(t *testing.T) {
	e := newEnv(t, "")
	ackErr, retainErr := e.s.AckRetain(t.Context(), e.key, 0)
	if ackErr == nil || retainErr == nil {
		t.Fatalf("AckRetain with ttl 0 = %v, %v; want both errors", ackErr, retainErr)
	}
	if got, pttl := e.state(t); len(got) != 0 || pttl != -2 {
		t.Errorf("hash after a refused call: %v (PTTL %d), want none", got, pttl)
	}
}

// TestAckRetainCluster runs AckRetain on Redis Cluster for a stream with a
// hash tag, whose hash shares its slot (one pipeline), and for one without,
// whose hash lives elsewhere (XACK, then the retain): both end acknowledged
// and retained.
func TestAckRetainCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	s := New(c)
	for _, name := range []string{"{" + redistest.Name(t, "tagged") + "}", redistest.Name(t, "untagged")} {
		key := pendingMessage(t, c, Key{Stream: name, Group: "group"})
		t.Logf("stream %s: hash in the same slot: %v", name, slot(t, c, key.Stream) == slot(t, c, keys.Invocation(key.Stream, key.Group, key.MessageID)))
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		ackErr, retainErr := s.AckRetain(ctx, key, time.Hour)
		cancel()
		if ackErr != nil || retainErr != nil {
			t.Fatalf("%s: AckRetain = %v, %v", name, ackErr, retainErr)
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
