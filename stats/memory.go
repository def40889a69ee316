package stats

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
)

// Retentions are the settings a memory projection assumes, as the workers
// apply them (docs/operations.md#retention). A zero Stream or DLQ keeps
// entries forever; a zero Invocation deletes a message's invocation state
// with its acknowledgement.
type Retentions struct {
	Stream, DLQ, Invocation time.Duration
}

// Part is what one kind of Relay data holds in Redis now.
type Part struct {
	// Bytes is the memory it uses now, as MEMORY USAGE reports it
	// (extrapolated from a sample for key families).
	Bytes int64 `json:"bytes"`
	// Items is how many stream entries or keys it holds.
	Items int64 `json:"items"`
	// PerItem is Bytes/Items, the measured cost of one more; 0 when there
	// is none to measure.
	PerItem float64 `json:"bytes_per_item"`
	// Projected is what the part levels off at when the rate goes on with
	// the retentions; -1 when it grows without bound.
	Projected int64 `json:"projected_bytes"`
	// Live is how many of Items have no TTL (estimated from the sample):
	// for the invocation state, that of messages still pending, which
	// stays at any retention while the rate goes on.
	Live int64 `json:"live,omitempty"`
	// Estimated is true when PerItem is not measured: no invocation hash
	// was there to sample, so the projection assumes RetainedHashBytes, or
	// a stream is shorter than one node, so PerItem comes from its
	// entries' size.
	Estimated bool `json:"estimated,omitempty"`
}

// RetainedHashBytes is the memory of one retained invocation hash with one
// invocation, its TTL included: used_memory grew 223–256 bytes per such hash on Redis 7.0.15 (bench/RESULTS.md
// "Redis bytes per event"); a projection uses it when there is no hash to
// sample.
const RetainedHashBytes = 240

// Per-key memory that MEMORY USAGE leaves out: the key's share of the
// keyspace dictionary and, for a key with a TTL, of the expires dictionary
// (an entry and, on average, one and a half bucket pointers of a table that
// grows by doubling, on 64-bit Redis 7; calibrated against used_memory's
// growth per retained hash, TestMeasuredHashBytesMatchUsedMemory).
const (
	keyEntryBytes    = 40
	expiryEntryBytes = 40
)

// Memory is the Redis memory of one stream and consumer group by part, the
// event rate, and the memory the parts level off at when that rate goes on
// with the configured retentions (docs/operations.md#redis-memory).
type Memory struct {
	// Used and Max are used_memory and maxmemory of the node that holds
	// the stream (INFO memory); Max is 0 when no limit is set.
	Used, Max int64
	// Stream and DLQ are the source and dead-letter streams.
	Stream, DLQ Part
	// Invocations are the stream and group's invocation hashes, retained
	// and live; Other every other key under the "relay:" prefix (counters,
	// feeds, schedule dedup keys, DLQ markers, other streams' state).
	Invocations, Other Part
	// Sampled is false when the key scan covered the whole keyspace, so
	// Invocations and Other are counts, not estimates.
	Sampled bool
	// Rate is the stream's entries per second over the newest entries
	// (at most RateWindow back), DLQRate the dead-letter stream's;
	// MatchedShare the part of deliveries that matched an app (1 before
	// any was counted), the share that leaves invocation state.
	Rate, DLQRate, MatchedShare float64
	// Projected is the used memory the parts level off at: what is not
	// Relay's stays, Other stays, the live invocation state stays, and
	// each retained part holds rate × retention items of its measured
	// size. -1 when a part grows without
	// bound (a zero stream or DLQ retention with entries arriving);
	// Unbounded then names it.
	Projected int64
	Unbounded string
}

// BudgetShare is the share of maxmemory a projection may reach: relay
// health fails, and a worker warns, above it (docs/operations.md#memory-budget).
const BudgetShare = 0.9

// Pressure reports whether the projection exceeds share (0 < share ≤ 1)
// of maxmemory, or grows without bound under one, or Redis already uses
// more than that share (OverNow). Without maxmemory nothing is at risk
// this way (the host's memory is, which Redis cannot tell).
func (m Memory) Pressure(share float64) bool {
	return m.ProjectedOver(share) || m.OverNow(share)
}

// OverNow reports whether Redis already uses more than share of
// maxmemory. The projection alone can miss it: at maxmemory producers
// cannot add entries, so the rate, and the projection with it, falls
// just when Redis is full.
func (m Memory) OverNow(share float64) bool {
	return m.Max > 0 && float64(m.Used) > share*float64(m.Max)
}

// ProjectedOver reports whether the projection itself, not only the
// memory in use now, is over share of maxmemory.
func (m Memory) ProjectedOver(share float64) bool {
	return m.Max > 0 && (m.Projected < 0 || float64(m.Projected) > share*float64(m.Max))
}

// The parts Blame names.
const (
	PartStream      = "source stream"
	PartDLQ         = "dead-letter stream"
	PartInvocations = "invocation state"
	PartOther       = "other relay keys"
	PartNotRelay    = "memory not Relay's"
)

