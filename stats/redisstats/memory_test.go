package redisstats_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// memoryFixture fills a private Redis with a stream whose entries arrived
// at a known rate, invocation hashes, dead letters and other Relay keys.
type memoryFixture struct {
	rc            rueidis.Client
	stream, group string
	now           time.Time
}

func newMemoryFixture(t *testing.T, entries, hashes, deadLetters, others int) memoryFixture {
	t.Helper()
	srv := redistest.Start(t, redistest.Options{})
	rc := redistest.Connect(t, srv.Addr)
	ctx := context.Background()
	f := memoryFixture{rc: rc, stream: "orders", group: "shop"}
	tm, err := rc.Do(ctx, rc.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := strconv.ParseInt(tm[0], 10, 64)
	usec, _ := strconv.ParseInt(tm[1], 10, 64)
	f.now = time.Unix(sec, usec*1000)
	var cmds rueidis.Commands
	// entries spread evenly over the last 30 s: 2 per second when 60.
	for i := range entries {
		at := f.now.Add(-30 * time.Second).Add(time.Duration(i) * 30 * time.Second / time.Duration(max(entries, 1)))
		cmds = append(cmds, rc.B().Xadd().Key(f.stream).Id(fmt.Sprintf("%d-%d", at.UnixMilli(), i)).FieldValue().
			FieldValue("event", fmt.Sprintf(`{"type":"orders.placed","order_id":%d,"note":"%0200d"}`, i, i)).Build())
	}
	for i := range hashes {
		k := keys.Invocation(f.stream, f.group, fmt.Sprintf("%d-0", 1000+i))
		cmds = append(cmds, rc.B().Hset().Key(k).FieldValue().FieldValue("shop/orders.record", "ok").FieldValue("__terminal", "1").Build())
	}
	for i := range deadLetters {
		cmds = append(cmds, rc.B().Xadd().Key(keys.DLQ(f.stream)).Id("*").FieldValue().FieldValue("reason", "exhausted").FieldValue("event", `{"n":`+strconv.Itoa(i)+`}`).Build())
	}
	for i := range others {
		cmds = append(cmds, rc.B().Set().Key(keys.Stats(f.stream, f.group)+":x"+strconv.Itoa(i)).Value("1").Build())
	}
	cmds = append(cmds, rc.B().Set().Key("not-relay").Value("x").Build())
	for _, r := range rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f memoryFixture) usage(t *testing.T, key string) int64 {
	t.Helper()
	n, err := f.rc.Do(context.Background(), f.rc.B().MemoryUsage().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestMeasureMemoryParts(t *testing.T) {
	f := newMemoryFixture(t, 60, 40, 3, 5)
	ret := stats.Retentions{Stream: time.Hour, DLQ: 24 * time.Hour, Invocation: 48 * time.Hour}
	m, err := redisstats.MeasureMemory(context.Background(), f.rc, f.stream, f.group, ret, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Stream.Items != 60 || m.Stream.Bytes != f.usage(t, f.stream) {
		t.Errorf("stream part %+v, want 60 entries of %d bytes", m.Stream, f.usage(t, f.stream))
	}
	if m.DLQ.Items != 3 || m.DLQ.Bytes != f.usage(t, keys.DLQ(f.stream)) {
		t.Errorf("DLQ part %+v, want 3 entries", m.DLQ)
	}
	hash := f.usage(t, keys.Invocation(f.stream, f.group, "1000-0")) + 40 // + its keyspace entry
	if m.Invocations.Items != 40 || m.Invocations.PerItem != float64(hash) || m.Invocations.Bytes != 40*hash {
		t.Errorf("invocation part %+v, want 40 hashes of %d bytes", m.Invocations, hash)
	}
	if m.Other.Items != 5 || m.Sampled {
		t.Errorf("other part %+v (sampled %v), want 5 keys counted exactly", m.Other, m.Sampled)
	}
	// 60 entries over the last 30 s of a 60 s window: 1 per second.
	if m.Rate != 1 {
		t.Errorf("rate %v, want 1 entry/s", m.Rate)
	}
	if m.Used <= 0 || m.Max != 0 {
		t.Errorf("used %d, max %d; want used > 0 and no maxmemory", m.Used, m.Max)
	}
	if m.Projected <= m.Used || m.Unbounded != "" {
		t.Errorf("projected %d (%q), want more than used %d: an hour of 1 entry/s and 48 h of hashes", m.Projected, m.Unbounded, m.Used)
	}
}

func TestMeasureMemoryRateOfABusyStream(t *testing.T) {
	// 200 entries in 30 s with at most 50 read: the rate comes from the
	// time since the oldest of the newest 50.
	f := newMemoryFixture(t, 200, 0, 0, 0)
	m, err := redisstats.MeasureMemory(context.Background(), f.rc, f.stream, f.group, stats.Retentions{Stream: time.Hour}, stats.Budget{RateEntries: 50})
	if err != nil {
		t.Fatal(err)
	}
	if want := 200.0 / 30; m.Rate < want*0.95 || m.Rate > want*1.05 {
		t.Errorf("rate %.2f, want about %.2f", m.Rate, want)
	}
}

// TestMeasureMemoryRateOfATrimmedStream: a retention shorter than the rate
// window trimmed the older half of 200 entries spread over 30 s; the rate
// counts the 100 left over the 15 s they span, not over the minute.
func TestMeasureMemoryRateOfATrimmedStream(t *testing.T) {
	f := newMemoryFixture(t, 200, 0, 0, 0)
	minID := strconv.FormatInt(f.now.Add(-15*time.Second).UnixMilli(), 10)
	if err := f.rc.Do(context.Background(), f.rc.B().Xtrim().Key(f.stream).Minid().Threshold(minID).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	m, err := redisstats.MeasureMemory(context.Background(), f.rc, f.stream, f.group, stats.Retentions{Stream: 15 * time.Second}, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	if want := 200.0 / 30; m.Stream.Items != 100 || m.Rate < want*0.85 || m.Rate > want*1.15 {
		t.Errorf("%d entries at %.2f/s, want 100 at about %.2f/s", m.Stream.Items, m.Rate, want)
	}
}

func TestMeasureMemorySampledScan(t *testing.T) {
	f := newMemoryFixture(t, 1, 6000, 0, 0)
	m, err := redisstats.MeasureMemory(context.Background(), f.rc, f.stream, f.group, stats.Retentions{}, stats.Budget{ScanCalls: 2, Samples: 20})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Sampled {
		t.Fatal("a scan of 2 calls over 6,000 keys says it covered them all")
	}
	if m.Invocations.Items < 4000 || m.Invocations.Items > 8000 {
		t.Errorf("estimated %d invocation hashes, want about 6,000", m.Invocations.Items)
	}
}

func TestMeasureMemoryEmpty(t *testing.T) {
	f := newMemoryFixture(t, 0, 0, 0, 0)
	m, err := redisstats.MeasureMemory(context.Background(), f.rc, f.stream, f.group, stats.Retentions{}, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Stream != (stats.Part{}) || m.DLQ != (stats.Part{}) || m.Rate != 0 || m.Unbounded != "" || m.Projected < 0 {
		t.Errorf("memory of a missing stream %+v, want empty parts and a bounded projection", m)
	}
}

func TestMeasureMemoryUnboundedAndPressure(t *testing.T) {
	f := newMemoryFixture(t, 60, 0, 0, 0)
	ctx := context.Background()
	m, err := redisstats.MeasureMemory(ctx, f.rc, f.stream, f.group, stats.Retentions{Stream: 0, Invocation: time.Hour}, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Projected != -1 || m.Unbounded == "" || m.Pressure(0.9) {
		t.Errorf("projection %d (%q), pressure %v; want unbounded, and no pressure without maxmemory", m.Projected, m.Unbounded, m.Pressure(0.9))
	}
	if err := f.rc.Do(ctx, f.rc.B().ConfigSet().ParameterValue().ParameterValue("maxmemory", "1000000000").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if m, err = redisstats.MeasureMemory(ctx, f.rc, f.stream, f.group, stats.Retentions{Stream: 0}, stats.Budget{}); err != nil || !m.Pressure(0.9) {
		t.Errorf("unbounded growth under a maxmemory: pressure %v (%v), want true", m.Pressure(0.9), err)
	}
	// A day of 1 entry/s of about 400 bytes fits 1 GB; a year does not.
	for _, tc := range []struct {
		stream time.Duration
		want   bool
	}{{24 * time.Hour, false}, {365 * 24 * time.Hour, true}} {
		m, err := redisstats.MeasureMemory(ctx, f.rc, f.stream, f.group, stats.Retentions{Stream: tc.stream}, stats.Budget{})
		if err != nil {
			t.Fatal(err)
		}
		if m.Max != 1000000000 || m.Pressure(0.9) != tc.want {
			t.Errorf("stream retention %v: projected %d of %d, pressure %v, want %v", tc.stream, m.Projected, m.Max, m.Pressure(0.9), tc.want)
		}
	}
}

// TestMeasuredHashBytesMatchUsedMemory: the per-hash cost a projection
// multiplies is within 25% of what used_memory really grows by per
// retained hash.
func TestMeasuredHashBytesMatchUsedMemory(t *testing.T) {
	f := newMemoryFixture(t, 0, 0, 0, 0)
	ctx := context.Background()
	used := func() int64 {
		m, err := redisstats.MeasureMemory(ctx, f.rc, f.stream, f.group, stats.Retentions{}, stats.Budget{})
		if err != nil {
			t.Fatal(err)
		}
		return m.Used
	}
	before := used()
	// Enough hashes that the dictionaries' growth by doubling averages out.
	const n = 20000
	cmds := make(rueidis.Commands, 0, 2*n)
	for i := range n {
		k := keys.Invocation(f.stream, f.group, fmt.Sprintf("%d-0", f.now.UnixMilli()+int64(i)))
		cmds = append(cmds, f.rc.B().Hset().Key(k).FieldValue().FieldValue("shop/orders.record", "ok").FieldValue("__terminal", "1").Build(),
			f.rc.B().Pexpire().Key(k).Milliseconds(172800000).Build())
	}
	for _, r := range f.rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := redisstats.MeasureMemory(ctx, f.rc, f.stream, f.group, stats.Retentions{}, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	real := float64(m.Used-before) / n
	if m.Invocations.Items != n || m.Invocations.PerItem < real*0.75 || m.Invocations.PerItem > real*1.25 {
		t.Errorf("%d hashes measured at %.0f bytes each; used_memory grew %.0f per hash", m.Invocations.Items, m.Invocations.PerItem, real)
	}
	t.Logf("retained invocation hash: measured %.0f bytes, used_memory grew %.0f per hash", m.Invocations.PerItem, real)
}

func TestProjectionWithoutAHashToSample(t *testing.T) {
	f := newMemoryFixture(t, 60, 0, 0, 0)
	m, err := redisstats.MeasureMemory(context.Background(), f.rc, f.stream, f.group, stats.Retentions{Stream: time.Hour, Invocation: time.Hour}, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	if !m.Invocations.Estimated || m.Invocations.Projected != 3600*stats.RetainedHashBytes {
		t.Errorf("invocation part %+v: want an hour at 1/s of %d-byte hashes, marked estimated", m.Invocations, stats.RetainedHashBytes)
	}
}

// TestMeasureMemoryRateAfterABurst: 1,500 entries written in one burst 30 s
// ago and nothing since (a backfill, a replay) are 25 per second over the
// last minute. With more entries in the window than it reads, the rate is
// over the time since the oldest entry read, not over the milliseconds
// the burst took, which made it about 100,000 per second and the
// projection terabytes: relay health failed and the workers warned for a
// rate the stream never kept up.
func TestMeasureMemoryRateAfterABurst(t *testing.T) {
	f := newMemoryFixture(t, 0, 0, 0, 0)
	ctx := context.Background()
	at := f.now.Add(-30 * time.Second).UnixMilli()
	cmds := make(rueidis.Commands, 0, 1500)
	for i := range 1500 {
		id := fmt.Sprintf("%d-%d", at+int64(i/100), i%100) // 15 ms
		cmds = append(cmds, f.rc.B().Xadd().Key(f.stream).Id(id).FieldValue().FieldValue("event", `{"n":1}`).Build())
	}
	for _, r := range f.rc.DoMulti(ctx, cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	m, err := redisstats.MeasureMemory(ctx, f.rc, f.stream, f.group, stats.Retentions{Stream: 24 * time.Hour}, stats.Budget{})
	if err != nil {
		t.Fatal(err)
	}
	// 1,000 read of them over the 30 s since: about 33/s, between the
	// minute's 25/s and 1,500/30 s.
	if m.Rate < 20 || m.Rate > 50 {
		t.Errorf("rate %.1f entries/s after a burst of 1,500 30 s ago, want about 33", m.Rate)
	}
}

// TestShortStreamPerEntry: a stream shorter than one node (100 entries)
// reports its first node's allocation in MEMORY USAGE, about 5 KB even
// for one small entry, so per entry it measured up to a hundred times what
// the entries to come cost, and a new stream's projection failed the
// memory budget of a small Redis. Its per-entry cost now comes from its
// entries' size, within reach of what a node's worth of them measures.
func TestShortStreamPerEntry(t *testing.T) {
	for _, size := range []int{10, 200, 2000} {
		t.Run(fmt.Sprintf("%d bytes", size), func(t *testing.T) {
			srv := redistest.Start(t, redistest.Options{})
			rc := redistest.Connect(t, srv.Addr)
			ctx := context.Background()
			add := func(n int) {
				cmds := make(rueidis.Commands, 0, n)
				for i := range n {
					cmds = append(cmds, rc.B().Xadd().Key("orders").Id("*").FieldValue().
						FieldValue("event", fmt.Sprintf(`{"kind":"order","id":"ord_%d","pad":"%0*d"}`, i, size, 0)).Build())
				}
				for _, r := range rc.DoMulti(ctx, cmds...) {
					if err := r.Error(); err != nil {
						t.Fatal(err)
					}
				}
			}
			measure := func() stats.Part {
				m, err := redisstats.MeasureMemory(ctx, rc, "orders", "shop", stats.Retentions{Stream: time.Hour}, stats.Budget{})
				if err != nil {
					t.Fatal(err)
				}
				return m.Stream
			}
			add(1)
			short := measure()
			add(999)
			long := measure()
			if long.Estimated {
				t.Fatalf("1,000 entries: per entry estimated, want measured")
			}
			if !short.Estimated || short.PerItem < 0.6*long.PerItem || short.PerItem > 1.5*long.PerItem {
				t.Errorf("1 entry of %d bytes: %.0f bytes per entry (estimated %v, MEMORY USAGE %d), want within 0.6–1.5 of the %.0f that 1,000 measure",
					size, short.PerItem, short.Estimated, short.Bytes, long.PerItem)
			}
		})
	}
}
