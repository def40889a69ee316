package producer_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	ikeys "github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/topology"
	"github.com/relaydev/relay/producer"
	"github.com/relaydev/relay/relaytest"
)

var (
	_ producer.IdempotentStream = (*producer.RedisStream)(nil)
	_ producer.IdempotentStream = (*relaytest.Stream)(nil)
	_ producer.IdempotentStream = (*relaytest.Consumer)(nil)
)

// publishResult is one PublishOnce's outcome.
type publishResult struct {
	id    string
	first bool
	err   error
}

// race runs publish from n goroutines released together and returns their
// results.
func race(n int, publish func(i int) publishResult) []publishResult {
	results := make([]publishResult, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			results[i] = publish(i)
		})
	}
	close(start)
	wg.Wait()
	return results
}

// checkOneEntry asserts that results all succeeded with one id, exactly
// one of them first, and that stream holds exactly that one entry.
func checkOneEntry(t *testing.T, c rueidis.Client, stream string, results []publishResult) {
	t.Helper()
	firsts := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("publisher %d: %v", i, r.err)
		}
		if r.id != results[0].id {
			t.Errorf("publisher %d got id %s, publisher 0 got %s", i, r.id, results[0].id)
		}
		if r.first {
			firsts++
		}
	}
	if firsts != 1 {
		t.Errorf("%d publishers were told they added the entry, want exactly 1", firsts)
	}
	es := entries(t, c, stream)
	if len(es) != 1 || es[0].ID != results[0].id {
		t.Fatalf("stream holds %v, want the one entry %s", es, results[0].id)
	}
}

// TestPublishOnceConcurrentPublishers: 16 goroutines sharing a Producer
// publish one key at once: one entry, one id for all.
func TestPublishOnceConcurrentPublishers(t *testing.T) {
	p, c, s := newProducer(t)
	results := race(16, func(i int) publishResult {
		id, first, err := p.PublishOnceJSON(t.Context(), "order-7", []byte(`{"type":"orders.placed","publisher":`+strconv.Itoa(i)+`}`))
		return publishResult{id, first, err}
	})
	checkOneEntry(t, c, s, results)
}

// TestPublishOnceConcurrentClients: 16 publishers, each with its own
// rueidis client (its own connections, as separate processes have), race
// on one key: one entry, one id for all.
func TestPublishOnceConcurrentClients(t *testing.T) {
	c := redistest.Client(t)
	s := redistest.Name(t, "events")
	producers := make([]*producer.Producer, 16)
	for i := range producers {
		p, err := producer.New(producer.Redis(redistest.Client(t), s))
		if err != nil {
			t.Fatal(err)
		}
		producers[i] = p
	}
	results := race(len(producers), func(i int) publishResult {
		id, first, err := producers[i].PublishOnce(t.Context(), "charge-42", map[string]any{"type": "orders.charge", "publisher": i})
		return publishResult{id, first, err}
	})
	checkOneEntry(t, c, s, results)
}

// TestPublishOnceDuplicateReturnsTheFirst: a later publish of the key adds
// nothing, whatever its event, and returns the first id; the dedup key
// holds that id for the window and a duplicate does not extend it.
func TestPublishOnceDuplicateReturnsTheFirst(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := t.Context()
	id1, first1, err := p.PublishOnceJSON(ctx, "k", []byte(`{"n":1}`))
	if err != nil || !first1 {
		t.Fatalf("first publish: %s, %v, %v; want first", id1, first1, err)
	}
	dedup := ikeys.Idempotency(s, "k")
	ttl1 := pttl(t, c, dedup)
	id2, first2, err := p.PublishOnceJSON(ctx, "k", []byte(`{"n":2}`))
	if err != nil || first2 || id2 != id1 {
		t.Fatalf("second publish: %s, %v, %v; want %s, not first", id2, first2, err, id1)
	}
	if es := entries(t, c, s); len(es) != 1 || es[0].FieldValues["event"] != `{"n":1}` {
		t.Fatalf("stream holds %v, want only the first event", es)
	}
	if got, err := c.Do(ctx, c.B().Get().Key(dedup).Build()).ToString(); err != nil || got != id1 {
		t.Errorf("dedup key %s = %q, %v; want %s", dedup, got, err, id1)
	}
	// The default window is 24h (up to the time these calls took), and the
	// duplicate did not restart it.
	if ttl1 <= 23*time.Hour || ttl1 > producer.DefaultIdempotencyWindow {
		t.Errorf("dedup key TTL %s after the first publish, want the 24h window", ttl1)
	}
	if ttl2 := pttl(t, c, dedup); ttl2 > ttl1 {
		t.Errorf("dedup key TTL went from %s to %s: a duplicate extended the window", ttl1, ttl2)
	}
}

