package redisstream_test

import (
	"slices"
	"testing"
	"time"

	"github.com/relaydev/relay/stream/redisstream"
)

// TestReclaimClaimsAtMostMax walks one pass in bounded steps: each call
// claims at most max idle entries, in PEL order, continuing where the
// previous call stopped, and reports the end of the pass; what was not
// claimed yet stays with its old owner.
func TestReclaimClaimsAtMostMax(t *testing.T) {
	t.Parallel()
	f := setup(t)
	dead := f.source(t, "dead")
	c2 := f.source(t, "c2", redisstream.WithReclaimCount(4))
	ctx := t.Context()
	const minIdle = 50 * time.Millisecond

	want := f.publishN(t, dead, 12)
	read := time.Now()
	if _, err := dead.Read(ctx, 100); err != nil {
		t.Fatal(err)
	}
	f.waitIdle(t, minIdle, want...)

	msgs, deleted, done, err := c2.Reclaim(ctx, minIdle, 5)
	if err != nil || done || len(deleted) != 0 {
		t.Fatalf("first Reclaim: done %v, deleted %v, err %v; want a partial pass", done, deleted, err)
	}
	if !slices.Equal(ids(msgs), want[:5]) {
		t.Fatalf("first Reclaim claimed %v, want %v", ids(msgs), want[:5])
	}
	for _, m := range msgs {
		if m.Deliveries != 2 || m.Fields["n"] == "" {
			t.Errorf("%s: %+v, want its fields and 2 deliveries", m.ID, m)
		}
	}
	pel := f.pel(t)
	for i, id := range want {
		owner := "dead"
		if i < 5 {
			owner = "c2"
		}
		if pel[id].consumer != owner {
			t.Errorf("%s owned by %q after the first call, want %q", id, pel[id].consumer, owner)
		}
	}

	var rest []string
	for range 10 {
		msgs, _, done, err = c2.Reclaim(ctx, minIdle, 5)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) > 5 {
			t.Fatalf("Reclaim(5) claimed %d", len(msgs))
		}
		rest = append(rest, ids(msgs)...)
		if done {
			break
		}
	}
	if !done || !slices.Equal(rest, want[5:]) {
		t.Fatalf("rest of the pass claimed %v (done %v), want %v", rest, done, want[5:])
	}
	// The pass is over and every claim reset the idle time: a new pass
	// starts from the beginning and finds nothing idle for as long as
	// since the first read. Every claim came minIdle or more after that
	// read, so half of minIdle tells a reset idle time from one that was
	// not, however slow the machine made the calls above.
	msgs, deleted, done, err = c2.Reclaim(ctx, time.Since(read)-minIdle/2, 5)
	if err != nil || len(msgs) != 0 || len(deleted) != 0 || !done {
		t.Fatalf("next pass = %v, %v, done %v, %v; want nothing and done", ids(msgs), deleted, done, err)
	}
}

// TestReclaimBoundedReportsDeletedEntries: entries deleted while pending are
// reported, cleared from the PEL and do not count against max.
func TestReclaimBoundedReportsDeletedEntries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	dead := f.source(t, "dead")
	c2 := f.source(t, "c2")
	ctx := t.Context()
	const minIdle = 50 * time.Millisecond

	all := f.publishN(t, dead, 4)
	if _, err := dead.Read(ctx, 100); err != nil {
		t.Fatal(err)
	}
	f.do(t, f.c.B().Xdel().Key(f.stream).Id(all[0], all[2]).Build())
	f.waitIdle(t, minIdle, all[1], all[3])

	msgs, deleted, done, err := c2.Reclaim(ctx, minIdle, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(msgs), []string{all[1], all[3]}) {
		t.Errorf("claimed %v, want %v", ids(msgs), []string{all[1], all[3]})
	}
	slices.Sort(deleted)
	if !slices.Equal(deleted, []string{all[0], all[2]}) {
		t.Errorf("deleted %v, want %v", deleted, []string{all[0], all[2]})
	}
	if pel := f.pel(t); len(pel) != 2 {
		t.Errorf("PEL %v, want only the two claimed entries", pel)
	}
	if !done {
		t.Error("done = false; one call went around a PEL of four entries")
	}
}

func TestReclaimRefusesBadArguments(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c := f.source(t, "c")
	if _, _, _, err := c.Reclaim(t.Context(), time.Second, 0); err == nil {
		t.Error("max 0: no error")
	}
	if _, _, _, err := c.Reclaim(t.Context(), -time.Second, 1); err == nil {
		t.Error("negative minIdle: no error")
	}
}
