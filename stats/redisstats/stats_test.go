package redisstats_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// TestFeed: recorded outcomes reach the feed with the next flush, in
// order, with every field; a flush adds at most FeedBurst of them; the
// feed keeps about FeedLength; ReadFeed goes on after a given id and
// waits for new ones.
func TestFeed(t *testing.T) {
	rc := redistest.Client(t)
	ctx := t.Context()
	s := redistest.Name(t, "events")
	r := redisstats.NewRecorder(rc, s, "g")
	at := time.UnixMilli(1_800_000_000_123).UTC()
	r.Record(stats.Event{Time: at, Consumer: "w1", MessageID: "1-0", App: "shop", Handler: "orders.charge",
		Outcome: "failed", Result: "failure", Attempt: 1, MaxAttempts: 3, Duration: 1500 * time.Millisecond,
		Reason: "exit 1: card declined\nTraceback..."})
	r.Record(stats.Event{Time: at, MessageID: "1-0", App: "shop", Handler: "orders.audit", Outcome: "dead-lettered",
		DLQID: "5-0", Reason: strings.Repeat("x", 1000)})
	r.Add(stats.Received)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got, err := redisstats.ReadFeed(ctx, rc, s, "g", "0", 10, 0)
	if err != nil || len(got) != 2 {
		t.Fatalf("ReadFeed = %d events, %v; want 2", len(got), err)
	}
	first := got[0]
	first.ID = ""
	want := stats.Event{Time: at, Consumer: "w1", MessageID: "1-0", App: "shop", Handler: "orders.charge",
		Outcome: "failed", Result: "failure", Attempt: 1, MaxAttempts: 3, Duration: 1500 * time.Millisecond, Reason: "exit 1: card declined"}
	if first != want {
		t.Errorf("first event = %+v, want %+v (the reason cut at its first line)", first, want)
	}
	if got[1].DLQID != "5-0" || len(got[1].Reason) > 310 {
		t.Errorf("second event = %+v; want its DLQ id and a reason cut to about 300 bytes", got[1])
	}
	if c, err := redisstats.Read(ctx, rc, s, "g"); err != nil || c.Received != 1 {
		t.Errorf("counters flushed with the feed = %+v, %v", c, err)
	}

	// One flush adds at most FeedBurst events.
	for range stats.FeedBurst + 50 {
		r.Record(stats.Event{Time: at, Outcome: "succeeded"})
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := redisstats.ReadFeed(ctx, rc, s, "g", got[1].ID, 1000, 0)
	if err != nil || len(after) != stats.FeedBurst {
		t.Errorf("after a burst the feed has %d new events (%v), want %d", len(after), err, stats.FeedBurst)
	}
	latest, err := redisstats.LatestFeed(ctx, rc, s, "g", 1)
	if err != nil || len(latest) != 1 || latest[0].ID != after[len(after)-1].ID {
		t.Errorf("LatestFeed = %+v, %v; want the newest event", latest, err)
	}

	// A blocked read returns what arrives.
	done := make(chan []stats.Event, 1)
	go func() {
		evs, _ := redisstats.ReadFeed(context.Background(), rc, s, "g", "$", 10, 5*time.Second)
		done <- evs
	}()
	waitBlocked(t, rc)
	r.Record(stats.Event{Time: at, Outcome: "succeeded", MessageID: "9-9"})
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case evs := <-done:
		if len(evs) != 1 || evs[0].MessageID != "9-9" {
			t.Errorf("blocked ReadFeed = %+v, want the new event", evs)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("blocked ReadFeed did not return")
	}

	// The feed stays capped.
	for range 30 {
		for range stats.FeedBurst {
			r.Record(stats.Event{Time: at, Outcome: "succeeded"})
		}
		if err := r.Flush(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := rc.Do(ctx, rc.B().Xlen().Key("relay:feed:"+s+":g").Build()).AsInt64(); err != nil || n > 2*stats.FeedLength {
		t.Errorf("feed length %d (%v), want about %d", n, err, stats.FeedLength)
	}
}

// waitBlocked waits until a client of the server is blocked (the XREAD).
func waitBlocked(t *testing.T, rc rueidis.Client) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Second, "a blocked XREAD", func() bool {
		info, err := rc.Do(t.Context(), rc.B().Info().Section("clients").Build()).ToString()
		return err == nil && !strings.Contains(info, "blocked_clients:0")
	})
}
