package benchkit

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// ServerStats is a snapshot of what a Redis server counted: calls and time
// spent per command (INFO commandstats, which also counts the commands
// scripts call, so a script's time includes theirs) and the CPU time the
// server process used (INFO cpu), and the reads from client sockets it
// processed (INFO stats total_reads_processed: one per read(2) of a
// connection with data, which is about one per round trip a client makes,
// however many commands the read carries).
type ServerStats struct {
	Calls map[string]int64
	Time  map[string]time.Duration
	CPU   time.Duration
	Reads int64
}

// ReadServerStats takes a ServerStats snapshot.
func ReadServerStats(ctx context.Context, c rueidis.Client) (ServerStats, error) {
	res := c.DoMulti(ctx, c.B().Info().Section("commandstats").Build(), c.B().Info().Section("cpu").Build(),
		c.B().Info().Section("stats").Build())
	cmdText, err := res[0].ToString()
	if err != nil {
		return ServerStats{}, fmt.Errorf("info commandstats: %w", err)
	}
	cpuText, err := res[1].ToString()
	if err != nil {
		return ServerStats{}, fmt.Errorf("info cpu: %w", err)
	}
	statsText, err := res[2].ToString()
	if err != nil {
		return ServerStats{}, fmt.Errorf("info stats: %w", err)
	}
	s := ServerStats{Calls: map[string]int64{}, Time: map[string]time.Duration{}}
	for line := range strings.Lines(cmdText) {
		// cmdstat_xack:calls=12,usec=40,usec_per_call=3.33,rejected_calls=0,failed_calls=0
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		cmd := strings.TrimPrefix(name, "cmdstat_")
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			if k != "calls" && k != "usec" {
				continue
			}
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return ServerStats{}, fmt.Errorf("info commandstats: %q: %w", line, err)
			}
			if k == "calls" {
				s.Calls[cmd] = n
			} else {
				s.Time[cmd] = time.Duration(n) * time.Microsecond
			}
		}
	}
	for line := range strings.Lines(cpuText) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || (k != "used_cpu_sys" && k != "used_cpu_user") {
			continue
		}
		sec, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return ServerStats{}, fmt.Errorf("info cpu: %q: %w", line, err)
		}
		s.CPU += time.Duration(sec * float64(time.Second))
	}
	for line := range strings.Lines(statsText) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "total_reads_processed:"); ok {
			if s.Reads, err = strconv.ParseInt(v, 10, 64); err != nil {
				return ServerStats{}, fmt.Errorf("info stats: %q: %w", line, err)
			}
		}
	}
	return s, nil
}

// Sub returns what was counted between earlier and s.
func (s ServerStats) Sub(earlier ServerStats) ServerStats {
	d := ServerStats{Calls: map[string]int64{}, Time: map[string]time.Duration{}, CPU: s.CPU - earlier.CPU, Reads: s.Reads - earlier.Reads}
	for k, v := range s.Calls {
		if n := v - earlier.Calls[k]; n != 0 {
			d.Calls[k] = n
		}
	}
	for k, v := range s.Time {
		if t := v - earlier.Time[k]; t != 0 {
			d.Time[k] = t
		}
	}
	// The snapshots' own INFO calls are not the workers'.
	delete(d.Calls, "info")
	delete(d.Time, "info")
	return d
}

// Without subtracts n times the commands of one call of a measuring loop
// (SettledCommands, the INFO of the snapshots themselves), so the counts are
// the workers' alone.
func (s ServerStats) Without(cmds map[string]int, n int) ServerStats {
	for k, per := range cmds {
		if left := s.Calls[k] - int64(per*n); left > 0 {
			// Their time goes with them, at the average per call.
			s.Time[k] = s.Time[k] * time.Duration(left) / time.Duration(s.Calls[k])
			s.Calls[k] = left
		} else {
			delete(s.Calls, k)
			delete(s.Time, k)
		}
	}
	return s
}

// largestFirst returns m's keys by value, largest first, ties by name.
func largestFirst[V int64 | time.Duration](m map[string]V) []string {
	names := slices.Collect(maps.Keys(m))
	slices.SortFunc(names, func(a, b string) int {
		return cmp.Or(cmp.Compare(m[b], m[a]), strings.Compare(a, b))
	})
	return names
}

// PerEvent formats the calls per event, most frequent first, as
// "evalsha=3.00 xack=1.00 ...", leaving out commands below 0.005 per event.
func (s ServerStats) PerEvent(events int) string {
	names := largestFirst(s.Calls)
	var parts []string
	for _, n := range names {
		if per := float64(s.Calls[n]) / float64(events); per >= 0.005 {
			parts = append(parts, fmt.Sprintf("%s=%.2f", n, per))
		}
	}
	return strings.Join(parts, " ")
}

// TimePerEvent formats the server time per event of the top-level
// commands a worker sends (scripts include the commands they call),
// largest first, as "evalsha 31.2µs, xack 1.1µs, ...", leaving out
// commands under 0.05µs per event.
func (s ServerStats) TimePerEvent(events int) string {
	names := largestFirst(s.Time)
	var parts []string
	for _, n := range names {
		if scriptCalled[n] {
			continue
		}
		if per := float64(s.Time[n].Nanoseconds()) / 1e3 / float64(events); per >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.1fµs", n, per))
		}
	}
	return strings.Join(parts, ", ")
}

// scriptCalled are the commands only Relay's scripts call: their time is
// part of EVALSHA's.
var scriptCalled = map[string]bool{"hexists": true, "hget": true, "hset": true, "time": true, "pexpire": true, "hdel": true}

// UsedMemory is the server's used_memory (INFO memory), in bytes.
func UsedMemory(ctx context.Context, c rueidis.Client) (int64, error) {
	text, err := c.Do(ctx, c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return 0, fmt.Errorf("info memory: %w", err)
	}
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, errors.New("info memory: no used_memory")
}

// ReadOverhead is what the measuring side's own traffic adds to the Reads
// of a ServerStats delta: the closing snapshot's read, and the reads of
// each Settled poll in between. CalibrateReads measures it.
type ReadOverhead struct {
	Snapshot, PerPoll float64
}

// CalibrateReads measures the ReadOverhead of c's snapshots and of Settled
// polls of an existing stream name and group, on a server no other client
// is using: a pair of snapshots with nothing between them, then one around
// 200 polls.
func CalibrateReads(ctx context.Context, c rueidis.Client, name, group, last string) (ReadOverhead, error) {
	const polls = 200
	a, err := ReadServerStats(ctx, c)
	if err != nil {
		return ReadOverhead{}, err
	}
	b, err := ReadServerStats(ctx, c)
	if err != nil {
		return ReadOverhead{}, err
	}
	for range polls {
		if _, err := Settled(ctx, c, name, group, last); err != nil {
			return ReadOverhead{}, err
		}
	}
	d, err := ReadServerStats(ctx, c)
	if err != nil {
		return ReadOverhead{}, err
	}
	snap := float64(b.Reads - a.Reads)
	return ReadOverhead{Snapshot: snap, PerPoll: max(0, (float64(d.Reads-b.Reads)-snap)/polls)}, nil
}

// WithoutReads subtracts the measuring side's reads (o, polls Settled
// calls) from s.Reads, so they are the workers' alone.
func (s ServerStats) WithoutReads(o ReadOverhead, polls int) ServerStats {
	s.Reads = max(0, s.Reads-int64(o.Snapshot+o.PerPoll*float64(polls)+0.5))
	return s
}
