package stats

import (
	"fmt"
	"math"
	"time"
)

// Retentions are the settings a memory projection assumes, as the workers
// apply them (docs/operations.md#retention). A zero Stream or DLQ keeps
// entries forever; a zero Invocation deletes a message's invocation state
// with its acknowledgement.
type Retentions struct {
	Stream, DLQ, Invocation time.Duration
	// TrimInterval is how often the workers trim the streams
	// (worker.Config.RetentionInterval). A trim removes what is older
	// than the retention, so just before the next one a stream holds
	// retention + TrimInterval of entries: its peak, which the projection
	// is (docs/operations.md#memory-budget). With several workers the
	// trims come more often and the peak is lower.
	TrimInterval time.Duration
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

// Memory is the Redis memory of one stream and consumer group by part, the
// event rate, and the memory the parts peak at when that rate goes on
// with the configured retentions (docs/operations.md#memory-budget).
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
	// Projected is the used memory the parts peak at: what is not
	// Relay's stays, Other stays, the live invocation state stays, each
	// stream holds rate × (retention + TrimInterval) entries of its
	// measured size just before a trim, and the retained invocation state
	// rate × retention hashes. -1 when a part grows without
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

// Budget limits the work of one redisstats.MeasureMemory call.
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

// notRelay is the memory in use that none of the parts holds.
func (m Memory) notRelay() int64 {
	return max(m.Used-(m.Stream.Bytes+m.DLQ.Bytes+m.Invocations.Bytes+m.Other.Bytes), 0)
}

// Project fills the parts' and the total's Projected, and Unbounded, from
// what m measured and the retentions r (redisstats.MeasureMemory calls it).
func (m *Memory) Project(r Retentions) {
	rest := m.notRelay()
	m.Stream.Projected = kept(m.Stream, m.Rate, r.Stream, r.TrimInterval)
	m.DLQ.Projected = kept(m.DLQ, m.DLQRate, r.DLQ, r.TrimInterval)
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

// kept is what a stream part peaks at: rate entries per second kept for
// retention and until the next trim, every interval, or, with retention
// 0, every entry forever.
func kept(p Part, rate float64, retention, interval time.Duration) int64 {
	switch {
	case retention > 0:
		return hold(rate, retention+max(interval, 0), p.PerItem)
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

// Verdict is one sentence on the projection against share of maxmemory,
// naming what to change when it is over.
func (m Memory) Verdict(share float64) string {
	switch {
	case m.Projected < 0 && m.Max > 0:
		return fmt.Sprintf("OVER BUDGET: %s grows without bound and will reach maxmemory %s; set a retention (docs/operations.md#redis-memory)", m.Unbounded, FormatBytes(m.Max))
	case m.Projected < 0:
		return fmt.Sprintf("projected: %s grows without bound (no maxmemory set)", m.Unbounded)
	case m.Max == 0:
		return fmt.Sprintf("projected peak at this rate: %s (no maxmemory set)", FormatBytes(m.Projected))
	}
	pct := 100 * float64(m.Projected) / float64(m.Max)
	if m.ProjectedOver(share) {
		part, change := m.Blame(share)
		return fmt.Sprintf("OVER BUDGET: projected peak %s = %.0f%% of maxmemory %s (limit %.0f%%)%s; most of it is the %s: %s (docs/operations.md#redis-memory)",
			FormatBytes(m.Projected), pct, FormatBytes(m.Max), 100*share, m.usedNow(share), part, change)
	}
	if m.OverNow(share) {
		part, change := m.Blame(share)
		return fmt.Sprintf("OVER BUDGET now: Redis uses %s = %.0f%% of maxmemory %s (limit %.0f%%)%s; the projection at this rate is %s = %.0f%%; most of it is the %s: %s (docs/operations.md#redis-memory)",
			FormatBytes(m.Used), 100*float64(m.Used)/float64(m.Max), FormatBytes(m.Max), 100*share, m.atMax(), FormatBytes(m.Projected), pct, part, change)
	}
	return fmt.Sprintf("projected peak at this rate: %s = %.0f%% of maxmemory %s", FormatBytes(m.Projected), pct, FormatBytes(m.Max))
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
