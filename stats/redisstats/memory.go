package redisstats

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stats"
)

// withDefaults is b with its zero fields set to their defaults.
func withDefaults(b stats.Budget) stats.Budget {
	if b.ScanCalls <= 0 {
		b.ScanCalls = 100
	}
	if b.Samples <= 0 {
		b.Samples = 100
	}
	if b.RateWindow <= 0 {
		b.RateWindow = time.Minute
	}
	if b.RateEntries <= 1 {
		b.RateEntries = 1000
	}
	return b
}

// Per-key memory that MEMORY USAGE leaves out: the key's share of the
// keyspace dictionary and, for a key with a TTL, of the expires dictionary
// (an entry and, on average, one and a half bucket pointers of a table that
// grows by doubling, on 64-bit Redis 7; calibrated against used_memory's
// growth per retained hash, TestMeasuredHashBytesMatchUsedMemory).
const (
	keyEntryBytes    = 40
	expiryEntryBytes = 40
)

// scanCount is the COUNT of each SCAN call.
const scanCount = 1000

// MeasureMemory measures stream and group's memory on the node that holds
// the stream (under Redis Cluster the stream's keys share its hash tag,
// docs/deployment.md) and projects it with r. It reads INFO memory, TIME,
// XINFO STREAM and MEMORY USAGE of both streams, a bounded XREVRANGE of
// each for the rates, the counters for the matched share, and a bounded
// SCAN with MEMORY USAGE on a sample of keys, within b (zero fields take
// their defaults). A missing stream or DLQ counts as empty. The user needs
// +info and +memory besides what relay stats reads.
func MeasureMemory(ctx context.Context, client rueidis.Client, stream, group string, r stats.Retentions, b stats.Budget) (stats.Memory, error) {
	b = withDefaults(b)
	var m stats.Memory
	err := onStreamNode(ctx, client, stream, func(c rueidis.CoreClient) error {
		now, err := serverTime(ctx, c)
		if err != nil {
			return err
		}
		if m.Used, m.Max, err = infoMemory(ctx, c); err != nil {
			return err
		}
		if m.Stream, m.Rate, err = measureStream(ctx, c, stream, now, b); err != nil {
			return err
		}
		dlqWindow := b
		dlqWindow.RateWindow = max(b.RateWindow, time.Hour) // dead letters are rare: look further back
		if m.DLQ, m.DLQRate, err = measureStream(ctx, c, keys.DLQ(stream), now, dlqWindow); err != nil {
			return err
		}
		return measureKeys(ctx, c, stream, group, client.Mode() == rueidis.ClientModeCluster, b, &m)
	})
	if err != nil {
		return stats.Memory{}, fmt.Errorf("measure memory of %s: %w", stream, err)
	}
	counts, err := Read(ctx, client, stream, group)
	if err != nil {
		return stats.Memory{}, err
	}
	m.MatchedShare = 1
	if seen := counts.Matched + counts.Unmatched; seen > 0 {
		m.MatchedShare = float64(counts.Matched) / float64(seen)
	}
	m.Project(r)
	return m, nil
}

// onStreamNode runs f with a client of the node that holds stream. Under
// Redis Cluster keyless commands (SCAN, INFO, TIME) would go to any node,
// so a dedicated connection is pinned to the stream's slot by a keyed
// command first.
func onStreamNode(ctx context.Context, client rueidis.Client, stream string, f func(rueidis.CoreClient) error) error {
	if client.Mode() != rueidis.ClientModeCluster {
		return f(client)
	}
	return client.Dedicated(func(dc rueidis.DedicatedClient) error {
		if err := dc.Do(ctx, dc.B().Exists().Key(stream).Build()).Error(); err != nil {
			return fmt.Errorf("find the node of %s: %w", stream, err)
		}
		return f(dc)
	})
}

func serverTime(ctx context.Context, c rueidis.CoreClient) (time.Time, error) {
	t, err := c.Do(ctx, c.B().Time().Build()).AsStrSlice()
	if err != nil || len(t) != 2 {
		return time.Time{}, fmt.Errorf("TIME: %v", err)
	}
	s, err1 := strconv.ParseInt(t[0], 10, 64)
	us, err2 := strconv.ParseInt(t[1], 10, 64)
	if err1 != nil || err2 != nil {
		return time.Time{}, fmt.Errorf("TIME: unexpected reply %q", t)
	}
	return time.Unix(s, us*1000), nil
}

