package redisstate

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/topology"
	"github.com/relaydev/relay/invocation"
)

// leakFixture is one stream with messages of one or more groups whose
// hashes are seeded in a chosen state.
type leakFixture struct {
	t      *testing.T
	c      rueidis.Client
	stream string
}

// message adds an entry, delivers it to group (created from 0 when
// missing) and, when acked, acknowledges it; it then seeds the message's
// hash with one finished invocation and, when ttl > 0, a TTL. It returns
// the message's key.
func (f leakFixture) message(group string, acked bool, ttl time.Duration) invocation.Key {
	f.t.Helper()
	ctx := f.t.Context()
	c := f.c
	if err := c.Do(ctx, c.B().XgroupCreate().Key(f.stream).Group(group).Id("$").Mkstream().Build()).Error(); err != nil && !rueidis.IsRedisBusyGroup(err) {
		f.t.Fatal(err)
	}
	id, err := c.Do(ctx, c.B().Xadd().Key(f.stream).Id("*").FieldValue().FieldValue("event", "{}").Build()).ToString()
	if err != nil {
		f.t.Fatal(err)
	}
	key := invocation.Key{Stream: f.stream, Group: group, MessageID: id}
	cmds := rueidis.Commands{
		c.B().Xreadgroup().Group(group, "c1").Count(1).Streams().Key(f.stream).Id(">").Build(),
		c.B().Hset().Key(hashOf(key)).FieldValue().FieldValue(testField, "ok").Build(),
	}
	if acked {
		cmds = append(cmds, c.B().Xack().Key(f.stream).Group(group).Id(id).Build())
	}
	if ttl > 0 {
		cmds = append(cmds, c.B().Pexpire().Key(hashOf(key)).Milliseconds(ttl.Milliseconds()).Build())
	}
	for _, r := range c.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			f.t.Fatal(err)
		}
	}
	return key
}

// pass runs RetainLeaked from cursor 0 until it reports Done and adds up
// the counts.
func pass(t *testing.T, s *Store, stream, group string, count int, ttl time.Duration) LeakScan {
	t.Helper()
	var sum LeakScan
	var cursor uint64
	for calls := 0; ; calls++ {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		r, err := s.RetainLeaked(ctx, stream, group, cursor, count, ttl)
		cancel()
		if err != nil {
			t.Fatalf("RetainLeaked after %d calls: %v", calls, err)
		}
		if r.Keys <= 0 {
			t.Errorf("RetainLeaked reports %d keys on the node", r.Keys)
		}
		sum.Seen += r.Seen
		sum.Retained += r.Retained
		sum.Pending += r.Pending
		sum.NoGroup += r.NoGroup
		if r.Done {
			if r.Cursor != 0 {
				t.Errorf("Done with cursor %d", r.Cursor)
			}
			return sum
		}
		if calls > 100000 {
			t.Fatal("RetainLeaked never finished its pass")
		}
		cursor = r.Cursor
	}
}

// TestRetainLeaked: one pass gives the hash of an acknowledged message
// without a TTL its retention, and leaves alone the hash of a pending
// message, a retained hash, another group's leak and another stream's
// leak, even one whose name the pattern's glob would match unescaped.
func TestRetainLeaked(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	s := New(c)
	base := redistest.Name(t, "s")
	f := leakFixture{t: t, c: c, stream: base + "[x]*"}
	decoy := leakFixture{t: t, c: c, stream: base + "x-decoy"} // matched by base+"[x]*" as a glob

	leak := f.message("relay", true, 0)
	live := f.message("relay", false, 0)
	kept := f.message("relay", true, time.Hour)
	otherLeak := f.message("audit", true, 0)
	decoyLeak := decoy.message("relay", true, 0)

	const ttl = 7 * 24 * time.Hour
	sum := pass(t, s, f.stream, "relay", 200, ttl)
	if sum.Retained != 1 || sum.Pending < 1 || sum.NoGroup != 0 || sum.Seen < 3 {
		t.Errorf("pass = %+v; want 1 retained, the pending one seen, at least 3 seen", sum)
	}
	for _, k := range []struct {
		key  invocation.Key
		want map[string]string
		pttl time.Duration
	}{
		{leak, map[string]string{testField: "ok", terminalField: "1"}, ttl},
		{live, map[string]string{testField: "ok"}, ttlNone},
		{kept, map[string]string{testField: "ok"}, ttlHour},
		{otherLeak, map[string]string{testField: "ok"}, ttlNone},
		{decoyLeak, map[string]string{testField: "ok"}, ttlNone},
	} {
		got, pttl := hashState(t, c, k.key)
		if diff := cmp.Diff(k.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", hashOf(k.key), diff)
		}
		checkPTTL(t, k.pttl, pttl)
	}

	// Nothing is left to repair; the other group's pass finds its own.
	if sum := pass(t, s, f.stream, "relay", 200, ttl); sum.Retained != 0 {
		t.Errorf("second pass = %+v; want nothing retained", sum)
	}
	if sum := pass(t, s, f.stream, "audit", 200, ttl); sum.Retained != 1 {
		t.Errorf("audit's pass = %+v; want 1 retained", sum)
	}
}

