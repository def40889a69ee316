package redisstream_test

import (
	"errors"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// fixture is one stream and group of the shared server.
type fixture struct {
	c      rueidis.Client
	stream string
	group  string
}

func setup(t *testing.T) fixture {
	t.Helper()
	return fixture{c: redistest.Client(t), stream: redistest.Name(t, "s"), group: redistest.Name(t, "g")}
}

// source returns a Source of consumer on f whose group exists.
func (f fixture) source(t *testing.T, consumer string, opts ...redisstream.Option) *redisstream.Source {
	t.Helper()
	opts = append([]redisstream.Option{redisstream.WithBlock(20 * time.Millisecond)}, opts...)
	s := redisstream.New(f.c, f.stream, f.group, consumer, opts...)
	if err := s.EnsureGroup(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

func (f fixture) do(t *testing.T, cmd rueidis.Completed) rueidis.RedisResult {
	t.Helper()
	res := f.c.Do(t.Context(), cmd)
	if err := res.Error(); err != nil {
		t.Fatalf("%v: %v", cmd.Commands(), err)
	}
	return res
}

// publishN appends n entries {"n": i} and returns their ids.
func (f fixture) publishN(t *testing.T, s *redisstream.Source, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		id, err := s.Publish(t.Context(), map[string]string{"n": strconv.Itoa(i)})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = id
	}
	return ids
}

// pelEntry is one row of extended XPENDING.
type pelEntry struct {
	consumer   string
	deliveries int64
}

// pel returns the group's whole PEL by id.
func (f fixture) pel(t *testing.T) map[string]pelEntry {
	t.Helper()
	rows, err := f.do(t, f.c.B().Xpending().Key(f.stream).Group(f.group).Start("-").End("+").Count(10000).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]pelEntry, len(rows))
	for _, r := range rows {
		v, _ := r.ToArray()
		id, _ := v[0].ToString()
		c, _ := v[1].ToString()
		n, _ := v[3].AsInt64()
		out[id] = pelEntry{consumer: c, deliveries: n}
	}
	return out
}

// waitIdle polls XPENDING until every id has been idle for at least d.
func (f fixture) waitIdle(t *testing.T, d time.Duration, ids ...string) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, "every entry idle for "+d.String(), func() bool {
		rows, err := f.do(t, f.c.B().Xpending().Key(f.stream).Group(f.group).
			Idle(d.Milliseconds()).Start("-").End("+").Count(10000).Build()).ToArray()
		if err != nil {
			t.Fatal(err)
		}
		idle := map[string]bool{}
		for _, r := range rows {
			v, _ := r.ToArray()
			id, _ := v[0].ToString()
			idle[id] = true
		}
		for _, id := range ids {
			if !idle[id] {
				return false
			}
		}
		return true
	})
}