// infoMemory returns used_memory and maxmemory.
func infoMemory(ctx context.Context, c rueidis.CoreClient) (used, limit int64, err error) {
	info, err := c.Do(ctx, c.B().Info().Section("memory").Build()).ToString()
	if err != nil {
		return 0, 0, fmt.Errorf("INFO memory: %w", err)
	}
	fields := map[string]*int64{"used_memory": &used, "maxmemory": &limit}
	for line := range strings.Lines(info) {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if p := fields[k]; ok && p != nil {
			if *p, err = strconv.ParseInt(v, 10, 64); err != nil {
				return 0, 0, fmt.Errorf("INFO memory: %s is %q", k, v)
			}
			delete(fields, k)
		}
	}
	if len(fields) > 0 {
		return 0, 0, errors.New("INFO memory: no used_memory or maxmemory")
	}
	return used, limit, nil
}

// measureStream returns the memory of stream and its entries per second
// over the newest entries within b.RateWindow of now.
func measureStream(ctx context.Context, c rueidis.CoreClient, stream string, now time.Time, b stats.Budget) (stats.Part, float64, error) {
	start := now.Add(-b.RateWindow)
	res := c.DoMulti(ctx,
		c.B().Xlen().Key(stream).Build(),
		c.B().MemoryUsage().Key(stream).Build(),
		c.B().Xrevrange().Key(stream).End("+").Start(strconv.FormatInt(start.UnixMilli(), 10)).Count(int64(b.RateEntries)).Build(),
		c.B().XinfoStream().Key(stream).Build())
	n, err := res[0].AsInt64()
	if err != nil {
		return stats.Part{}, 0, fmt.Errorf("XLEN %s: %w", stream, err)
	}
	bytes, err := res[1].AsInt64()
	if rueidis.IsRedisNil(err) {
		return stats.Part{}, 0, nil // no such stream
	}
	if err != nil {
		return stats.Part{}, 0, fmt.Errorf("MEMORY USAGE %s: %w", stream, err)
	}
	recent, err := res[2].AsXRange()
	if err != nil {
		return stats.Part{}, 0, fmt.Errorf("XREVRANGE %s: %w", stream, err)
	}
	p := stats.Part{Bytes: bytes, Items: n}
	if n > 0 {
		p.PerItem = float64(bytes) / float64(n)
	}
	if n < nodeEntries && len(recent) > 0 {
		// A short stream's MEMORY USAGE is mostly its first node's
		// allocation (about 5 KB even for one small entry), which the
		// entries to come fill: per entry it can be a hundred times what
		// one more costs. Its entries' own size says more.
		if est := entryBytes(recent); est < p.PerItem {
			p.PerItem, p.Estimated = est, true
		}
	}
	// entries-added (Redis 7) above the length: entries were trimmed or
	// deleted, so the window may reach back past the oldest one left.
	var removed bool
	if info, err := res[3].AsMap(); err == nil {
		if added, err := field(info, "entries-added"); err == nil {
			removed = added > n
		}
	}
	return p, rate(recent, n, removed, now, b), nil
}

// nodeEntries is how many entries a stream node holds by default
// (stream-node-max-entries): from a node's worth on, MEMORY USAGE per
// entry is within about a tenth of what one more entry costs
// (TestShortStreamPerEntry).
const nodeEntries = 100

// entryOverhead is what a stream entry costs beyond its fields and values
// in a node of entries with the same fields (its id's deltas, flags and
// lengths), about 20–40 bytes on Redis 7.0.
const entryOverhead = 32

// entryBytes estimates one entry's memory from entries: their average
// field and value bytes plus entryOverhead.
func entryBytes(entries []rueidis.XRangeEntry) float64 {
	var total int
	for _, e := range entries {
		for k, v := range e.FieldValues {
			total += len(k) + len(v)
		}
	}
	return float64(total)/float64(len(entries)) + entryOverhead
}

func field(m map[string]rueidis.RedisMessage, k string) (int64, error) {
	v, ok := m[k]
	if !ok {
		return 0, fmt.Errorf("no %s", k)
	}
	return v.AsInt64()
}

