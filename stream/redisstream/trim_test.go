package redisstream_test

import (
	"errors"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// serverMS reads the Redis server's clock (TIME) in Unix ms.
func (f fixture) serverMS(t *testing.T) int64 {
	t.Helper()
	parts, err := f.do(t, f.c.B().Time().Build()).AsStrSlice()
	if err != nil || len(parts) != 2 {
		t.Fatalf("TIME: %v, %v", parts, err)
	}
	sec, _ := strconv.ParseInt(parts[0], 10, 64)
	usec, _ := strconv.ParseInt(parts[1], 10, 64)
	return sec*1000 + usec/1000
}

// waitOlder polls the server clock until id is more than d old.
func (f fixture) waitOlder(t *testing.T, id string, d time.Duration) {
	t.Helper()
	ms, _, err := stream.ParseID(id)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the entry older than "+d.String(), func() bool { return f.serverMS(t) > int64(ms)+d.Milliseconds() })
}

// publishFast appends n entries {"n": i} in one pipeline and returns
// their ids.
func (f fixture) publishFast(t *testing.T, n int) []string {
	t.Helper()
	cmds := make(rueidis.Commands, n)
	for i := range n {
		cmds[i] = f.c.B().Xadd().Key(f.stream).Id("*").FieldValue().FieldValue("n", strconv.Itoa(i)).Build()
	}
	out := make([]string, n)
	for i, r := range f.c.DoMulti(t.Context(), cmds...) {
		id, err := r.ToString()
		if err != nil {
			t.Fatal(err)
		}
		out[i] = id
	}
	return out
}

// readAll delivers every new entry to consumer c1 of group and returns
// their ids.
func (f fixture) readAll(t *testing.T, group string) []string {
	t.Helper()
	res, err := f.do(t, f.c.B().Xreadgroup().Group(group, "c1").Count(100000).Streams().Key(f.stream).Id(">").Build()).AsXRead()
	if err != nil && !rueidis.IsRedisNil(err) {
		t.Fatal(err)
	}
	var out []string
	for _, e := range res[f.stream] {
		out = append(out, e.ID)
	}
	return out
}

func (f fixture) createGroup(t *testing.T, group, from string) {
	t.Helper()
	f.do(t, f.c.B().XgroupCreate().Key(f.stream).Group(group).Id(from).Build())
}

func (f fixture) ack(t *testing.T, group string, ids ...string) {
	t.Helper()
	if len(ids) > 0 {
		f.do(t, f.c.B().Xack().Key(f.stream).Group(group).Id(ids...).Build())
	}
}

// entries returns the stream's entries (XRANGE - +) by id.
func (f fixture) entries(t *testing.T) map[string]map[string]string {
	t.Helper()
	rows, err := f.do(t, f.c.B().Xrange().Key(f.stream).Start("-").End("+").Build()).AsXRange()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]map[string]string, len(rows))
	for _, r := range rows {
		out[r.ID] = r.FieldValues
	}
	return out
}

// sortedIDs returns the ids of m in stream order.
func sortedIDs[V any](m map[string]V) []string {
	return slices.SortedFunc(maps.Keys(m), stream.CompareID)
}

func (f fixture) xlen(t *testing.T) int64 {
	t.Helper()
	n, err := f.do(t, f.c.B().Xlen().Key(f.stream).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// groupInfo is the bookkeeping XINFO GROUPS reports for one group.
type groupInfo struct {
	lastDelivered string
	entriesRead   string // "" when Redis does not know (nil)
	lag           string // "" when Redis cannot tell (nil)
	pending       int64
}

func (f fixture) groups(t *testing.T) map[string]groupInfo {
	t.Helper()
	rows, err := f.do(t, f.c.B().XinfoGroups().Key(f.stream).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]groupInfo{}
	for _, r := range rows {
		m, err := r.AsMap()
		if err != nil {
			t.Fatal(err)
		}
		get := func(k string) *rueidis.RedisMessage { v := m[k]; return &v }
		name, _ := get("name").ToString()
		last, _ := get("last-delivered-id").ToString()
		read, _ := get("entries-read").ToAny()
		lag, _ := get("lag").ToAny()
		pending, _ := get("pending").AsInt64()
		out[name] = groupInfo{lastDelivered: last, entriesRead: anyString(read), lag: anyString(lag), pending: pending}
	}
	return out
}

func anyString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case int64:
		return strconv.FormatInt(v, 10)
	case string:
		return v
	}
	return "?"
}