func ids(msgs []stream.Message) []string {
	out := make([]string, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func TestEnsureGroupTwice(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := redisstream.New(f.c, f.stream, f.group, "c1")
	for range 2 {
		if err := s.EnsureGroup(t.Context()); err != nil {
			t.Fatalf("EnsureGroup: %v", err)
		}
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after EnsureGroup: %v", err)
	}
}

func TestReadNewEntriesAndTimeout(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.source(t, "c1")

	msgs, err := s.Read(t.Context(), 10)
	if err != nil || msgs != nil {
		t.Fatalf("Read on empty stream = %v, %v; want nil, nil", msgs, err)
	}

	want := f.publishN(t, s, 3)
	got, err := s.Read(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	more, err := s.Read(t.Context(), 2)
	if err != nil {
		t.Fatal(err)
	}
	got = append(got, more...)
	if !slices.Equal(ids(got), want) {
		t.Fatalf("read ids %v, want %v", ids(got), want)
	}
	for i, m := range got {
		if m.Deliveries != 1 || m.Fields["n"] != strconv.Itoa(i) || len(m.Fields) != 1 {
			t.Errorf("message %d = %+v", i, m)
		}
	}
	if msgs, err := s.Read(t.Context(), 10); err != nil || msgs != nil {
		t.Fatalf("Read after draining = %v, %v; want nil, nil", msgs, err)
	}
	if _, err := s.Read(t.Context(), 0); err == nil {
		t.Fatal("Read(0) did not fail")
	}
}

func TestReadRecreatesMissingGroup(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var log testutil.Buffer
	s := f.source(t, "c1", redisstream.WithLogger(slog.New(slog.NewTextHandler(&log, nil))))
	want := f.publishN(t, s, 1)
	if _, err := s.Read(t.Context(), 10); err != nil || strings.Contains(log.String(), "created again") {
		t.Fatalf("a first Read with the group in place: %v; log %q", err, log.String())
	}
	if n, at := s.GroupRecreations(); n != 0 || !at.IsZero() {
		t.Errorf("GroupRecreations before any = %d, %v; want 0 and the zero time", n, at)
	}

	before := time.Now()
	f.do(t, f.c.B().XgroupDestroy().Key(f.stream).Group(f.group).Build())
	msgs, err := s.Read(t.Context(), 10)
	if err != nil {
		t.Fatalf("Read without group: %v", err)
	}
	// The group is recreated from id 0, so the entry is delivered again,
	// and the operator is told.
	if !slices.Equal(ids(msgs), want) {
		t.Fatalf("read %v, want %v", ids(msgs), want)
	}
	if got := log.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "created again from id 0") || !strings.Contains(got, "group="+f.group) {
		t.Errorf("no warning about the recreated group: %q", got)
	}
	if n, at := s.GroupRecreations(); n != 1 || at.Before(before.Truncate(time.Millisecond)) {
		t.Errorf("GroupRecreations = %d, %v; want 1 at or after %v", n, at, before)
	}

	// Without the stream key at all, MKSTREAM recreates both.
	f.do(t, f.c.B().Del().Key(f.stream).Build())
	if msgs, err := s.Read(t.Context(), 10); err != nil || msgs != nil {
		t.Fatalf("Read without stream = %v, %v; want nil, nil", msgs, err)
	}
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping after recreation: %v", err)
	}
	if n, _ := s.GroupRecreations(); n != 2 {
		t.Errorf("GroupRecreations after the stream went too = %d, want 2", n)
	}
}

// TestReadCreatesANewGroupQuietly: a Source whose group was never created
// (its Engine's source does not forward relay.GroupEnsurer) creates it at
// its first Read and says so at INFO: nothing was lost, so no warning. Once
// it has found the group, by a read or another command of the group's, a
// group it must create again was lost, and that is a warning.
func TestReadCreatesANewGroupQuietly(t *testing.T) {
	t.Parallel()
	f := setup(t)
	var log testutil.Buffer
	logger := slog.New(slog.NewTextHandler(&log, nil))
	s := redisstream.New(f.c, f.stream, f.group, "c1", redisstream.WithBlock(20*time.Millisecond), redisstream.WithLogger(logger))
	// A producer's entries, written before any consumer group exists.
	want := f.publishN(t, redisstream.New(f.c, f.stream, f.group, "producer"), 2)
	msgs, err := s.Read(t.Context(), 10)
	if err != nil || !slices.Equal(ids(msgs), want) {
		t.Fatalf("first Read = %v, %v; want %v, the group created from id 0", ids(msgs), err, want)
	}
	got := log.String()
	if strings.Contains(got, "level=WARN") || strings.Contains(got, "created again") {
		t.Errorf("a new group's creation was logged as a loss: %q", got)
	}
	if !strings.Contains(got, "level=INFO") || !strings.Contains(got, "created the consumer group from id 0") || !strings.Contains(got, "group="+f.group) {
		t.Errorf("no INFO line about the created group: %q", got)
	}

	// Lost after this Source read from it: a warning.
	f.do(t, f.c.B().XgroupDestroy().Key(f.stream).Group(f.group).Build())
	if _, err := s.Read(t.Context(), 10); err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimPrefix(log.String(), got); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "created again from id 0") {
		t.Errorf("no warning about the group lost after a read: %q", got)
	}

	// Lost after another Source of the group only pinged it: a warning too.
	var log2 testutil.Buffer
	s2 := redisstream.New(f.c, f.stream, f.group, "c2", redisstream.WithBlock(20*time.Millisecond), redisstream.WithLogger(slog.New(slog.NewTextHandler(&log2, nil))))
	if err := s2.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}
	f.do(t, f.c.B().XgroupDestroy().Key(f.stream).Group(f.group).Build())
	if _, err := s2.Read(t.Context(), 10); err != nil {
		t.Fatal(err)
	}
	if got := log2.String(); !strings.Contains(got, "level=WARN") || !strings.Contains(got, "created again from id 0") {
		t.Errorf("no warning about the group lost after a ping: %q", got)
	}
}

