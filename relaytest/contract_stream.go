package relaytest

import (
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/stream"
)

// StreamSourceHarness is one stream and consumer group under test, for
// TestStreamSource. Every harness must have a stream and group of its own
// (UniqueName), with the group already created from id 0.
type StreamSourceHarness struct {
	// Publish appends an entry with fields to the harness's stream (XADD)
	// and returns its id; producers publish, not the source.
	Publish func(t *testing.T, fields map[string]string) string
	// Consumer returns the source of consumer name on the harness's stream
	// and group. The suite asks for a few names; every source it gets shares
	// the group's PEL. Read should block briefly (tens of milliseconds):
	// the suite reads when nothing is new and expects (nil, nil).
	Consumer func(t *testing.T, name string) relay.StreamSource
	// Ack acknowledges ids in the harness's group (XACK), as a StateStore's
	// settlement does: a source does not acknowledge.
	Ack func(t *testing.T, ids ...string)
	// Delete removes entries from the stream while they may be pending, as
	// XDEL by an operator or an unsafe trim would.
	Delete func(t *testing.T, ids ...string)
	// Advance lets at least d of PEL idle time pass: AdvanceManual for a
	// source on a ManualClock, AdvanceByPolling for one on real time.
	Advance func(t *testing.T, d time.Duration)
	// Short is the idle threshold the suite lets pass with Advance. On real
	// time it must be far longer than a few calls to the source take, since
	// the suite asserts that an entry just claimed or heartbeated is not yet
	// idle for Short; 250ms suits a local Redis.
	Short time.Duration
}

// TestStreamSource runs the contract of relay.StreamSource, and of
// relay.PendingReporter, relay.OwnerChecker and relay.Pinger when the
// sources implement them
// (docs/delivery.md), against the harnesses newHarness returns, one per
// parallel sub-test.
//
// It covers: Read returning each published entry once, in order, with its
// fields and delivery count 1, count honoured and (nil, nil) when nothing
// is new; entries split between consumers of the group; acknowledged
// entries (Ack of the harness, as a settlement makes) no longer reclaimed,
// heartbeated or pending; Reclaim taking only entries idle for minIdle,
// from any consumer, resetting their idle time and raising their delivery
// count, at most max per call, walking the PEL across calls until done;
// Reclaim reporting PEL ids whose entry was deleted, once, and clearing
// them; Heartbeat keeping entries from being reclaimed without raising
// their delivery count, taking them over from another consumer, and
// returning, in the order asked, the ids that are not pending
// (acknowledged, never delivered, unknown, or whose entry was deleted);
// Pending counting the PEL; Owned naming the entries pending for its
// consumer alone; and concurrent readers never sharing an entry.
func TestStreamSource(t *testing.T, newHarness func(t *testing.T) StreamSourceHarness) {
	for _, c := range streamCases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			h := newHarness(t)
			if h.Publish == nil || h.Consumer == nil || h.Ack == nil || h.Delete == nil || h.Advance == nil || h.Short <= 0 {
				t.Fatal("relaytest: StreamSourceHarness needs Publish, Consumer, Ack, Delete, Advance and a positive Short")
			}
			c.run(t, h)
		})
	}
}

// streamCases are the cases of TestStreamSource, in the order they run. Each
// is a function below named stream<case>; a failure names the calling test
// and the case, such as TestSourceContract/PublishThenRead.
var streamCases = []struct {
	name string
	run  func(t *testing.T, h StreamSourceHarness)
}{
	{"PublishThenRead", streamPublishThenRead},
	{"ReadHonoursCount", streamReadHonoursCount},
	{"ConsumersShareTheGroup", streamConsumersShareTheGroup},
	{"AckedEntriesLeaveThePEL", streamAckedEntriesLeaveThePEL},
	{"ReclaimTakesIdleEntries", streamReclaimTakesIdleEntries},
	{"ReclaimReportsDeletedEntries", streamReclaimReportsDeletedEntries},
	{"Heartbeat", streamHeartbeat},
	{"HeartbeatReportsWhatIsGone", streamHeartbeatReportsWhatIsGone},
	{"Pending", streamPending},
	{"Ping", streamPing},
	{"Owned", streamOwned},
	{"ConcurrentReadersNeverShare", streamConcurrentReadersNeverShare},
	{"ReclaimIsBounded", streamReclaimIsBounded},
	{"InvalidArguments", streamInvalidArguments},
}

