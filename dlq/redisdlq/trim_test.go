package redisdlq_test

import (
	"maps"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
)

// serverMS reads the Redis server's clock (TIME) in Unix ms.
func serverMS(t *testing.T, c rueidis.Client) int64 {
	t.Helper()
	parts, err := c.Do(t.Context(), c.B().Time().Build()).AsStrSlice()
	if err != nil || len(parts) != 2 {
		t.Fatalf("TIME: %v, %v", parts, err)
	}
	sec, _ := strconv.ParseInt(parts[0], 10, 64)
	usec, _ := strconv.ParseInt(parts[1], 10, 64)
	return sec*1000 + usec/1000
}

// seedAt writes n entries whose ids carry the time ms (sequence 0..n-1)
// and returns their ids.
func seedAt(t *testing.T, s *redisdlq.Store, c rueidis.Client, src string, ms int64, n int) []string {
	t.Helper()
	cmds := make(rueidis.Commands, n)
	ids := make([]string, n)
	for i := range n {
		ids[i] = strconv.FormatInt(ms, 10) + "-" + strconv.Itoa(i)
		fields := dlq.Encode(entryFor(src))
		cmd := c.B().Xadd().Key(s.Key()).Id(ids[i]).FieldValue()
		for _, k := range slices.Sorted(maps.Keys(fields)) {
			cmd = cmd.FieldValue(k, fields[k])
		}
		cmds[i] = cmd.Build()
	}
	for _, r := range c.DoMulti(t.Context(), cmds...) {
		if err := r.Error(); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

func listIDs(t *testing.T, s *redisdlq.Store) []string {
	t.Helper()
	es, err := s.List(t.Context(), dlq.Filter{})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return out
}

// TestTrimByAge: entries older than the retention go, by the time in
// their ids against the server's clock; newer ones stay.
func TestTrimByAge(t *testing.T) {
	t.Parallel()
	s, c, src := newStore(t)
	now := serverMS(t, c)
	seedAt(t, s, c, src, now-15*24*time.Hour.Milliseconds(), 3)
	keep := seedAt(t, s, c, src, now-13*24*time.Hour.Milliseconds(), 2)
	keep = append(keep, write(t, s, entryFor(src)).ID)

	r, err := s.Trim(t.Context(), dlq.DefaultRetention)
	if err != nil {
		t.Fatal(err)
	}
	if r.Trimmed != 3 || r.More {
		t.Errorf("Trim = %+v; want 3 trimmed", r)
	}
	if d := r.Cutoff.UnixMilli() - (now - dlq.DefaultRetention.Milliseconds()); d < 0 || d > 5000 {
		t.Errorf("Cutoff %v is %dms from server time minus the retention", r.Cutoff, d)
	}
	if got := listIDs(t, s); !slices.Equal(got, keep) {
		t.Errorf("entries left %v, want %v", got, keep)
	}
	if r, err := s.Trim(t.Context(), dlq.DefaultRetention); err != nil || r.Trimmed != 0 {
		t.Errorf("second Trim = %+v, %v; want nothing trimmed", r, err)
	}
}

// TestTrimKeepForever: retention 0 keeps every entry without calling
// Redis; a negative retention is an error; a missing queue is empty.
func TestTrimKeepForever(t *testing.T) {
	t.Parallel()
	s, c, src := newStore(t)
	if r, err := s.Trim(t.Context(), time.Millisecond); err != nil || r.Trimmed != 0 {
		t.Errorf("Trim of a missing queue = %+v, %v", r, err)
	}
	ids := seedAt(t, s, c, src, 1000, 4)
	if r, err := s.Trim(t.Context(), 0); err != nil || r != (dlq.TrimResult{}) {
		t.Errorf("Trim(0) = %+v, %v; want a zero result", r, err)
	}
	if _, err := s.Trim(t.Context(), -time.Second); err == nil {
		t.Error("Trim(-1s) succeeded")
	}
	if got := listIDs(t, s); !slices.Equal(got, ids) {
		t.Errorf("entries left %v, want %v", got, ids)
	}
}

// TestTrimBounded: a backlog larger than the node-pass limit goes over
// several calls that report More, each removing at most the limit.
func TestTrimBounded(t *testing.T) {
	t.Parallel()
	s, c, src := newStore(t)
	ids := seedAt(t, s, c, src, 1000, 2500)
	const limit = 1000
	var total int64
	for calls := 1; ; calls++ {
		r, err := redisdlq.TrimWithLimit(&s.Writer, t.Context(), time.Hour, limit)
		if err != nil {
			t.Fatal(err)
		}
		if r.Trimmed > limit {
			t.Errorf("call %d trimmed %d, limit %d", calls, r.Trimmed, limit)
		}
		total += r.Trimmed
		if !r.More {
			if calls < 3 {
				t.Errorf("done after %d calls, want at least 3", calls)
			}
			break
		}
		if calls > 10 {
			t.Fatalf("still More after %d calls", calls)
		}
	}
	if n, _ := s.Len(t.Context()); total != int64(len(ids)) || n != 0 {
		t.Errorf("trimmed %d of %d, %d left", total, len(ids), n)
	}
}

func TestEntryExpires(t *testing.T) {
	e := dlq.Entry{ID: "1700000000000-3"}
	if got, want := e.Expires(dlq.DefaultRetention), time.UnixMilli(1700000000000).Add(14*24*time.Hour); !got.Equal(want) {
		t.Errorf("Expires = %v, want %v", got, want)
	}
	if got := e.Expires(0); !got.IsZero() {
		t.Errorf("Expires(0) = %v, want zero (kept forever)", got)
	}
	if got := (dlq.Entry{ID: "bogus"}).Expires(time.Hour); !got.IsZero() {
		t.Errorf("Expires of a bad id = %v, want zero", got)
	}
}