func TestPingMissingGroupAndStream(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.source(t, "c1")
	if err := s.Ping(t.Context()); err != nil {
		t.Fatal(err)
	}

	other := redisstream.New(f.c, f.stream, f.group+"-other", "c1")
	err := other.Ping(t.Context())
	if !errors.Is(err, stream.ErrNoGroup) || !strings.Contains(err.Error(), f.group+"-other") {
		t.Fatalf("Ping with missing group = %v; want ErrNoGroup naming the group", err)
	}

	f.do(t, f.c.B().Del().Key(f.stream).Build())
	err = s.Ping(t.Context())
	if !errors.Is(err, stream.ErrNoStream) || !strings.Contains(err.Error(), f.stream) {
		t.Fatalf("Ping with missing stream = %v; want ErrNoStream naming the stream", err)
	}
}

func TestMissingGroupErrors(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := redisstream.New(f.c, f.stream, f.group, "c1")
	ctx := t.Context()

	if _, _, _, err := s.Reclaim(ctx, 0, 10); !errors.Is(err, stream.ErrNoGroup) {
		t.Errorf("Reclaim = %v, want ErrNoGroup", err)
	}
	if _, _, err := s.Pending(ctx); !errors.Is(err, stream.ErrNoGroup) {
		t.Errorf("Pending = %v, want ErrNoGroup", err)
	}
	if gone, err := s.Heartbeat(ctx, "1-0"); !errors.Is(err, stream.ErrNoGroup) || gone != nil {
		t.Errorf("Heartbeat = %v, %v; want ErrNoGroup", gone, err)
	}
	// XACK on a missing group replies 0, like an unknown id.
	if err := s.Ack(ctx, "1-0"); err != nil {
		t.Errorf("Ack = %v, want nil", err)
	}
}

func TestPublishRoundTrip(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.source(t, "c1")
	fields := map[string]string{
		"event":       `{"event_name":"INSERT","table_name":"users"}`,
		"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"b":           "",
		"a":           "x y\nz",
	}
	id, err := s.Publish(t.Context(), fields)
	if err != nil {
		t.Fatal(err)
	}
	// Fields are written in sorted order.
	entries, err := f.do(t, f.c.B().Xrange().Key(f.stream).Start(id).End(id).Build()).AsXRangeSlices()
	if err != nil || len(entries) != 1 {
		t.Fatalf("XRANGE = %v, %v", entries, err)
	}
	var order []string
	for _, fv := range entries[0].FieldValues {
		order = append(order, fv.Field)
	}
	if want := []string{"a", "b", "event", "traceparent"}; !slices.Equal(order, want) {
		t.Errorf("field order %v, want %v", order, want)
	}

	msgs, err := s.Read(t.Context(), 1)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("Read = %v, %v", msgs, err)
	}
	if msgs[0].ID != id || len(msgs[0].Fields) != len(fields) {
		t.Fatalf("read %+v, want id %s and %v", msgs[0], id, fields)
	}
	for k, v := range fields {
		if msgs[0].Fields[k] != v {
			t.Errorf("field %q = %q, want %q", k, msgs[0].Fields[k], v)
		}
	}

	if _, err := s.Publish(t.Context(), nil); err == nil {
		t.Error("Publish(nil) did not fail")
	}
}

func TestAck(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.source(t, "c1")
	ctx := t.Context()
	want := f.publishN(t, s, 2)
	if _, err := s.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(ctx); err != nil {
		t.Errorf("Ack() = %v", err)
	}
	if err := s.Ack(ctx, want[0], "1-1", want[0]); err != nil {
		t.Errorf("Ack with unknown and repeated ids = %v", err)
	}
	if err := s.Ack(ctx, want[0]); err != nil {
		t.Errorf("second Ack = %v", err)
	}
	pel := f.pel(t)
	if _, ok := pel[want[0]]; ok || len(pel) != 1 {
		t.Errorf("PEL after ack = %v, want only %s", pel, want[1])
	}
}