// Blame names the part to change when m is over share of maxmemory, and
// what to change: the part that grows without bound, else the largest
// projected part, else what is not Relay's when that is larger than every
// part. When only the memory in use now is over (the projection is not),
// it names the part that takes the most now.
func (m Memory) Blame(share float64) (part, change string) {
	part = m.blamed(share)
	switch part {
	case PartStream:
		return part, "lower REDIS_STREAM_RETENTION (0 keeps every entry) or raise maxmemory"
	case PartDLQ:
		return part, "lower REDIS_DLQ_RETENTION (0 keeps every entry), replay or remove dead letters, or raise maxmemory"
	case PartInvocations:
		return part, "lower REDIS_INVOCATION_RETENTION (0 deletes the state with the acknowledgement) or raise maxmemory"
	case PartOther:
		return part, "look for other keys under relay: (relay stats) or raise maxmemory"
	}
	return part, "other data on this Redis takes the memory: move it or raise maxmemory"
}

func (m Memory) blamed(share float64) string {
	switch {
	case m.Projected >= 0:
	case m.Stream.Projected < 0:
		return PartStream
	default:
		return PartDLQ
	}
	parts := []struct {
		name  string
		bytes int64
	}{
		{PartStream, m.Stream.Projected}, {PartDLQ, m.DLQ.Projected},
		{PartInvocations, m.Invocations.Projected}, {PartOther, m.Other.Projected},
	}
	if m.Max > 0 && !m.ProjectedOver(share) {
		parts[0].bytes, parts[1].bytes, parts[2].bytes, parts[3].bytes = m.Stream.Bytes, m.DLQ.Bytes, m.Invocations.Bytes, m.Other.Bytes
	}
	name, top := PartNotRelay, m.notRelay()
	for _, p := range parts {
		if p.bytes > top {
			name, top = p.name, p.bytes
		}
	}
	return name
}

// Budget limits the work of one MeasureMemory call.
type Budget struct {
	// ScanCalls bounds the SCAN calls (COUNT 1000 each) that look for
	// "relay:" keys; a keyspace they do not cover is extrapolated from
	// DBSIZE. Default 100.
	ScanCalls int
	// Samples is how many keys of each family get a MEMORY USAGE.
	// Default 100.
	Samples int
	// RateWindow is how far back the rate looks; RateEntries bounds the
	// entries read for it (the rate of a busier stream comes from the
	// time since the oldest of its newest RateEntries). Defaults 1 minute
	// and 1,000.
	RateWindow  time.Duration
	RateEntries int
}

func (b Budget) withDefaults() Budget {
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
func MeasureMemory(ctx context.Context, client rueidis.Client, stream, group string, r Retentions, b Budget) (Memory, error) {
	b = b.withDefaults()
	var m Memory
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
		return Memory{}, fmt.Errorf("measure memory of %s: %w", stream, err)
	}
	counts, err := Read(ctx, client, stream, group)
	if err != nil {
		return Memory{}, err
	}
	m.MatchedShare = 1
	if seen := counts.Matched + counts.Unmatched; seen > 0 {
		m.MatchedShare = float64(counts.Matched) / float64(seen)
	}
	m.project(r)
	return m, nil
}

// notRelay is the memory in use that none of the parts holds.
func (m Memory) notRelay() int64 {
	return max(m.Used-(m.Stream.Bytes+m.DLQ.Bytes+m.Invocations.Bytes+m.Other.Bytes), 0)
}

// project fills the parts' and the total's Projected, and Unbounded.
func (m *Memory) project(r Retentions) {
	rest := m.notRelay()
	m.Stream.Projected = kept(m.Stream, m.Rate, r.Stream)
	m.DLQ.Projected = kept(m.DLQ, m.DLQRate, r.DLQ)
	if m.Invocations.PerItem == 0 && r.Invocation > 0 && m.Rate > 0 {
		m.Invocations.PerItem, m.Invocations.Estimated = RetainedHashBytes, true
	}
	m.Invocations.Projected = hold(m.Rate*m.MatchedShare, r.Invocation, m.Invocations.PerItem) +
		int64(math.Round(float64(m.Invocations.Live)*m.Invocations.PerItem))
	m.Other.Projected = m.Other.Bytes
	m.Projected, m.Unbounded = rest, ""
	for _, p := range []struct {
		part Part
		name string
	}{
		{m.Stream, "the stream (REDIS_STREAM_RETENTION 0 keeps every entry)"},
		{m.DLQ, "the dead-letter stream (REDIS_DLQ_RETENTION 0 keeps every entry)"},
		{m.Invocations, ""}, {m.Other, ""},
	} {
		if p.part.Projected < 0 {
			m.Projected, m.Unbounded = -1, p.name
			return
		}
		m.Projected += p.part.Projected
	}
}

