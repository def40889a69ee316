package redisdlq_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/internal/keys"
)

// TestReplayHistory: each replay that did not succeed is counted with its
// time, result and error, beside the DLQ with the retention as its TTL;
// deleting the entry deletes its history.
func TestReplayHistory(t *testing.T) {
	t.Parallel()
	s, c, src := newStore(t)
	ctx := t.Context()
	e := write(t, s, entryFor(src))
	other := write(t, s, entryFor(src))
	if r, err := s.Replays(ctx, e.ID); err != nil || r != (dlq.Replays{}) {
		t.Fatalf("history of an entry never replayed: %+v, %v; want zero", r, err)
	}
	first := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	if _, err := s.RecordReplay(ctx, e.ID, first, dlq.ReplayFailed, "handler exited with code 3", time.Hour); err != nil {
		t.Fatal(err)
	}
	second := first.Add(time.Minute)
	got, err := s.RecordReplay(ctx, e.ID, second, dlq.ReplayRefused, "the app is unavailable", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	want := dlq.Replays{Count: 2, LastAt: second, LastResult: dlq.ReplayRefused, LastError: "the app is unavailable"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("RecordReplay (-want +got):\n%s", diff)
	}
	read, err := s.Replays(ctx, e.ID)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, read); diff != "" {
		t.Errorf("Replays (-want +got):\n%s", diff)
	}
	all, err := s.ReplaysOf(ctx, []string{other.ID, e.ID})
	if err != nil || len(all) != 2 || all[0] != (dlq.Replays{}) || all[1] != want {
		t.Errorf("ReplaysOf: %+v, %v", all, err)
	}
	key := keys.DLQReplays(src, e.ID)
	ttl, err := c.Do(ctx, c.B().Pttl().Key(key).Build()).AsInt64()
	if err != nil || ttl <= 0 || ttl > time.Hour.Milliseconds() {
		t.Errorf("history TTL %dms (%v), want at most the retention given (1h)", ttl, err)
	}
	if k := keys.DLQReplays("{orders}", e.ID); keys.Slot(k) != keys.Slot("{orders}") {
		t.Errorf("history key %s is not in its stream's hash slot", k)
	}
	if err := s.Delete(ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Do(ctx, c.B().Exists().Key(key).Build()).AsInt64(); err != nil || n != 0 {
		t.Errorf("the history outlived its entry's deletion (%d, %v)", n, err)
	}
	if _, err := s.RecordReplay(ctx, "nope", first, dlq.ReplayFailed, "x", 0); err == nil {
		t.Error("RecordReplay took an id that is not a stream id")
	}
}