// TestPublishOnceAfterTheWindow: once the window has passed, the key adds
// a new entry. The test waits for Redis to expire the key rather than for
// a wall-clock time.
func TestPublishOnceAfterTheWindow(t *testing.T) {
	c := redistest.Client(t)
	s := redistest.Name(t, "events")
	p, err := producer.New(producer.Redis(c, s), producer.WithIdempotencyWindow(producer.MinIdempotencyWindow))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	id1, first, err := p.PublishOnceJSON(ctx, "k", []byte(`{"n":1}`))
	if err != nil || !first {
		t.Fatalf("first publish: %v, %v", first, err)
	}
	dedup := ikeys.Idempotency(s, "k")
	if ttl := pttl(t, c, dedup); ttl <= 0 || ttl > time.Second {
		t.Fatalf("dedup key TTL %s, want at most the 1s window", ttl)
	}
	deadline := time.Now().Add(30 * time.Second)
	for pttl(t, c, dedup) != -2*time.Millisecond { // -2: no such key
		if time.Now().After(deadline) {
			t.Fatalf("dedup key %s still there after 30s of a 1s window", dedup)
		}
		time.Sleep(50 * time.Millisecond)
	}
	id2, first, err := p.PublishOnceJSON(ctx, "k", []byte(`{"n":2}`))
	if err != nil || !first || id2 == id1 {
		t.Fatalf("publish after the window: %s, %v, %v; want a new entry", id2, first, err)
	}
	if es := entries(t, c, s); len(es) != 2 || es[0].ID != id1 || es[1].ID != id2 {
		t.Errorf("stream holds %v, want %s and %s", es, id1, id2)
	}
}

// TestPublishOnceKeysAreIndependent: different keys add different
// entries, and one key on two streams is two keys.
func TestPublishOnceKeysAreIndependent(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := t.Context()
	ids := map[string]bool{}
	for _, k := range []string{"a", "b", "a:b", "a%3Ab", "{b}"} {
		id, first, err := p.PublishOnceJSON(ctx, k, []byte(`{"key":"x"}`))
		if err != nil || !first || ids[id] {
			t.Fatalf("key %q: %s, %v, %v; want a new entry", k, id, first, err)
		}
		ids[id] = true
	}
	if es := entries(t, c, s); len(es) != 5 {
		t.Errorf("%d entries for 5 keys, want 5", len(es))
	}
	other, err := producer.New(producer.Redis(c, s+"-other"))
	if err != nil {
		t.Fatal(err)
	}
	if _, first, err := other.PublishOnceJSON(ctx, "a", []byte(`{}`)); err != nil || !first {
		t.Errorf("key a on another stream: %v, %v; want a new entry", first, err)
	}
}