func TestPending(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.source(t, "c1")
	ctx := t.Context()

	if n, age, err := s.Pending(ctx); n != 0 || age != 0 || err != nil {
		t.Fatalf("Pending on empty group = %d, %s, %v", n, age, err)
	}

	// An entry added an hour ago by its id, then one added now.
	now, err := f.do(t, f.c.B().Time().Build()).AsStrSlice()
	if err != nil {
		t.Fatal(err)
	}
	sec, _ := strconv.ParseInt(now[0], 10, 64)
	old := strconv.FormatInt((sec-3600)*1000, 10) + "-0"
	f.do(t, f.c.B().Xadd().Key(f.stream).Id(old).FieldValue().FieldValue("n", "old").Build())
	f.publishN(t, s, 1)
	if _, err := s.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}

	n, age, err := s.Pending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || age < 59*time.Minute || age > 61*time.Minute {
		t.Fatalf("Pending = %d, %s; want 2, about 1h", n, age)
	}
}

// TestOwned: of the ids asked, Owned says which are pending and delivered
// to its consumer; one acknowledged, one taken over by another consumer
// and one never delivered are not.
func TestOwned(t *testing.T) {
	t.Parallel()
	f := setup(t)
	s := f.source(t, "c1")
	ctx := t.Context()
	ids := f.publishN(t, s, 4)
	if _, err := s.Read(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := s.Ack(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	if err := f.c.Do(ctx, f.c.B().Xclaim().Key(f.stream).Group(f.group).Consumer("c2").MinIdleTime("0").Id(ids[2]).Justid().Build()).Error(); err != nil {
		t.Fatal(err)
	}
	owned, err := s.Owned(ctx, ids)
	if err != nil {
		t.Fatal(err)
	}
	if len(owned) != 1 || !owned[ids[0]] {
		t.Errorf("Owned(%v) = %v; want only %s (1 acknowledged, 2 taken over, 3 never delivered)", ids, owned, ids[0])
	}
}

// TestReadBlockedWhenGroupOrStreamVanishes removes the group, then the stream
// key, while Read is blocked in XREADGROUP; Read recreates the group and
// reads again instead of failing. It uses a private server so that
// blocked_clients counts only this test's read.
func TestReadBlockedWhenGroupOrStreamVanishes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, redistest.Options{})
	c := redistest.Connect(t, srv.Addr)
	f := fixture{c: c, stream: redistest.Name(t, "s"), group: redistest.Name(t, "g")}
	s := f.source(t, "c1", redisstream.WithBlock(5*time.Second))

	// In this order: a destroyed group is recreated from id 0, so the stream
	// must hold no entry yet.
	for _, tc := range []struct {
		name   string
		remove rueidis.Completed
	}{
		{"group destroyed", c.B().XgroupDestroy().Key(f.stream).Group(f.group).Build()},
		{"stream deleted", c.B().Del().Key(f.stream).Build()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			type result struct {
				msgs []stream.Message
				err  error
			}
			done := make(chan result, 1)
			go func() {
				msgs, err := s.Read(t.Context(), 10)
				done <- result{msgs, err}
			}()
			testutil.WaitFor(t, 5*time.Second, "the read blocked in XREADGROUP", func() bool {
				info, err := c.Do(t.Context(), c.B().Info().Section("clients").Build()).ToString()
				if err != nil {
					t.Fatal(err)
				}
				return strings.Contains(info, "blocked_clients:1\r")
			})
			if err := c.Do(t.Context(), tc.remove).Error(); err != nil {
				t.Fatal(err)
			}
			// The retried read blocks again; give it an entry to return.
			testutil.WaitFor(t, 5*time.Second, "the retried read blocked again", func() bool {
				if err := s.Ping(t.Context()); err != nil {
					return false
				}
				info, _ := c.Do(t.Context(), c.B().Info().Section("clients").Build()).ToString()
				return strings.Contains(info, "blocked_clients:1\r")
			})
			want := f.publishN(t, s, 1)
			r := <-done
			if r.err != nil || !slices.Equal(ids(r.msgs), want) {
				t.Fatalf("Read = %v, %v; want %v", ids(r.msgs), r.err, want)
			}
			if err := s.Ack(t.Context(), want...); err != nil {
				t.Fatal(err)
			}
		})
	}
}