func streamPublishThenRead(t *testing.T, h StreamSourceHarness) {
	c1 := h.Consumer(t, "c1")
	want := []map[string]string{
		{"event": `{"n":0}`},
		{"event": `{"n":1,"s":"ü\nx"}`, "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		{"event": ""},
	}
	var ids []string
	for _, f := range want {
		ids = append(ids, publish(t, h, f))
	}
	for i := 1; i < len(ids); i++ {
		if stream.CompareID(ids[i-1], ids[i]) >= 0 {
			t.Fatalf("ids %v are not strictly increasing", ids)
		}
	}
	msgs := read(t, c1, 10)
	if got := msgIDs(msgs); !slices.Equal(got, ids) {
		t.Fatalf("Read = %v, want %v", got, ids)
	}
	for i, m := range msgs {
		if !maps.Equal(m.Fields, want[i]) || m.Deliveries != 1 {
			t.Errorf("entry %s = %v with %d deliveries, want %v with 1", m.ID, m.Fields, m.Deliveries, want[i])
		}
	}
	if again := read(t, c1, 10); len(again) != 0 {
		t.Errorf("second Read = %v, want nothing new", msgIDs(again))
	}
}

func streamReadHonoursCount(t *testing.T, h StreamSourceHarness) {
	c1 := h.Consumer(t, "c1")
	ids := publishN(t, h, 5)
	if got := msgIDs(read(t, c1, 2)); !slices.Equal(got, ids[:2]) {
		t.Fatalf("Read(2) = %v, want %v", got, ids[:2])
	}
	if got := msgIDs(read(t, c1, 10)); !slices.Equal(got, ids[2:]) {
		t.Fatalf("Read(10) = %v, want %v", got, ids[2:])
	}
}

func streamConsumersShareTheGroup(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	first := publishN(t, h, 2)
	if got := msgIDs(read(t, c1, 10)); !slices.Equal(got, first) {
		t.Fatalf("c1 Read = %v, want %v", got, first)
	}
	// What c1 was given is not new for c2.
	if got := read(t, c2, 10); len(got) != 0 {
		t.Fatalf("c2 Read = %v, want nothing new", msgIDs(got))
	}
	second := publishN(t, h, 1)
	if got := msgIDs(read(t, c2, 10)); !slices.Equal(got, second) {
		t.Fatalf("c2 Read = %v, want %v", got, second)
	}
}

// streamAckedEntriesLeaveThePEL: entries acknowledged (by any consumer's
// settlement) are neither reclaimed nor heartbeated; the others still are.
func streamAckedEntriesLeaveThePEL(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	ids := publishN(t, h, 3)
	read(t, c1, 10)
	h.Ack(t, ids[0])
	h.Ack(t, ids[1])
	h.Advance(t, h.Short)
	msgs, deleted := reclaim(t, c2, h.Short)
	if got := msgIDs(msgs); !slices.Equal(got, ids[2:]) || len(deleted) != 0 {
		t.Fatalf("Reclaim = %v, deleted %v; want only the unacked %v", got, deleted, ids[2:])
	}
	if gone := heartbeat(t, c2, ids...); !slices.Equal(gone, ids[:2]) {
		t.Errorf("Heartbeat(%v) = %v gone, want the acknowledged %v", ids, gone, ids[:2])
	}
}

func streamReclaimTakesIdleEntries(t *testing.T, h StreamSourceHarness) {
	c1, c2, c3 := h.Consumer(t, "c1"), h.Consumer(t, "c2"), h.Consumer(t, "c3")
	ids := publishN(t, h, 2)
	read(t, c1, 10)
	if msgs, deleted := reclaim(t, c2, time.Hour); len(msgs) != 0 || len(deleted) != 0 {
		t.Fatalf("Reclaim(1h) = %v, %v; want nothing idle that long", msgIDs(msgs), deleted)
	}
	h.Advance(t, h.Short)
	msgs, _ := reclaim(t, c2, h.Short)
	if got := msgIDs(msgs); !slices.Equal(got, ids) {
		t.Fatalf("Reclaim = %v, want %v", got, ids)
	}
	for i, m := range msgs {
		if m.Fields["n"] != strconv.Itoa(i) || m.Deliveries != 2 {
			t.Errorf("reclaimed %s = %v with %d deliveries, want n=%d and 2 deliveries", m.ID, m.Fields, m.Deliveries, i)
		}
	}
	// Claiming reset the idle time.
	if msgs, _ := reclaim(t, c3, h.Short); len(msgs) != 0 {
		t.Errorf("Reclaim right after a reclaim = %v, want nothing idle", msgIDs(msgs))
	}
	// Reclaims from any consumer count deliveries on.
	for deliveries := int64(3); deliveries <= 4; deliveries++ {
		h.Advance(t, h.Short)
		msgs, _ := reclaim(t, c3, h.Short)
		if len(msgs) != 2 || msgs[0].Deliveries != deliveries || msgs[1].Deliveries != deliveries {
			t.Fatalf("Reclaim = %+v, want both entries with %d deliveries", msgs, deliveries)
		}
	}
}

func streamReclaimReportsDeletedEntries(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	all := publishN(t, h, 5)
	read(t, c1, 10)
	gone := []string{all[1], all[3]}
	h.Delete(t, gone...)
	h.Advance(t, h.Short)
	msgs, deleted := reclaim(t, c2, h.Short)
	kept := []string{all[0], all[2], all[4]}
	if got := msgIDs(msgs); !slices.Equal(got, kept) {
		t.Errorf("reclaimed %v, want %v", got, kept)
	}
	if !slices.Equal(deleted, gone) {
		t.Errorf("deleted %v, want %v", deleted, gone)
	}
	for _, m := range msgs {
		if m.Fields == nil {
			t.Errorf("reclaimed %s without fields", m.ID)
		}
	}
	// The dangling references were cleared: reported once only.
	h.Advance(t, h.Short)
	msgs, deleted = reclaim(t, c2, h.Short)
	if got := msgIDs(msgs); !slices.Equal(got, kept) || len(deleted) != 0 {
		t.Errorf("second Reclaim = %v, deleted %v; want %v and nothing deleted", got, deleted, kept)
	}
}

func streamHeartbeat(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	ids := publishN(t, h, 2)
	live, stuck := ids[0], ids[1]
	read(t, c1, 10)
	h.Advance(t, h.Short)
	if gone := heartbeat(t, c1, live, "1-1"); !slices.Equal(gone, []string{"1-1"}) { // 1-1 was never pending
		t.Errorf("Heartbeat(%s, 1-1) = %v gone, want [1-1]", live, gone)
	}
	if gone, err := c1.Heartbeat(t.Context()); err != nil || len(gone) != 0 {
		t.Errorf("Heartbeat of no ids = %v, %v; want nothing", gone, err)
	}
	msgs, _ := reclaim(t, c2, h.Short)
	if got := msgIDs(msgs); !slices.Equal(got, []string{stuck}) {
		t.Fatalf("Reclaim after a heartbeat of %s = %v, want only %s", live, got, stuck)
	}
	// A heartbeat is not a delivery.
	h.Advance(t, h.Short)
	msgs, _ = reclaim(t, c2, h.Short)
	for _, m := range msgs {
		if m.ID == live && m.Deliveries != 2 {
			t.Errorf("%s has %d deliveries after a read, a heartbeat and a reclaim, want 2", live, m.Deliveries)
		}
	}
	if !slices.Contains(msgIDs(msgs), live) {
		t.Errorf("Reclaim without a heartbeat = %v, want %s included", msgIDs(msgs), live)
	}
}

// streamHeartbeatReportsWhatIsGone: Heartbeat returns, in the order asked,
// the ids that are not pending in the group, for the Engine to end what it
// runs for them: acknowledged, never delivered, never added, or whose
// stream entry was deleted (dropped from the PEL as it goes). An entry
// another consumer holds is pending: it is taken over, not gone.
func streamHeartbeatReportsWhatIsGone(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	ids := publishN(t, h, 4)
	acked, deleted, theirs, live := ids[0], ids[1], ids[2], ids[3]
	read(t, c1, 4)
	undelivered := publish(t, h, map[string]string{"n": "undelivered"})
	h.Ack(t, acked)
	h.Delete(t, deleted)
	if gone := heartbeat(t, c2, theirs); len(gone) != 0 { // c2 takes it over
		t.Fatalf("Heartbeat of another consumer's pending entry = %v gone, want none", gone)
	}
	asked := []string{live, undelivered, acked, theirs, "1-1", deleted}
	want := []string{undelivered, acked, "1-1", deleted}
	if gone := heartbeat(t, c1, asked...); !slices.Equal(gone, want) {
		t.Errorf("Heartbeat(%v) = %v gone, want %v", asked, gone, want)
	}
	// What was gone stays gone; the deleted entry's reference was dropped.
	if gone := heartbeat(t, c1, deleted, live); !slices.Equal(gone, []string{deleted}) {
		t.Errorf("second Heartbeat = %v gone, want [%s]", gone, deleted)
	}
	h.Advance(t, h.Short)
	msgs, del := reclaim(t, c2, h.Short)
	if got := msgIDs(msgs); !slices.Equal(got, []string{theirs, live}) || len(del) != 0 {
		t.Errorf("Reclaim = %v, deleted %v; want %v and nothing deleted", got, del, []string{theirs, live})
	}
}

func streamPending(t *testing.T, h StreamSourceHarness) {
	c1 := h.Consumer(t, "c1")
	pr, ok := c1.(relay.PendingReporter)
	if !ok {
		t.Skip("the source is not a relay.PendingReporter")
	}
	ctx := t.Context()
	if n, age, err := pr.Pending(ctx); err != nil || n != 0 || age != 0 {
		t.Fatalf("Pending of an empty PEL = %d, %s, %v; want 0, 0", n, age, err)
	}
	ids := publishN(t, h, 3)
	read(t, c1, 10)
	h.Advance(t, h.Short)
	n, age, err := pr.Pending(ctx)
	if err != nil || n != 3 || age < h.Short {
		t.Fatalf("Pending = %d, %s, %v; want 3 entries, the oldest at least %s old", n, age, err, h.Short)
	}
	h.Ack(t, ids...)
	if n, age, err := pr.Pending(ctx); err != nil || n != 0 || age != 0 {
		t.Errorf("Pending after acking everything = %d, %s, %v; want 0, 0", n, age, err)
	}
}

func streamPing(t *testing.T, h StreamSourceHarness) {
	p, ok := h.Consumer(t, "c1").(relay.Pinger)
	if !ok {
		t.Skip("the source is not a relay.Pinger")
	}
	if err := p.Ping(t.Context()); err != nil {
		t.Errorf("Ping: %v", err)
	}
}

// streamOwned: Owned names the asked ids pending for its consumer
// (docs/delivery.md#held-messages), a pending entry whose stream entry was
// deleted included, and no others: acknowledged, taken over by another
// consumer, never delivered, unknown.
func streamOwned(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	oc1, ok := c1.(relay.OwnerChecker)
	if !ok {
		t.Skip("the source is not a relay.OwnerChecker")
	}
	oc2 := c2.(relay.OwnerChecker)
	ctx := t.Context()
	ids := publishN(t, h, 5)
	read(t, c1, 4) // ids[4] is never delivered
	h.Ack(t, ids[1])
	heartbeat(t, c2, ids[2]) // c2 takes it over
	h.Delete(t, ids[3])      // its PEL reference stays
	asked := append(slices.Clone(ids), "1-1")
	for _, c := range []struct {
		name string
		oc   relay.OwnerChecker
		want []string
	}{{"c1", oc1, []string{ids[0], ids[3]}}, {"c2", oc2, []string{ids[2]}}} {
		owned, err := c.oc.Owned(ctx, asked)
		if err != nil {
			t.Fatalf("%s Owned: %v", c.name, err)
		}
		got := slices.SortedFunc(maps.Keys(owned), stream.CompareID)
		if !slices.Equal(got, c.want) || slices.Contains(slices.Collect(maps.Values(owned)), false) {
			t.Errorf("%s Owned(%v) = %v, want %v true", c.name, asked, owned, c.want)
		}
	}
	if owned, err := oc1.Owned(ctx, nil); err != nil || len(owned) != 0 {
		t.Errorf("Owned of no ids = %v, %v; want none", owned, err)
	}
}

func streamConcurrentReadersNeverShare(t *testing.T, h StreamSourceHarness) {
	const n, readers = 60, 3
	ids := publishN(t, h, n)
	var mu sync.Mutex
	seen := map[string]string{}
	var wg sync.WaitGroup
	for r := range readers {
		c := h.Consumer(t, "reader"+strconv.Itoa(r))
		wg.Go(func() {
			for {
				msgs, err := c.Read(t.Context(), 7)
				if err != nil {
					t.Errorf("Read: %v", err)
					return
				}
				if len(msgs) == 0 {
					return
				}
				mu.Lock()
				for _, m := range msgs {
					if prev, dup := seen[m.ID]; dup {
						t.Errorf("%s delivered to %s and reader%d", m.ID, prev, r)
					}
					seen[m.ID] = "reader" + strconv.Itoa(r)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(seen) != n {
		t.Errorf("%d of %d entries delivered", len(seen), n)
	}
	for _, id := range ids {
		if _, ok := seen[id]; !ok {
			t.Errorf("%s never delivered", id)
		}
	}
}

func streamReclaimIsBounded(t *testing.T, h StreamSourceHarness) {
	c1, c2 := h.Consumer(t, "c1"), h.Consumer(t, "c2")
	ids := publishN(t, h, 5)
	read(t, c1, 10)
	h.Advance(t, h.Short)
	// Each call takes at most max entries and goes on where the last
	// stopped, until done says the walk reached the end of the PEL.
	var got []string
	for calls := 0; ; calls++ {
		if calls == 10 {
			t.Fatalf("no done after %d calls of Reclaim(max 2); reclaimed %v", calls, got)
		}
		msgs, deleted, done, err := c2.Reclaim(t.Context(), h.Short, 2)
		if err != nil || len(deleted) != 0 {
			t.Fatalf("Reclaim: %v, deleted %v", err, deleted)
		}
		if len(msgs) > 2 {
			t.Fatalf("Reclaim(max 2) returned %d entries", len(msgs))
		}
		got = append(got, msgIDs(msgs)...)
		if done {
			break
		}
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("one walk reclaimed %v, want each of %v once, in order", got, ids)
	}
	// The next walk starts over; nothing is idle again yet.
	if msgs, _, done, err := c2.Reclaim(t.Context(), h.Short, 2); err != nil || len(msgs) != 0 || !done {
		t.Errorf("Reclaim right after a walk = %v, done %v, %v; want nothing and done", msgIDs(msgs), done, err)
	}
}

func streamInvalidArguments(t *testing.T, h StreamSourceHarness) {
	c1 := h.Consumer(t, "c1")
	if _, err := c1.Read(t.Context(), 0); err == nil {
		t.Error("Read(0) succeeded, want an error")
	}
	if _, _, _, err := c1.Reclaim(t.Context(), time.Second, 0); err == nil {
		t.Error("Reclaim(max 0) succeeded, want an error")
	}
}

func publish(t *testing.T, h StreamSourceHarness, fields map[string]string) string {
	t.Helper()
	id := h.Publish(t, fields)
	if _, _, err := stream.ParseID(id); err != nil {
		t.Fatalf("Publish returned %v", err)
	}
	return id
}

// publishN appends n entries {"n": i} and returns their ids.
func publishN(t *testing.T, h StreamSourceHarness, n int) []string {
	t.Helper()
	ids := make([]string, n)
	for i := range n {
		ids[i] = publish(t, h, map[string]string{"n": strconv.Itoa(i)})
	}
	return ids
}

func read(t *testing.T, s relay.StreamSource, count int) []stream.Message {
	t.Helper()
	msgs, err := s.Read(t.Context(), count)
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	return msgs
}

// heartbeat heartbeats ids from s and returns those gone.
func heartbeat(t *testing.T, s relay.StreamSource, ids ...string) []string {
	t.Helper()
	gone, err := s.Heartbeat(t.Context(), ids...)
	if err != nil {
		t.Fatalf("Heartbeat(%v): %v", ids, err)
	}
	return gone
}

func reclaim(t *testing.T, s relay.StreamSource, minIdle time.Duration) ([]stream.Message, []string) {
	t.Helper()
	msgs, deleted, _, err := s.Reclaim(t.Context(), minIdle, 1000)
	if err != nil {
		t.Fatalf("Reclaim(%s): %v", minIdle, err)
	}
	return msgs, deleted
}

func msgIDs(msgs []stream.Message) []string {
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}
