package redisstream_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// consumers lists the consumers of f's group (XINFO CONSUMERS), sorted.
func (f fixture) consumers(t *testing.T) []string {
	t.Helper()
	rows, err := f.do(t, f.c.B().XinfoConsumers().Key(f.stream).Group(f.group).Build()).ToArray()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rows {
		m, err := r.AsStrMap()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, m["name"])
	}
	slices.Sort(out)
	return out
}

// TestPruneConsumers: a consumer idle long enough with nothing pending is
// removed; one with an entry pending, the caller's own and a recently
// active one are kept, and the pending entry stays pending.
func TestPruneConsumers(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := t.Context()
	own := f.source(t, "own")
	f.publishFast(t, 3)
	read := func(consumer string) string {
		res, err := f.do(t, f.c.B().Xreadgroup().Group(f.group, consumer).Count(1).Streams().Key(f.stream).Id(">").Build()).AsXRead()
		if err != nil || len(res[f.stream]) != 1 {
			t.Fatalf("read as %s: %v, %v", consumer, res, err)
		}
		return res[f.stream][0].ID
	}
	busy := read("busy")
	f.ack(t, f.group, read("gone"))
	f.ack(t, f.group, read("own"))
	time.Sleep(100 * time.Millisecond)
	// Active just now: idle for less than the threshold.
	f.do(t, f.c.B().XgroupCreateconsumer().Key(f.stream).Group(f.group).Consumer("fresh").Build())

	if removed, err := own.PruneConsumers(ctx, time.Hour); err != nil || len(removed) != 0 {
		t.Errorf("PruneConsumers(1h) = %v, %v; want nothing removed", removed, err)
	}
	removed, err := own.PruneConsumers(ctx, 50*time.Millisecond)
	if err != nil || !slices.Equal(removed, []string{"gone"}) {
		t.Errorf("PruneConsumers(50ms) = %v, %v; want [gone]", removed, err)
	}
	if got := f.consumers(t); !slices.Equal(got, []string{"busy", "fresh", "own"}) {
		t.Errorf("consumers left %v, want busy, fresh, own", got)
	}
	if pel := f.pel(t); len(pel) != 1 || pel[busy].consumer != "busy" {
		t.Errorf("PEL %v, want only %s, pending for busy", pel, busy)
	}
	if _, err := own.PruneConsumers(ctx, 0); err == nil {
		t.Error("PruneConsumers(0) = nil error, want one")
	}
	other := redisstream.New(f.c, f.stream, "nogroup", "own")
	if _, err := other.PruneConsumers(ctx, time.Millisecond); !errors.Is(err, stream.ErrNoGroup) {
		t.Errorf("PruneConsumers of a missing group = %v, want ErrNoGroup", err)
	}
}