// kept is what a stream part levels off at: rate entries per second kept
// for retention, or, with retention 0, every entry forever.
func kept(p Part, rate float64, retention time.Duration) int64 {
	switch {
	case retention > 0:
		return hold(rate, retention, p.PerItem)
	case rate > 0:
		return -1
	}
	return p.Bytes
}

// hold is the bytes that rate items per second of size bytes each take
// when each is kept for retention.
func hold(rate float64, retention time.Duration, size float64) int64 {
	return int64(math.Round(rate * retention.Seconds() * size))
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
func measureStream(ctx context.Context, c rueidis.CoreClient, stream string, now time.Time, b Budget) (Part, float64, error) {
	start := now.Add(-b.RateWindow)
	res := c.DoMulti(ctx,
		c.B().Xlen().Key(stream).Build(),
		c.B().MemoryUsage().Key(stream).Build(),
		c.B().Xrevrange().Key(stream).End("+").Start(strconv.FormatInt(start.UnixMilli(), 10)).Count(int64(b.RateEntries)).Build(),
		c.B().XinfoStream().Key(stream).Build())
	n, err := res[0].AsInt64()
	if err != nil {
		return Part{}, 0, fmt.Errorf("XLEN %s: %w", stream, err)
	}
	bytes, err := res[1].AsInt64()
	if rueidis.IsRedisNil(err) {
		return Part{}, 0, nil // no such stream
	}
	if err != nil {
		return Part{}, 0, fmt.Errorf("MEMORY USAGE %s: %w", stream, err)
	}
	recent, err := res[2].AsXRange()
	if err != nil {
		return Part{}, 0, fmt.Errorf("XREVRANGE %s: %w", stream, err)
	}
	p := Part{Bytes: bytes, Items: n}
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
func rate(newest []rueidis.XRangeEntry, n int64, removed bool, now time.Time, b Budget) float64 {
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
func measureKeys(ctx context.Context, c rueidis.CoreClient, stream, group string, cluster bool, b Budget, m *Memory) error {
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
func sampleKeys(ctx context.Context, c rueidis.CoreClient, ks []string, n int64) (Part, error) {
	if len(ks) == 0 {
		return Part{}, nil
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
			return Part{}, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		ttl, err := res[2*i+1].AsInt64()
		if err != nil {
			return Part{}, fmt.Errorf("PTTL %s: %w", k, err)
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
		return Part{}, nil
	}
	per := float64(sum) / float64(got)
	return Part{Bytes: int64(math.Round(per * float64(n))), Items: n, PerItem: per, Live: live * n / got}, nil
}

// Verdict is one sentence on the projection against share of maxmemory,
// naming what to change when it is over.
func (m Memory) Verdict(share float64) string {
	switch {
	case m.Projected < 0 && m.Max > 0:
		return fmt.Sprintf("OVER BUDGET: %s grows without bound and will reach maxmemory %s; set a retention (docs/operations.md#redis-memory)", m.Unbounded, FormatBytes(m.Max))
	case m.Projected < 0:
		return fmt.Sprintf("projected: %s grows without bound (no maxmemory set)", m.Unbounded)
	case m.Max == 0:
		return fmt.Sprintf("projected steady state at this rate: %s (no maxmemory set)", FormatBytes(m.Projected))
	}
	pct := 100 * float64(m.Projected) / float64(m.Max)
	if m.ProjectedOver(share) {
		part, change := m.Blame(share)
		return fmt.Sprintf("OVER BUDGET: projected steady state %s = %.0f%% of maxmemory %s (limit %.0f%%)%s; most of it is the %s: %s (docs/operations.md#redis-memory)",
			FormatBytes(m.Projected), pct, FormatBytes(m.Max), 100*share, m.usedNow(share), part, change)
	}
	if m.OverNow(share) {
		part, change := m.Blame(share)
		return fmt.Sprintf("OVER BUDGET now: Redis uses %s = %.0f%% of maxmemory %s (limit %.0f%%)%s; the projection at this rate is %s = %.0f%%; most of it is the %s: %s (docs/operations.md#redis-memory)",
			FormatBytes(m.Used), 100*float64(m.Used)/float64(m.Max), FormatBytes(m.Max), 100*share, m.atMax(), FormatBytes(m.Projected), pct, part, change)
	}
	return fmt.Sprintf("projected steady state at this rate: %s = %.0f%% of maxmemory %s", FormatBytes(m.Projected), pct, FormatBytes(m.Max))
}

// usedNow is what the projection's verdict adds when Redis is over the
// budget already.
func (m Memory) usedNow(share float64) string {
	if !m.OverNow(share) {
		return ""
	}
	return fmt.Sprintf("; Redis uses %.0f%% of it now%s", 100*float64(m.Used)/float64(m.Max), m.atMax())
}

// atMax says what a Redis at maxmemory does.
func (m Memory) atMax() string {
	if m.Used < m.Max {
		return ""
	}
	return ", at maxmemory: it refuses writes, so producers cannot add events and workers run no handler"
}

// FormatBytes formats a byte count with a binary unit ("12.3 MiB").
func FormatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