// rate is entries per second from the newest entries (newest first) of a
// stream of n entries: their count over the window, or, when the bound cut
// them short, over the time from the oldest of them to now (not to the
// newest: a burst followed by silence would count as the burst's rate,
// thousands of times the stream's). When the window holds the whole
// stream and entries were removed (removed), a retention shorter than the
// window trimmed the older ones: the count is over the time since the
// oldest entry left.
func rate(newest []rueidis.XRangeEntry, n int64, removed bool, now time.Time, b stats.Budget) float64 {
	if len(newest) < b.RateEntries {
		if oldest, ok := oldestTime(newest); ok && removed && int64(len(newest)) == n {
			if span := now.Sub(oldest); span > 0 && span < b.RateWindow {
				return float64(len(newest)) / span.Seconds()
			}
		}
		return float64(len(newest)) / b.RateWindow.Seconds()
	}
	first, ok := idTime(newest[len(newest)-1].ID)
	span := now.Sub(first)
	if !ok || span <= 0 {
		return float64(len(newest)) / b.RateWindow.Seconds()
	}
	return float64(len(newest)) / span.Seconds()
}

// oldestTime is the time of the last (oldest) of newest.
func oldestTime(newest []rueidis.XRangeEntry) (time.Time, bool) {
	if len(newest) == 0 {
		return time.Time{}, false
	}
	return idTime(newest[len(newest)-1].ID)
}

// idTime is the time part of a stream id.
func idTime(id string) (time.Time, bool) {
	ms, _, _ := strings.Cut(id, "-")
	v, err := strconv.ParseInt(ms, 10, 64)
	return time.UnixMilli(v), err == nil
}

// measureKeys counts and samples the "relay:" keys other than the DLQ
// stream: the invocation hashes of stream and group, and the rest. Under
// Redis Cluster only the keys of the stream's hash slot count: the node
// holds other streams' keys too, and a connection pinned to the stream's
// slot may not touch them.
func measureKeys(ctx context.Context, c rueidis.CoreClient, stream, group string, cluster bool, b stats.Budget, m *stats.Memory) error {
	dlq := keys.DLQ(stream)
	slot := keys.Slot(stream)
	var inv, other []string
	var nInv, nOther int64
	cursor, calls := uint64(0), 0
	for {
		e, err := c.Do(ctx, c.B().Scan().Cursor(cursor).Match(keys.Pattern).Count(scanCount).Build()).AsScanEntry()
		if err != nil {
			return fmt.Errorf("SCAN: %w", err)
		}
		for _, k := range e.Elements {
			if cluster && keys.Slot(k) != slot {
				continue
			}
			switch _, ok := keys.InvocationMessageID(stream, group, k); {
			case ok:
				nInv++
				if len(inv) < b.Samples {
					inv = append(inv, k)
				}
			case k != dlq:
				nOther++
				if len(other) < b.Samples {
					other = append(other, k)
				}
			}
		}
		cursor, calls = e.Cursor, calls+1
		if cursor == 0 || calls >= b.ScanCalls {
			break
		}
	}
	if cursor != 0 {
		// The scan stopped early: scale the counts to the keyspace.
		total, err := c.Do(ctx, c.B().Dbsize().Build()).AsInt64()
		if err != nil {
			return fmt.Errorf("DBSIZE: %w", err)
		}
		if seen := int64(calls * scanCount); total > seen {
			nInv, nOther = nInv*total/seen, nOther*total/seen
		}
		m.Sampled = true
	}
	var err error
	if m.Invocations, err = sampleKeys(ctx, c, inv, nInv); err != nil {
		return err
	}
	m.Other, err = sampleKeys(ctx, c, other, nOther)
	return err
}

// sampleKeys is the Part of n keys whose sample is ks: each key's MEMORY
// USAGE plus its dictionary entries.
func sampleKeys(ctx context.Context, c rueidis.CoreClient, ks []string, n int64) (stats.Part, error) {
	if len(ks) == 0 {
		return stats.Part{}, nil
	}
	cmds := make(rueidis.Commands, 0, 2*len(ks))
	for _, k := range ks {
		cmds = append(cmds, c.B().MemoryUsage().Key(k).Build(), c.B().Pttl().Key(k).Build())
	}
	res := c.DoMulti(ctx, cmds...)
	var sum, got, live int64
	for i, k := range ks {
		v, err := res[2*i].AsInt64()
		if rueidis.IsRedisNil(err) {
			continue // expired since the scan
		}
		if err != nil {
			return stats.Part{}, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		ttl, err := res[2*i+1].AsInt64()
		if err != nil {
			return stats.Part{}, fmt.Errorf("PTTL %s: %w", k, err)
		}
		v += keyEntryBytes
		if ttl >= 0 {
			v += expiryEntryBytes
		} else {
			live++
		}
		sum, got = sum+v, got+1
	}
	if got == 0 {
		return stats.Part{}, nil
	}
	per := float64(sum) / float64(got)
	return stats.Part{Bytes: int64(math.Round(per * float64(n))), Items: n, PerItem: per, Live: live * n / got}, nil
}