func (f fixture) entriesAdded(t *testing.T) int64 {
	t.Helper()
	m, err := f.do(t, f.c.B().XinfoStream().Key(f.stream).Build()).AsMap()
	if err != nil {
		t.Fatal(err)
	}
	added := m["entries-added"]
	n, err := added.AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTrimKeepsWhatAnotherGroupHolds: the Source's group has read and
// acknowledged 2,000 entries; a second group read them all but holds the
// last 5 pending. Trimming with a retention every entry has passed leaves
// exactly those 5, readable with their bodies through XRANGE and XCLAIM,
// and keeps the stream's and the groups' counters.
func TestTrimKeepsWhatAnotherGroupHolds(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := f.source(t, "c1")
	ctx := t.Context()
	const other = "audit"
	f.createGroup(t, other, "0")

	all := f.publishFast(t, 2000)
	if got := f.readAll(t, f.group); len(got) != 2000 {
		t.Fatalf("read %d entries, want 2000", len(got))
	}
	f.ack(t, f.group, all...)
	if got := f.readAll(t, other); len(got) != 2000 {
		t.Fatalf("%s read %d entries, want 2000", other, len(got))
	}
	f.ack(t, other, all[:1995]...)
	held := all[1995:]
	f.waitOlder(t, all[1999], time.Millisecond)
	groupsBefore, addedBefore := f.groups(t), f.entriesAdded(t)

	r, err := src.Trim(ctx, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if r.Trimmed != 1995 || r.More || r.Floor != held[0] || r.FloorGroup != other || !r.FloorPending || !r.HeldBack || r.MinID != held[0] {
		t.Errorf("Trim = %+v; want 1995 trimmed, floor %s held pending by %s", r, held[0], other)
	}
	left := f.entries(t)
	if got := sortedIDs(left); !slices.Equal(got, held) {
		t.Fatalf("entries left %v, want %v", got, held)
	}
	for i, id := range held {
		if left[id]["n"] != strconv.Itoa(1995+i) {
			t.Errorf("XRANGE %s = %v, want n=%d", id, left[id], 1995+i)
		}
	}
	claimed, err := f.do(t, f.c.B().Xclaim().Key(f.stream).Group(other).Consumer("c2").MinIdleTime("0").Id(held...).Build()).AsXRange()
	if err != nil || len(claimed) != len(held) {
		t.Fatalf("XCLAIM = %v, %v; want the %d held entries", claimed, err, len(held))
	}
	for i, e := range claimed {
		if e.ID != held[i] || e.FieldValues["n"] != strconv.Itoa(1995+i) {
			t.Errorf("XCLAIM entry %d = %+v, want %s with n=%d", i, e, held[i], 1995+i)
		}
	}
	if got := f.entriesAdded(t); got != addedBefore {
		t.Errorf("entries-added %d after the trim, %d before", got, addedBefore)
	}
	if got := f.groups(t); !maps.Equal(got, groupsBefore) {
		t.Errorf("XINFO GROUPS after the trim %+v, before %+v", got, groupsBefore)
	}

	// Nothing more is due: a second trim removes nothing.
	if r, err := src.Trim(ctx, time.Millisecond); err != nil || r.Trimmed != 0 {
		t.Errorf("second Trim = %+v, %v; want nothing trimmed", r, err)
	}
}

// TestTrimStopsAtUndelivered: a group that has not been delivered the
// tail holds it, even with nothing pending; a group created from 0 that
// read nothing holds everything; a group created with $ holds nothing
// before its creation.
func TestTrimStopsAtUndelivered(t *testing.T) {
	t.Parallel()
	ctx := t.Context()

	t.Run("tail not read", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		src := f.source(t, "c1")
		f.createGroup(t, "late", "0")
		all := f.publishFast(t, 30)
		f.ack(t, f.group, f.readAll(t, f.group)...)
		res, err := f.do(t, f.c.B().Xreadgroup().Group("late", "c1").Count(10).Streams().Key(f.stream).Id(">").Build()).AsXRead()
		if err != nil || len(res[f.stream]) != 10 {
			t.Fatalf("late read %v, %v", res, err)
		}
		f.ack(t, "late", all[:10]...)
		f.waitOlder(t, all[29], time.Millisecond)

		r, err := src.Trim(ctx, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		// The last entry "late" was delivered is kept with everything after.
		if r.Trimmed != 9 || r.Floor != all[9] || r.FloorGroup != "late" || r.FloorPending || !r.HeldBack {
			t.Errorf("Trim = %+v; want 9 trimmed, floor %s (last delivered to late)", r, all[9])
		}
		if got := sortedIDs(f.entries(t)); !slices.Equal(got, all[9:]) {
			t.Errorf("entries left %v, want %v", got, all[9:])
		}
	})

	t.Run("group from 0 read nothing", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		src := f.source(t, "c1")
		all := f.publishFast(t, 20)
		f.ack(t, f.group, f.readAll(t, f.group)...)
		f.createGroup(t, "idle", "0")
		f.waitOlder(t, all[19], time.Millisecond)

		r, err := src.Trim(ctx, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if r.Trimmed != 0 || r.Floor != "0-0" || r.FloorGroup != "idle" || r.FloorPending || !r.HeldBack || !r.FloorTime.Equal(time.UnixMilli(0)) {
			t.Errorf("Trim = %+v; want nothing trimmed, floor 0-0 held by idle", r)
		}
		if n := f.xlen(t); n != 20 {
			t.Errorf("XLEN %d, want 20", n)
		}
	})

	t.Run("group from $", func(t *testing.T) {
		t.Parallel()
		f := setup(t)
		src := f.source(t, "c1")
		all := f.publishFast(t, 20)
		f.ack(t, f.group, f.readAll(t, f.group)...)
		f.createGroup(t, "fresh", "$")
		f.waitOlder(t, all[19], time.Millisecond)

		r, err := src.Trim(ctx, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		// Both groups stand at the last entry: only it is kept, and
		// nothing is held back (an idle, caught-up stream), however
		// often it is trimmed.
		if r.Trimmed != 19 {
			t.Errorf("Trim = %+v; want 19 trimmed", r)
		}
		for range 2 {
			if r.Floor != all[19] || r.FloorPending || r.HeldBack {
				t.Errorf("Trim = %+v; want floor %s, not held back", r, all[19])
			}
			if r, err = src.Trim(ctx, time.Millisecond); err != nil {
				t.Fatal(err)
			}
		}
		if r.Trimmed != 0 {
			t.Errorf("second Trim = %+v; want nothing more trimmed", r)
		}
		if got := sortedIDs(f.entries(t)); !slices.Equal(got, all[19:]) {
			t.Errorf("entries left %v, want %v", got, all[19:])
		}
	})
}

// TestTrimByAge: with every group caught up, only entries older than the
// retention go, by the time in their ids against the server's clock.
func TestTrimByAge(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := f.source(t, "c1")
	ctx := t.Context()
	now := f.serverMS(t)
	var old []string
	for i := range 5 {
		id := strconv.FormatInt(now-2*time.Hour.Milliseconds(), 10) + "-" + strconv.Itoa(i)
		f.do(t, f.c.B().Xadd().Key(f.stream).Id(id).FieldValue().FieldValue("n", "old").Build())
		old = append(old, id)
	}
	fresh := f.publishFast(t, 5)
	f.ack(t, f.group, f.readAll(t, f.group)...)

	r, err := src.Trim(ctx, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if r.Trimmed != 5 || r.HeldBack || r.Floor != fresh[4] || r.MinID == fresh[4] {
		t.Errorf("Trim = %+v; want the 5 old entries trimmed by age, floor %s not holding", r, fresh[4])
	}
	if d := r.Cutoff.UnixMilli() - (now - time.Hour.Milliseconds()); d < 0 || d > 5000 {
		t.Errorf("Cutoff %v is %dms from server time minus 1h", r.Cutoff, d)
	}
	if got := sortedIDs(f.entries(t)); !slices.Equal(got, fresh) {
		t.Errorf("entries left %v, want %v", got, fresh)
	}
}

// TestTrimRetentionZero: 0 disables trimming; a negative retention is an
// error; both leave the stream as it is.
func TestTrimRetentionZero(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := f.source(t, "c1")
	all := f.publishFast(t, 10)
	f.ack(t, f.group, f.readAll(t, f.group)...)
	f.waitOlder(t, all[9], time.Millisecond)
	if r, err := src.Trim(t.Context(), 0); err != nil || r != (stream.TrimResult{}) {
		t.Errorf("Trim(0) = %+v, %v; want a zero result", r, err)
	}
	if _, err := src.Trim(t.Context(), -time.Hour); err == nil {
		t.Error("Trim(-1h) succeeded")
	}
	if n := f.xlen(t); n != 10 {
		t.Errorf("XLEN %d after disabled trims, want 10", n)
	}
}

// TestTrimMissingStreamOrGroup: nothing is trimmed when the Source's own
// group is gone (Read would recreate it from 0), even if other groups
// allow it.
func TestTrimMissingStreamOrGroup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := redisstream.New(f.c, f.stream, f.group, "c1")
	if _, err := src.Trim(t.Context(), time.Millisecond); !errors.Is(err, stream.ErrNoStream) {
		t.Errorf("Trim on a missing stream: %v, want ErrNoStream", err)
	}
	all := f.publishFast(t, 10)
	f.createGroup(t, "other", "0")
	f.ack(t, "other", f.readAll(t, "other")...)
	f.waitOlder(t, all[9], time.Millisecond)
	if _, err := src.Trim(t.Context(), time.Millisecond); !errors.Is(err, stream.ErrNoGroup) {
		t.Errorf("Trim without the Source's group: %v, want ErrNoGroup", err)
	}
	if n := f.xlen(t); n != 10 {
		t.Errorf("XLEN %d, want 10", n)
	}
}

// TestTrimLimitBoundsOneCall: a large backlog goes over several calls,
// none removing more than the limit, the last one exact.
func TestTrimLimitBoundsOneCall(t *testing.T) {
	t.Parallel()
	f := setup(t)
	const limit = 1000
	src := f.source(t, "c1", redisstream.WithTrimLimit(limit))
	all := f.publishFast(t, 3500)
	f.ack(t, f.group, f.readAll(t, f.group)...)
	f.waitOlder(t, all[len(all)-1], time.Millisecond)

	var total int64
	calls := 0
	for {
		r, err := src.Trim(t.Context(), time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		calls++
		if r.Trimmed > limit {
			t.Errorf("call %d trimmed %d entries, limit %d", calls, r.Trimmed, limit)
		}
		total += r.Trimmed
		if !r.More {
			break
		}
		if calls > 10 {
			t.Fatalf("still More after %d calls (%d trimmed)", calls, total)
		}
	}
	if total != 3499 || calls < 4 {
		t.Errorf("trimmed %d entries in %d calls; want 3499 in at least 4", total, calls)
	}
	if got := sortedIDs(f.entries(t)); !slices.Equal(got, all[3499:]) {
		t.Errorf("entries left %v, want the last one", got)
	}
}

// TestTrimConcurrent: several goroutines trim while a consumer reads and
// acknowledges all but every tenth entry. Every trim succeeds, the counts
// add up to what left the stream, and every entry still pending keeps its
// body.
func TestTrimConcurrent(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := f.source(t, "c1")
	ctx := t.Context()
	all := f.publishFast(t, 1000)

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		trimmed int64
		done    = make(chan struct{})
	)
	for range 4 {
		wg.Go(func() {
			for {
				r, err := src.Trim(ctx, time.Millisecond)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				trimmed += r.Trimmed
				mu.Unlock()
				select {
				case <-done:
					return
				default:
				}
			}
		})
	}
	var unacked []string
	for {
		msgs, err := src.Read(ctx, 50)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) == 0 {
			break
		}
		var ack []string
		for _, m := range msgs {
			if n, _ := strconv.Atoi(m.Fields["n"]); n%10 == 9 {
				unacked = append(unacked, m.ID)
			} else {
				ack = append(ack, m.ID)
			}
		}
		if err := src.Ack(ctx, ack...); err != nil {
			t.Fatal(err)
		}
	}
	f.waitOlder(t, all[999], time.Millisecond)
	close(done)
	wg.Wait()
	if r, err := src.Trim(ctx, time.Millisecond); err != nil {
		t.Fatal(err)
	} else {
		trimmed += r.Trimmed
	}

	left := f.entries(t)
	if int64(len(left)) != 1000-trimmed {
		t.Errorf("%d entries left, but the trims reported %d of 1000 removed", len(left), trimmed)
	}
	for _, id := range unacked {
		if left[id] == nil {
			t.Errorf("pending entry %s was trimmed", id)
		}
	}
	// The first pending entry is the 10th: everything before it may go.
	if trimmed != 9 || len(unacked) != 100 {
		t.Errorf("trimmed %d, %d unacked; want 9 and 100", trimmed, len(unacked))
	}
}

// TestTrimThenNewGroupFromZero: a group created from 0 after a trim is
// delivered only what retention kept, and Redis counts its lag right.
func TestTrimThenNewGroupFromZero(t *testing.T) {
	t.Parallel()
	f := setup(t)
	src := f.source(t, "c1")
	const other = "reports"
	f.createGroup(t, other, "0")
	all := f.publishFast(t, 50)
	f.ack(t, f.group, f.readAll(t, f.group)...)
	f.ack(t, other, f.readAll(t, other)[:40]...) // 10 stay pending
	f.waitOlder(t, all[49], time.Millisecond)
	if r, err := src.Trim(t.Context(), time.Millisecond); err != nil || r.Trimmed != 40 {
		t.Fatalf("Trim = %+v, %v; want 40 trimmed", r, err)
	}
	f.createGroup(t, "later", "0")
	if g := f.groups(t)["later"]; g.lag != "10" {
		t.Errorf("later's lag %q, want 10 (what retention kept)", g.lag)
	}
	if got := f.readAll(t, "later"); !slices.Equal(got, all[40:]) {
		t.Errorf("later read %v, want %v", got, all[40:])
	}
}

// BenchmarkTrimNothingDue is the recurring cost of a Trim on a stream
// whose groups are caught up: three groups, one with entries pending.
func BenchmarkTrimNothingDue(b *testing.B) {
	f := fixture{c: redistest.Client(b), stream: redistest.Name(b, "s"), group: "relay"}
	ctx := b.Context()
	src := redisstream.New(f.c, f.stream, f.group, "c1")
	if err := src.EnsureGroup(ctx); err != nil {
		b.Fatal(err)
	}
	for _, g := range []string{"audit", "reports"} {
		if err := f.c.Do(ctx, f.c.B().XgroupCreate().Key(f.stream).Group(g).Id("0").Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	for range 10 {
		if _, err := src.Publish(ctx, map[string]string{"n": "1"}); err != nil {
			b.Fatal(err)
		}
	}
	for _, g := range []string{f.group, "audit", "reports"} {
		if err := f.c.Do(ctx, f.c.B().Xreadgroup().Group(g, "c1").Count(100).Streams().Key(f.stream).Id(">").Build()).Error(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := src.Trim(ctx, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}

// TestTrimOutOfMemory: a Redis at maxmemory with noeviction refuses new
// entries, but Trim needs no memory (XTRIM may not grow it), so retention
// still frees what no group needs.
func TestTrimOutOfMemory(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	f := fixture{c: redistest.Connect(t, srv.Addr), stream: "events", group: "relay"}
	src := f.source(t, "c1")
	all := f.publishFast(t, 100)
	f.ack(t, f.group, f.readAll(t, f.group)...)
	f.waitOlder(t, all[99], time.Millisecond)
	f.do(t, f.c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "noeviction").ParameterValue("maxmemory", "1").Build())

	_, err := src.Publish(t.Context(), map[string]string{"n": "x"})
	var re *rueidis.RedisError
	if !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "OOM ") {
		t.Fatalf("Publish on a full Redis: %v, want an OOM error", err)
	}
	r, err := src.Trim(t.Context(), time.Millisecond)
	if err != nil || r.Trimmed != 99 {
		t.Fatalf("Trim on a full Redis = %+v, %v; want 99 trimmed", r, err)
	}
	if n := f.xlen(t); n != 1 {
		t.Errorf("XLEN %d, want 1", n)
	}
}

// TestEnsureGroupOutOfMemory: XGROUP CREATE is refused at maxmemory even
// when the group exists, but a worker (re)starting then must still start:
// only a running worker trims the stream and frees memory
// (docs/operations.md#redis-memory). EnsureGroup succeeds for an existing
// group on a full Redis, and still reports the refusal when the group is
// missing.
func TestEnsureGroupOutOfMemory(t *testing.T) {
	srv := redistest.Start(t, redistest.Options{})
	f := fixture{c: redistest.Connect(t, srv.Addr), stream: "events", group: "relay"}
	src := f.source(t, "c1") // creates the group
	f.publishFast(t, 10)
	f.do(t, f.c.B().ConfigSet().ParameterValue().ParameterValue("maxmemory-policy", "noeviction").ParameterValue("maxmemory", "1").Build())

	if err := src.EnsureGroup(t.Context()); err != nil {
		t.Errorf("EnsureGroup of an existing group on a full Redis: %v, want nil", err)
	}
	other := redisstream.New(f.c, f.stream, "other", "c1")
	err := other.EnsureGroup(t.Context())
	var re *rueidis.RedisError
	if !errors.As(err, &re) || !strings.HasPrefix(re.Error(), "OOM ") {
		t.Errorf("EnsureGroup of a missing group on a full Redis: %v, want the OOM error", err)
	}
}
