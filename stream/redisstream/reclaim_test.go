package redisstream_test

import (
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/relaydev/relay/internal/testutil"
	"github.com/relaydev/relay/stream/redisstream"
)

func TestReclaimOnlyIdleEntries(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c1 := f.source(t, "c1")
	c2 := f.source(t, "c2")
	ctx := t.Context()
	const minIdle = 300 * time.Millisecond

	old := f.publishN(t, c1, 1)
	if _, err := c1.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	f.waitIdle(t, minIdle, old...)
	fresh := f.publishN(t, c1, 1)
	if _, err := c1.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}

	msgs, deleted, _, err := c2.Reclaim(ctx, minIdle, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(msgs), old) || len(deleted) != 0 {
		t.Fatalf("Reclaim = %v, %v; want %v and no deleted", ids(msgs), deleted, old)
	}
	if m := msgs[0]; m.Fields["n"] != "0" || m.Deliveries != 2 {
		t.Errorf("reclaimed %+v, want fields n=0 and 2 deliveries", m)
	}
	pel := f.pel(t)
	if pel[old[0]].consumer != "c2" || pel[fresh[0]].consumer != "c1" {
		t.Errorf("PEL owners %v, want %s on c2 and %s on c1", pel, old[0], fresh[0])
	}
}

func TestReclaimIteratesCursorPastCount(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c1 := f.source(t, "c1")
	c2 := f.source(t, "c2", redisstream.WithReclaimCount(2))
	ctx := t.Context()
	// Long enough that the first pass's claims cannot turn idle again
	// before the second pass, however loaded the machine.
	const minIdle = time.Second

	want := f.publishN(t, c1, 7)
	if _, err := c1.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	f.waitIdle(t, minIdle, want...)

	msgs, deleted, _, err := c2.Reclaim(ctx, minIdle, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(ids(msgs), want) || len(deleted) != 0 {
		t.Fatalf("Reclaim = %v, %v; want all of %v", ids(msgs), deleted, want)
	}
	for _, m := range msgs {
		if m.Deliveries != 2 {
			t.Errorf("%s: Deliveries = %d, want 2", m.ID, m.Deliveries)
		}
	}
	// Claiming reset the idle time: an immediate second pass finds nothing.
	msgs, deleted, _, err = c2.Reclaim(ctx, minIdle, 1000)
	if err != nil || len(msgs) != 0 || len(deleted) != 0 {
		t.Fatalf("second Reclaim = %v, %v, %v; want nothing", ids(msgs), deleted, err)
	}
}

func TestReclaimDeliveriesCount(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c1 := f.source(t, "c1")
	c2 := f.source(t, "c2")
	ctx := t.Context()
	const minIdle = 50 * time.Millisecond

	want := f.publishN(t, c1, 1)
	if _, err := c1.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	for deliveries := int64(2); deliveries <= 4; deliveries++ {
		f.waitIdle(t, minIdle, want...)
		msgs, _, _, err := c2.Reclaim(ctx, minIdle, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if len(msgs) != 1 || msgs[0].ID != want[0] || msgs[0].Deliveries != deliveries {
			t.Fatalf("Reclaim = %+v; want %s with %d deliveries", msgs, want[0], deliveries)
		}
	}
}

func TestReclaimReportsDeletedEntries(t *testing.T) {
	t.Parallel()
	for _, count := range []int{1, 100} {
		t.Run("count="+strconv.Itoa(count), func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			c1 := f.source(t, "c1")
			c2 := f.source(t, "c2", redisstream.WithReclaimCount(count))
			ctx := t.Context()
			const minIdle = 50 * time.Millisecond

			all := f.publishN(t, c1, 5)
			if _, err := c1.Read(ctx, 10); err != nil {
				t.Fatal(err)
			}
			gone := []string{all[1], all[3]}
			f.do(t, f.c.B().Xdel().Key(f.stream).Id(gone...).Build())
			f.waitIdle(t, minIdle, all...)

			msgs, deleted, _, err := c2.Reclaim(ctx, minIdle, 1000)
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{all[0], all[2], all[4]}; !slices.Equal(ids(msgs), want) {
				t.Errorf("claimed %v, want %v", ids(msgs), want)
			}
			if !slices.Equal(deleted, gone) {
				t.Errorf("deleted %v, want %v", deleted, gone)
			}
			for _, m := range msgs {
				if m.Fields == nil {
					t.Errorf("claimed %s without fields", m.ID)
				}
			}
			// No dangling PEL reference is left for the deleted ids.
			pel := f.pel(t)
			for _, id := range gone {
				if _, ok := pel[id]; ok {
					t.Errorf("deleted id %s still in the PEL: %v", id, pel)
				}
			}
			if len(pel) != 3 {
				t.Errorf("PEL = %v, want the 3 claimed entries", pel)
			}
			n, _, err := c2.Pending(ctx)
			if err != nil || n != 3 {
				t.Errorf("Pending = %d, %v; want 3", n, err)
			}
		})
	}
}

func TestHeartbeatPreventsReclaim(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c1 := f.source(t, "c1")
	c2 := f.source(t, "c2")
	ctx := t.Context()
	const minIdle = 150 * time.Millisecond

	entries := f.publishN(t, c1, 2)
	live, stuck := entries[0], entries[1]
	if _, err := c1.Read(ctx, 10); err != nil {
		t.Fatal(err)
	}
	// c1 keeps working on live; stuck is abandoned and must be reclaimed.
	testutil.WaitFor(t, 5*time.Second, "the abandoned entry reclaimed", func() bool {
		if gone, err := c1.Heartbeat(ctx, live); err != nil || len(gone) != 0 {
			t.Fatalf("Heartbeat(%s) = %v gone, %v; want it pending", live, gone, err)
		}
		msgs, _, _, err := c2.Reclaim(ctx, minIdle, 1000)
		if err != nil {
			t.Fatal(err)
		}
		if slices.Contains(ids(msgs), live) {
			t.Fatalf("reclaimed %s despite its heartbeat", live)
		}
		return slices.Contains(ids(msgs), stuck)
	})

	pel := f.pel(t)
	if got := pel[live]; got != (pelEntry{consumer: "c1", deliveries: 1}) {
		t.Errorf("heartbeated entry = %+v, want c1 with 1 delivery", got)
	}
	if got := pel[stuck]; got != (pelEntry{consumer: "c2", deliveries: 2}) {
		t.Errorf("reclaimed entry = %+v, want c2 with 2 deliveries", got)
	}
	if gone, err := c1.Heartbeat(ctx); err != nil || len(gone) != 0 {
		t.Errorf("Heartbeat() = %v, %v; want nothing", gone, err)
	}
	if gone, err := c1.Heartbeat(ctx, "1-1"); err != nil || !slices.Equal(gone, []string{"1-1"}) {
		t.Errorf("Heartbeat of an id not pending = %v, %v; want it gone", gone, err)
	}
}

func TestNewPanicsOnInvalidOption(t *testing.T) {
	f := setup(t)
	for name, opt := range map[string]redisstream.Option{
		"block":        redisstream.WithBlock(0),
		"reclaimCount": redisstream.WithReclaimCount(0),
		"trimLimit":    redisstream.WithTrimLimit(999),
	} {
		t.Run(name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Error("New did not panic")
				}
			}()
			redisstream.New(f.c, f.stream, f.group, "c1", opt)
		})
	}
}

func TestReclaimBoundedPassResumes(t *testing.T) {
	t.Parallel()
	f := setup(t)
	c1 := f.source(t, "c1")
	c2 := f.source(t, "c2", redisstream.WithReclaimCount(1))
	ctx := t.Context()
	const minIdle = 50 * time.Millisecond

	want := f.publishN(t, c1, 105)
	if _, err := c1.Read(ctx, len(want)); err != nil {
		t.Fatal(err)
	}
	f.waitIdle(t, minIdle, want...)

	// One pass makes at most 100 XAUTOCLAIM calls of COUNT 1.
	first, _, _, err := c2.Reclaim(ctx, minIdle, 1000)
	if err != nil {
		t.Fatal(err)
	}
	second, _, _, err := c2.Reclaim(ctx, minIdle, 1000)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 100 || !slices.Equal(append(ids(first), ids(second)...), want) {
		t.Fatalf("passes claimed %d then %d entries; want 100 then the other 5 in order", len(first), len(second))
	}
}
