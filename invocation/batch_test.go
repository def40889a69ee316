package invocation

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/combine"
	"github.com/relaydev/relay/internal/redistest"
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

// pausedStore is a Store on a private redis-server that the test can pause
// (CLIENT PAUSE WRITE, which holds scripts but not INFO), so that calls pile up behind one in flight and the next
// batch is known, and whose script runs it can count.
type pausedStore struct {
	s     *Store
	c     rueidis.Client // the Store's client
	admin rueidis.Client // pauses and reads INFO; never paused
}

func newPausedStore(t *testing.T, opts ...Option) *pausedStore {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	return &pausedStore{s: New(c, opts...), c: c, admin: redistest.Connect(t, srv.Addr)}
}

func (p *pausedStore) pause(t *testing.T) {
	t.Helper()
	if err := p.admin.Do(t.Context(), p.admin.B().ClientPause().Timeout(30000).Write().Build()).Error(); err != nil {
		t.Fatalf("CLIENT PAUSE: %v", err)
	}
	t.Cleanup(func() { p.unpause(t) })
}

func (p *pausedStore) unpause(t *testing.T) {
	t.Helper()
	if err := p.admin.Do(context.Background(), p.admin.B().ClientUnpause().Build()).Error(); err != nil {
		t.Fatalf("CLIENT UNPAUSE: %v", err)
	}
}