// TestPublishOnceRefuses: bad keys, windows and events, and a Stream
// without the capability, are refused with errors saying what was wrong,
// and nothing is written.
func TestPublishOnceRefuses(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := t.Context()
	for _, tc := range []struct {
		key   string
		event string
		is    error
		want  string
	}{
		{"", `{}`, producer.ErrInvalidIdempotency, "the idempotency key is empty"},
		{strings.Repeat("k", producer.MaxIdempotencyKeyBytes+1), `{}`, producer.ErrInvalidIdempotency, "the idempotency key is 257 bytes, longer than the limit of 256"},
		{"k", `[1]`, producer.ErrInvalidEvent, "want a JSON object, got an array"},
	} {
		if _, _, err := p.PublishOnceJSON(ctx, tc.key, []byte(tc.event)); !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("PublishOnceJSON(%.20q, %s) = %v, want %v saying %q", tc.key, tc.event, err, tc.is, tc.want)
		}
	}
	if _, _, err := p.PublishOnce(ctx, "k", []int{1}); !errors.Is(err, producer.ErrInvalidEvent) {
		t.Errorf("PublishOnce([]int) = %v, want ErrInvalidEvent", err)
	}
	for _, tc := range []struct {
		window time.Duration
		want   string
	}{
		{0, "the idempotency window 0s is shorter than 1s"},
		{999 * time.Millisecond, "the idempotency window 999ms is shorter than 1s"},
		{producer.MaxIdempotencyWindow + time.Millisecond, "is longer than 30 days (720h)"},
	} {
		_, err := producer.New(producer.Redis(c, s), producer.WithIdempotencyWindow(tc.window))
		if !errors.Is(err, producer.ErrInvalidIdempotency) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(WithIdempotencyWindow(%s)) = %v, want ErrInvalidIdempotency saying %q", tc.window, err, tc.want)
		}
		// RedisStream checks too, for callers that use it directly.
		_, _, err = producer.Redis(c, s).PublishOnce(ctx, "k", tc.window, map[string]string{"event": "{}"})
		if !errors.Is(err, producer.ErrInvalidIdempotency) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("RedisStream.PublishOnce(window %s) = %v, want ErrInvalidIdempotency saying %q", tc.window, err, tc.want)
		}
	}
	if _, _, err := producer.Redis(c, s).PublishOnce(ctx, "k", time.Hour, nil); err == nil || !strings.Contains(err.Error(), "no fields") {
		t.Errorf("RedisStream.PublishOnce(no fields) = %v, want an error saying so", err)
	}
	plain, err := producer.New(&failingStream{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := plain.PublishOnceJSON(ctx, "k", []byte(`{}`)); !errors.Is(err, producer.ErrNotIdempotent) || !strings.Contains(err.Error(), "*producer_test.failingStream has no PublishOnce") {
		t.Errorf("PublishOnceJSON on a plain Stream = %v, want ErrNotIdempotent naming the type", err)
	}
	if es := entries(t, c, s); len(es) != 0 {
		t.Errorf("%d entries written by refused publishes, want none", len(es))
	}
	if n := pttl(t, c, ikeys.Idempotency(s, "k")); n != -2*time.Millisecond {
		t.Errorf("a refused publish left a dedup key (PTTL %s)", n)
	}
	// The bounds themselves are accepted, and the window is the key's TTL.
	for _, w := range []time.Duration{producer.MinIdempotencyWindow, producer.MaxIdempotencyWindow} {
		q, err := producer.New(producer.Redis(c, s), producer.WithIdempotencyWindow(w))
		if err != nil {
			t.Fatalf("window %s: %v", w, err)
		}
		key := "bound-" + w.String()
		if _, first, err := q.PublishOnceJSON(ctx, key, []byte(`{}`)); err != nil || !first {
			t.Fatalf("window %s: %v, %v", w, first, err)
		}
		if ttl := pttl(t, c, ikeys.Idempotency(s, key)); ttl <= 0 || ttl > w {
			t.Errorf("window %s: dedup key TTL %s", w, ttl)
		}
	}
	if _, first, err := p.PublishOnceJSON(ctx, strings.Repeat("k", producer.MaxIdempotencyKeyBytes), []byte(`{}`)); err != nil || !first {
		t.Errorf("a key of exactly %d bytes: %v, %v", producer.MaxIdempotencyKeyBytes, first, err)
	}
}

// TestPublishOnceFailedXADDLeavesNoKey: when the XADD fails inside the
// script (the stream's key holds a string), no dedup key is left claiming
// an entry that does not exist, so a publish once the stream is fixed
// adds the event.
func TestPublishOnceFailedXADDLeavesNoKey(t *testing.T) {
	p, c, s := newProducer(t)
	ctx := t.Context()
	if err := c.Do(ctx, c.B().Set().Key(s).Value("not a stream").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := p.PublishOnceJSON(ctx, "k", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "WRONGTYPE") {
		t.Fatalf("PublishOnceJSON onto a string key = %v, want WRONGTYPE", err)
	}
	if n := pttl(t, c, ikeys.Idempotency(s, "k")); n != -2*time.Millisecond {
		t.Fatalf("the failed publish left a dedup key (PTTL %s)", n)
	}
	if err := c.Do(ctx, c.B().Del().Key(s).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	id, first, err := p.PublishOnceJSON(ctx, "k", []byte(`{}`))
	if err != nil || !first {
		t.Fatalf("publish after the stream was fixed: %v, %v", first, err)
	}
	if es := entries(t, c, s); len(es) != 1 || es[0].ID != id {
		t.Errorf("stream holds %v, want %s", es, id)
	}
}

// TestPublishOnceCarriesTheTraceContext: the entry PublishOnce adds has
// the fields Publish writes, trace context included.
func TestPublishOnceCarriesTheTraceContext(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	p, c, s := newProducer(t)
	if _, _, err := p.PublishOnceJSON(traceCtx(t, tp), "k", []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := p.PublishJSON(traceCtx(t, tp), []byte(`{"a":1}`)); err != nil {
		t.Fatal(err)
	}
	es := entries(t, c, s)
	if len(es) != 2 || es[0].FieldValues["traceparent"] != tp {
		t.Fatalf("entries %v, want the first carrying traceparent %s", es, tp)
	}
	if got, want := keys(es[0].FieldValues), keys(es[1].FieldValues); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Errorf("PublishOnce wrote fields %v, Publish writes %v", got, want)
	}
}

// TestPublishOnceOnTheFake: relaytest.Stream deduplicates as Redis does,
// on its own clock, so a test steps over the window without waiting.
func TestPublishOnceOnTheFake(t *testing.T) {
	clock := relaytest.NewManualClock(time.Unix(1_700_000_000, 0))
	fake := relaytest.NewStream(relaytest.WithClock(clock))
	p, err := producer.New(fake, producer.WithIdempotencyWindow(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	results := race(16, func(int) publishResult {
		id, first, err := p.PublishOnceJSON(ctx, "k", []byte(`{}`))
		return publishResult{id, first, err}
	})
	for _, r := range results {
		if r.err != nil || r.id != results[0].id {
			t.Fatalf("results %v, want one id", results)
		}
	}
	clock.Advance(time.Minute - time.Millisecond)
	if id, first, err := p.PublishOnceJSON(ctx, "k", []byte(`{}`)); err != nil || first || id != results[0].id {
		t.Errorf("within the window: %s, %v, %v; want the first id", id, first, err)
	}
	if _, first, err := p.PublishOnceJSON(ctx, "other", []byte(`{}`)); err != nil || !first {
		t.Errorf("another key: %v, %v; want a new entry", first, err)
	}
	clock.Advance(time.Millisecond)
	if id, first, err := p.PublishOnceJSON(ctx, "k", []byte(`{}`)); err != nil || !first || id == results[0].id {
		t.Errorf("after the window: %s, %v, %v; want a new entry", id, first, err)
	}
	if fake.Len() != 3 {
		t.Errorf("%d entries, want 3", fake.Len())
	}
	if _, _, err := fake.PublishOnce(ctx, "", time.Minute, map[string]string{"event": "{}"}); !errors.Is(err, producer.ErrInvalidIdempotency) {
		t.Errorf("the fake takes an empty key: %v", err)
	}
}

// TestPublishOnceOnRedisCluster: on a 3-master cluster, a hash-tagged
// stream and its dedup key share a slot, so 16 racing publishers add one
// entry; an untagged stream is refused with an error naming the fix
// (rueidis would otherwise panic on the cross-slot script).
func TestPublishOnceOnRedisCluster(t *testing.T) {
	cl := topology.NewCluster(t)
	c := topology.Connect(t, cl.ClientOption())
	if c.Mode() != rueidis.ClientModeCluster {
		t.Fatalf("client mode %s, want cluster", c.Mode())
	}
	s := "{" + redistest.Name(t, "orders") + "}.events"
	p, err := producer.New(producer.Redis(c, s))
	if err != nil {
		t.Fatal(err)
	}
	results := race(16, func(int) publishResult {
		id, first, err := p.PublishOnceJSON(t.Context(), "order-7", []byte(`{}`))
		return publishResult{id, first, err}
	})
	checkOneEntry(t, c, s, results)
	slot, err := c.Do(t.Context(), c.B().ClusterKeyslot().Key(ikeys.Idempotency(s, "order-7")).Build()).AsInt64()
	if err != nil || uint16(slot) != ikeys.Slot(s) {
		t.Errorf("CLUSTER KEYSLOT of the dedup key = %d, %v; want the stream's slot %d", slot, err, ikeys.Slot(s))
	}

	untagged := redistest.Name(t, "plain")
	q, err := producer.New(producer.Redis(c, untagged))
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := q.PublishOnceJSON(t.Context(), "order-7", []byte(`{}`)); err == nil || !strings.Contains(err.Error(), "needs a hash tag, such as {"+untagged+"}") {
		t.Errorf("PublishOnceJSON to an untagged stream on a cluster = %v, want an error naming the hash tag", err)
	}
}

// pttl returns the PTTL of key: -2ms when there is no such key.
func pttl(t *testing.T, c rueidis.Client, key string) time.Duration {
	t.Helper()
	n, err := c.Do(context.Background(), c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil {
		t.Fatalf("PTTL %s: %v", key, err)
	}
	return time.Duration(n) * time.Millisecond
}