// TestRetainLeakedDeletes: with retention 0 a pass deletes the hash of an
// acknowledged message left without a TTL, and leaves alone a pending
// message's hash and a hash retained under an earlier retention.
func TestRetainLeakedDeletes(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	s := New(c)
	f := leakFixture{t: t, c: c, stream: redistest.Name(t, "s")}
	leak := f.message("relay", true, 0)
	live := f.message("relay", false, 0)
	kept := f.message("relay", true, time.Hour)
	if sum := pass(t, s, f.stream, "relay", 200, 0); sum.Retained != 1 || sum.Pending != 1 {
		t.Errorf("pass = %+v; want 1 deleted, 1 pending", sum)
	}
	for _, k := range []struct {
		key  invocation.Key
		want map[string]string
		pttl time.Duration
	}{
		{leak, map[string]string{}, ttlNoKey},
		{live, map[string]string{testField: "ok"}, ttlNone},
		{kept, map[string]string{testField: "ok"}, ttlHour},
	} {
		got, pttl := hashState(t, c, k.key)
		if diff := cmp.Diff(k.want, got); diff != "" {
			t.Errorf("%s (-want +got):\n%s", hashOf(k.key), diff)
		}
		checkPTTL(t, k.pttl, pttl)
	}
}

// TestRetainLeakedRefuses bad arguments without touching anything.
func TestRetainLeakedRefuses(t *testing.T) {
	c := redistest.Client(t)
	s := New(c)
	f := leakFixture{t: t, c: c, stream: redistest.Name(t, "s")}
	leak := f.message("relay", true, 0)
	for name, call := range map[string]func() (LeakScan, error){
		"count 0":  func() (LeakScan, error) { return s.RetainLeaked(t.Context(), f.stream, "relay", 0, 0, time.Hour) },
		"ttl < 0":  func() (LeakScan, error) { return s.RetainLeaked(t.Context(), f.stream, "relay", 0, 10, -time.Second) },
		"no group": func() (LeakScan, error) { return s.RetainLeaked(t.Context(), f.stream, "", 0, 10, time.Hour) },
	} {
		if _, err := call(); err == nil {
			t.Errorf("%s: RetainLeaked succeeded", name)
		}
	}
	if _, pttl := hashState(t, c, leak); pttl != -1 {
		t.Errorf("PTTL %d after refused calls, want -1", pttl)
	}
}

// TestRetainLeakedCluster: on a 3-master Redis Cluster each stream's
// pass runs on the node that owns its hash tag, so leaks of streams
// spread over every node are all repaired; a stream without a hash tag
// is refused.
func TestRetainLeakedCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	s := New(c)
	owners := map[string]bool{}
	var leaks []invocation.Key
	for i := range 9 {
		f := leakFixture{t: t, c: c, stream: "{" + redistest.Name(t, "tag", string(rune('a'+i))) + "}"}
		leaks = append(leaks, f.message("relay", true, 0))
		f.message("relay", false, 0) // a pending one, left alone
		owners[nodeOf(t, c, f.stream)] = true
	}
	if len(owners) < 2 {
		t.Logf("the streams landed on %d node(s) only", len(owners))
	}
	for _, k := range leaks {
		if sum := pass(t, s, k.Stream, "relay", 100, time.Hour); sum.Retained != 1 || sum.Pending != 1 {
			t.Errorf("%s: pass = %+v; want 1 retained and 1 pending", k.Stream, sum)
		}
		got, pttl := hashState(t, c, k)
		if got[terminalField] != "1" {
			t.Errorf("%s: hash %v, want retained", hashOf(k), got)
		}
		checkPTTL(t, time.Hour, pttl)
	}

	_, err := s.RetainLeaked(t.Context(), redistest.Name(t, "untagged"), "relay", 0, 100, time.Hour)
	if err == nil || !strings.Contains(err.Error(), "has no hash tag") {
		t.Errorf("RetainLeaked on an untagged stream: %v, want a hash tag error", err)
	}
}

// nodeOf returns the address of the master that serves key, as MOVED
// names it or, when it answers, the node itself.
func nodeOf(t *testing.T, c rueidis.Client, key string) string {
	t.Helper()
	for addr, n := range c.Nodes() {
		err := n.Do(t.Context(), n.B().Exists().Key(key).Build()).Error()
		if err == nil {
			return addr
		}
		if to, ok := rueidis.IsRedisErr(err); ok {
			if moved, ok := to.IsMoved(); ok {
				return moved
			}
		}
	}
	t.Fatalf("no node serves %s", key)
	return ""
}