// scriptRuns is how many EVALSHA and EVAL commands the server has run,
// not counting failed ones (the NOSCRIPT of a script's first EVALSHA).
func (p *pausedStore) scriptRuns(t *testing.T) int {
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

// waitFor polls until cond holds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestConcurrentClaimsShareScriptRuns: claims that arrive while one is in
// flight run together, up to the batch limit, and each gets the answer a
// claim of its own would have got.
func TestConcurrentClaimsShareScriptRuns(t *testing.T) {
	const limit, n = 4, 10
	p := newPausedStore(t, WithMaxBatch(limit))
	stream := "orders"
	key := func(i int) Key { return Key{Stream: stream, Group: "g", MessageID: fmt.Sprintf("1-%d", i)} }
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
	before := p.scriptRuns(t)

	p.pause(t)
	type result struct {
		c   Claim
		err error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	claim := func(i int) {
		wg.Go(func() {
			c, err := p.s.Claim(context.Background(), key(i), testField, time.Minute, 3, Record{Fields: []string{"app/other"}, Complete: true})
			results[i] = result{c, err}
		})
	}
	claim(0) // in flight, held by the pause
	waitFor(t, "the first claim to be in flight", func() bool { return p.s.claims.Pending(stream) == 1 })
	for i := 1; i < n; i++ {
		claim(i)
		waitFor(t, "claims to queue", func() bool { return p.s.claims.Pending(stream) == i+1 })
	}
	p.unpause(t)
	wg.Wait()

	// One run for the first claim, then batches of limit, limit, 1.
	if got, want := p.scriptRuns(t)-before, 4; got != want {
		t.Errorf("%d script runs for %d claims, want %d (batches of at most %d)", got, n, want, limit)
	}
	for i, r := range results {
		switch i {
		case 1:
			if r.err != nil || r.c.Status != Running {
				t.Errorf("claim %d (live lease) = %+v, %v; want Running", i, r.c, r.err)
			}
		case 2, 4:
			if r.err != nil || r.c.Status != Terminal {
				t.Errorf("claim %d (retained, or acknowledged) = %+v, %v; want Terminal", i, r.c, r.err)
			}
			if got, _ := hashState(t, p.c, key(4)); i == 4 && len(got) != 0 {
				t.Errorf("claim of an acknowledged message wrote %v", got)
			}
		case 3:
			if r.err == nil || !strings.Contains(r.err.Error(), `malformed state "garbage"`) {
				t.Errorf("claim %d (malformed) = %+v, %v; want the malformed-state error", i, r.c, r.err)
			}
		default:
			if r.err != nil || r.c.Status != Claimed || r.c.Lease.Attempt != 1 || r.c.Lease.Key != key(i) {
				t.Errorf("claim %d (fresh) = %+v, %v; want attempt 1 of its own key", i, r.c, r.err)
				continue
			}
			got, err := p.c.Do(t.Context(), p.c.B().Hgetall().Key(hashOf(key(i))).Build()).AsStrMap()
			if err != nil {
				t.Fatal(err)
			}
			wantRunning := fmt.Sprintf("running:%d:1:%s", r.c.Lease.Deadline.UnixMilli(), r.c.Lease.Token)
			if got[testField] != wantRunning || !strings.HasPrefix(got["app/other"], "next_attempt_at:") || got[matchedField] != "1" {
				t.Errorf("claim %d stored %v, want its own lease %s and its record", i, got, wantRunning)
			}
		}
	}
}

// TestConcurrentFinishSettlesShareOneScriptRun: the last successes of
// several messages that arrive together finish, acknowledge and retain each
// message in one script run; a stale lease among them changes nothing of
// its own.
func TestConcurrentFinishSettlesShareOneScriptRun(t *testing.T) {
	p := newPausedStore(t)
	stream, group := "{orders}", "g"
	if err := p.c.Do(t.Context(), p.c.B().XgroupCreate().Key(stream).Group(group).Id("0").Mkstream().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	const n = 6
	leases := make([]Lease, n)
	for i := range n {
		id, err := p.c.Do(t.Context(), p.c.B().Xadd().Key(stream).Id("*").FieldValue().FieldValue("event", "{}").Build()).ToString()
		if err != nil {
			t.Fatal(err)
		}
		key := Key{Stream: stream, Group: group, MessageID: id}
		deliver(t, p.c, stream, group)
		c, err := p.s.Claim(t.Context(), key, testField, time.Minute, 3, Record{})
		if err != nil || c.Status != Claimed {
			t.Fatalf("claim %d: %+v %v", i, c, err)
		}
		leases[i] = c.Lease
	}
	stale := leases[4]
	stale.Token = "someone-else"
	leases[4] = stale

	g := settleGroup{stream: stream, group: group, ttl: strconv.FormatInt(time.Hour.Milliseconds(), 10)}
	p.pause(t)
	errs := make([]error, n)
	var wg sync.WaitGroup
	settle := func(i int) {
		wg.Go(func() { errs[i] = p.s.FinishSettle(context.Background(), leases[i], time.Hour) })
	}
	settle(0)
	waitFor(t, "the first settlement to be in flight", func() bool { return p.s.settles.Pending(g) == 1 })
	for i := 1; i < n; i++ {
		settle(i)
		waitFor(t, "settlements to queue", func() bool { return p.s.settles.Pending(g) == i+1 })
	}
	before := p.scriptRuns(t)
	p.unpause(t)
	wg.Wait()
	if got := p.scriptRuns(t) - before; got != 2 {
		t.Errorf("%d script runs, want 2: the first settlement alone, then the rest together", got)
	}

	pel, err := p.c.Do(t.Context(), p.c.B().Xpending().Key(stream).Group(group).Start("-").End("+").Count(100).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var pendingIDs []string
	for _, e := range pel {
		row, _ := e.ToArray()
		id, _ := row[0].ToString()
		pendingIDs = append(pendingIDs, id)
	}
	if diff := cmp.Diff([]string{stale.Key.MessageID}, pendingIDs); diff != "" {
		t.Errorf("pending after the batch (-want +got):\n%s", diff)
	}
	for i, l := range leases {
		state, ttl := hashState(t, p.c, l.Key)
		if i == 4 {
			if !errors.Is(errs[i], ErrStale) || state["__terminal"] != "" || ttl != -1 {
				t.Errorf("stale lease: err %v, state %v ttl %d; want ErrStale and nothing changed", errs[i], state, ttl)
			}
			continue
		}
		if errs[i] != nil || state[testField] != "ok" || state["__terminal"] != "1" || ttl <= 0 {
			t.Errorf("message %d: err %v, state %v ttl %d; want ok, retained", i, errs[i], state, ttl)
		}
	}
}

// TestClaimBatchPELRangeFallsBack: a batch checks its claims' PEL entries
// with one XPENDING range (prelude.lua pel_set), which holds at most twice
// as many entries as the batch has claims; a claim whose id the range did
// not reach, because other pending entries filled it, is checked alone and
// claimed all the same.
func TestClaimBatchPELRangeFallsBack(t *testing.T) {
	p := newPausedStore(t, WithMaxBatch(2))
	stream := "orders"
	key := func(i int) Key { return Key{Stream: stream, Group: "g", MessageID: fmt.Sprintf("1-%d", i)} }
	ids := make([]string, 10)
	for i := range ids {
		ids[i] = key(i).MessageID
	}
	deliver(t, p.c, stream, "g", ids...)

	p.pause(t)
	results := make(map[int]Claim)
	errs := make(map[int]error)
	var mu sync.Mutex
	var wg sync.WaitGroup
	claim := func(i int) {
		wg.Go(func() {
			c, err := p.s.Claim(context.Background(), key(i), testField, time.Minute, 3, Record{})
			mu.Lock()
			results[i], errs[i] = c, err
			mu.Unlock()
		})
	}
	claim(5) // alone, in flight
	waitFor(t, "the first claim to be in flight", func() bool { return p.s.claims.Pending(stream) == 1 })
	claim(0)
	waitFor(t, "claims to queue", func() bool { return p.s.claims.Pending(stream) == 2 })
	claim(9) // 1-0 .. 1-9 holds ten entries; the range reads four
	waitFor(t, "claims to queue", func() bool { return p.s.claims.Pending(stream) == 3 })
	before := p.scriptRuns(t)
	p.unpause(t)
	wg.Wait()
	if got := p.scriptRuns(t) - before; got != 2 {
		t.Errorf("%d script runs, want 2: the first claim alone, then 1-0 and 1-9 together", got)
	}
	for _, i := range []int{0, 5, 9} {
		if errs[i] != nil || results[i].Status != Claimed {
			t.Errorf("claim of %s = %+v, %v; want Claimed", key(i).MessageID, results[i], errs[i])
		}
	}
}

// TestClaimBatchPELOfOneGroupAnswersForItAlone: the batch's XPENDING range
// is of its first claim's stream and group; a claim of the same message id
// in another group that acknowledged it is checked on its own, and stays
// inert (a Store shared by two groups of one stream batches their claims
// together).
func TestClaimBatchPELOfOneGroupAnswersForItAlone(t *testing.T) {
	p := newPausedStore(t)
	stream := "orders"
	deliver(t, p.c, stream, "a", "1-1", "1-2", "1-3")
	deliver(t, p.c, stream, "b")
	if err := p.c.Do(t.Context(), p.c.B().Xack().Key(stream).Group("b").Id("1-2").Build()).Error(); err != nil {
		t.Fatal(err) // group b is done with 1-2
	}
	p.pause(t)
	type res struct {
		c   Claim
		err error
	}
	var mu sync.Mutex
	got := map[string]res{}
	var wg sync.WaitGroup
	claim := func(group, id string) {
		wg.Go(func() {
			c, err := p.s.Claim(context.Background(), Key{Stream: stream, Group: group, MessageID: id}, testField, time.Minute, 3, Record{})
			mu.Lock()
			got[group+"/"+id] = res{c, err}
			mu.Unlock()
		})
	}
	claim("a", "1-3") // alone, in flight
	waitFor(t, "the first claim to be in flight", func() bool { return p.s.claims.Pending(stream) == 1 })
	for i, c := range [][2]string{{"a", "1-1"}, {"a", "1-2"}, {"b", "1-2"}} {
		claim(c[0], c[1])
		waitFor(t, "claims to queue", func() bool { return p.s.claims.Pending(stream) == i+2 })
	}
	p.unpause(t)
	wg.Wait()
	for _, k := range []string{"a/1-1", "a/1-2", "a/1-3"} {
		if r := got[k]; r.err != nil || r.c.Status != Claimed {
			t.Errorf("claim %s = %+v, %v; want Claimed", k, r.c, r.err)
		}
	}
	if r := got["b/1-2"]; r.err != nil || r.c.Status != Terminal {
		t.Errorf("claim b/1-2 (acknowledged by b, pending in a) = %+v, %v; want Terminal", r.c, r.err)
	}
	if st, _ := hashState(t, p.c, Key{Stream: stream, Group: "b", MessageID: "1-2"}); len(st) != 0 {
		t.Errorf("claim of an acknowledged message wrote %v", st)
	}
}

// TestFinishSettleBatch: FinishSettleBatch answers each lease as
// FinishSettle would, in script calls of at most WithMaxBatch leases, at
// either retention: a stale lease, a message acknowledged elsewhere and an
// invalid lease each get their own error and change nothing, and the
// others are finished, acknowledged and retained or deleted.
func TestFinishSettleBatch(t *testing.T) {
	for _, retention := range []time.Duration{time.Hour, 0} {
		t.Run(retention.String(), func(t *testing.T) {
			p := newPausedStore(t, WithMaxBatch(2))
			stream, group := "{orders}", "g"
			const n = 7
			leases := make([]Lease, n)
			ids := make([]string, n)
			for i := range n {
				ids[i] = fmt.Sprintf("1-%d", i+1)
			}
			deliver(t, p.c, stream, group, ids...)
			for i := range n {
				c, err := p.s.Claim(t.Context(), Key{Stream: stream, Group: group, MessageID: ids[i]}, testField, time.Minute, 3, Record{})
				if err != nil || c.Status != Claimed {
					t.Fatalf("claim %d: %+v %v", i, c, err)
				}
				leases[i] = c.Lease
			}
			leases[2].Token = "someone-else" // stale
			if err := p.c.Do(t.Context(), p.c.B().Xack().Key(stream).Group(group).Id(ids[4]).Build()).Error(); err != nil {
				t.Fatal(err) // acknowledged by another worker
			}
			leases[6].Attempt = 0 // invalid

			before := p.scriptRuns(t)
			errs := p.s.FinishSettleBatch(t.Context(), leases, retention)
			if got := p.scriptRuns(t) - before; got != 3 {
				t.Errorf("%d script runs for 6 valid leases in batches of 2, want 3", got)
			}
			if len(errs) != n {
				t.Fatalf("%d errors for %d leases", len(errs), n)
			}
			if diff := cmp.Diff([]string{ids[2], ids[6]}, pendingIDs(t, p.c, leases[0].Key)); diff != "" {
				t.Errorf("pending after the batch (-want +got):\n%s", diff)
			}
			for i, l := range leases {
				state, ttl := hashState(t, p.c, l.Key)
				switch i {
				case 2:
					if !errors.Is(errs[i], ErrStale) || state[testField] == "ok" || ttl != -1 {
						t.Errorf("stale lease: %v, state %v ttl %d; want ErrStale and nothing changed", errs[i], state, ttl)
					}
				case 4:
					if !errors.Is(errs[i], ErrTerminal) || state[testField] == "ok" {
						t.Errorf("lease of an acknowledged message: %v, state %v; want ErrTerminal and nothing changed", errs[i], state)
					}
				case 6:
					if errs[i] == nil || !strings.Contains(errs[i].Error(), "finish and settle "+testField) || state[testField] == "ok" {
						t.Errorf("invalid lease: %v, state %v; want its own error naming the field", errs[i], state)
					}
				default:
					switch {
					case errs[i] != nil:
						t.Errorf("lease %d: %v", i, errs[i])
					case retention == 0 && len(state) != 0:
						t.Errorf("lease %d: state %v left at retention 0", i, state)
					case retention > 0 && (state[testField] != "ok" || state["__terminal"] != "1" || ttl <= 0):
						t.Errorf("lease %d: state %v ttl %d; want ok and retained", i, state, ttl)
					}
				}
			}
		})
	}
}

// TestSplitClaimReplies: claim.lua's flat reply is cut at the lengths its
// codes fix, and a reply that does not hold exactly the batch's claims
// fails every claim of the batch rather than hand one a neighbour's reply.
func TestSplitClaimReplies(t *testing.T) {
	c := redistest.Client(t)
	run := func(lua string, n int) []combine.Result[reply] {
		return splitClaimReplies(rueidis.NewLuaScript(lua).Exec(t.Context(), c, nil, nil), n)
	}
	// One reply of every code.
	const nine = `return {9, 1700000000000, 7, 1, 2, 1700000000000, 'tp', 1, 4, 2, 5, 5, 2, 'tok', '', 0, 6, 2, 'tok', 'tp', 8, 'garbage', 3, 42}`
	got := run(nine, 9)
	wantCodes := []int64{9, 7, 1, 4, 2, 5, 6, 8, 3}
	wantLast := []string{"1700000000000", "7", "1", "4", "5", "0", "tp", "garbage", "42"}
	for i, r := range got {
		if r.Err != nil {
			t.Fatalf("claim %d: %v", i, r.Err)
		}
		last, err := r.Value.arr[len(r.Value.arr)-1].ToString()
		if err != nil {
			if n, ierr := r.Value.arr[len(r.Value.arr)-1].AsInt64(); ierr == nil {
				last, err = strconv.FormatInt(n, 10), nil
			}
		}
		if r.Value.code != wantCodes[i] || len(r.Value.arr) != claimReplyLen(wantCodes[i]) || err != nil || last != wantLast[i] {
			t.Errorf("claim %d: code %d, %d elements ending in %q (%v); want code %d, %d elements ending in %q",
				i, r.Value.code, len(r.Value.arr), last, err, wantCodes[i], claimReplyLen(wantCodes[i]), wantLast[i])
		}
	}

	for i, r := range run(nine, 8) {
		if r.Err == nil || !strings.Contains(r.Err.Error(), "left after 8 claims") {
			t.Errorf("9 replies for 8 claims, claim %d: %v, want every claim failed", i, r.Err)
		}
	}
	for _, bad := range []struct{ lua, why string }{
		{`return {9, 1, 99, 1}`, "unknown code"},
		{`return {9, 1, 'x'}`, "element 2"},
		{`return {9, 1, 1, 2}`, "wants 5 elements"},
		{`return {9, 1}`, "fewer than 2 claims"},
		{`return {9, 1, 4, 4}`, "left after 2 claims"},
		{`return 'x'`, ""},
	} {
		got := run(bad.lua, 2)
		for i, r := range got {
			if r.Err == nil || !strings.Contains(r.Err.Error(), bad.why) {
				t.Errorf("%s, claim %d: %v, want an error naming %q", bad.lua, i, r.Err, bad.why)
			}
		}
	}
}
