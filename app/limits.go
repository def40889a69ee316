package app

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Bounds and defaults of a rule's flow control (docs/flow-control.md).
const (
	// MaxConcurrency is the largest concurrency an app or a rule may set.
	MaxConcurrency = 10000
	// MaxRateCount is the largest count of a Rate, whatever its unit.
	MaxRateCount = 1_000_000
	// DefaultRateBurst is the RateBurst of a rule with a Rate that sets
	// none: starts are spread evenly, none at once.
	DefaultRateBurst = 1
	// MaxRateBurst is the largest RateBurst.
	MaxRateBurst = 10000
	// MinDebouncePeriod and MaxDebouncePeriod bound a Debounce's Period.
	MinDebouncePeriod = time.Millisecond
	MaxDebouncePeriod = 24 * time.Hour
	// MinMaxAge is the shortest MaxAge: an entry's age is measured from
	// the time in its stream id, and ordinary delivery takes milliseconds.
	MinMaxAge = time.Second
)

// Limits is the flow control of one event rule, resolved: the rule's own
// keys, and for the keys it does not set the app's defaults
// (docs/flow-control.md). Every field's zero value means that limit is off;
// the zero Limits is a rule as before flow control. A schedule has none.
// Limits is comparable, so a reload can tell whether a rule's changed.
type Limits struct {
	// Concurrency bounds the rule's invocations running at once, in
	// [1, MaxConcurrency]; 0 sets no bound of the rule's own. The app's
	// Concurrency bounds the app's invocations on each worker, this
	// rule's among them, either way.
	Concurrency int
	// Scope says where Concurrency holds: on each worker (ScopeWorker,
	// the zero value) or across all workers of the consumer group
	// (ScopeCluster). It is ScopeCluster whenever ConcurrencyKey is set;
	// NewSet sets it so.
	Scope Scope
	// ConcurrencyKey, when set, makes Concurrency a bound per distinct
	// value at that path of the event (KeyOf): at most Concurrency runs
	// per customer, say, across the cluster. It needs a Concurrency.
	ConcurrencyKey FieldPath
	// Rate bounds how often invocations of the rule start, across all
	// workers; the zero Rate sets none.
	Rate Rate
	// RateBurst is how many invocations may start at the same moment
	// after an idle spell, in [1, MaxRateBurst]: the rate is enforced as
	// a GCRA whose tolerance is (RateBurst-1) × Rate.Interval(), so in any
	// window w at most RateBurst + w/Rate.Interval() start. It is 0 when
	// Rate is zero; NewSet and the template loader make a 0 with a Rate
	// DefaultRateBurst.
	RateBurst int
	// RateKey, when set, makes Rate a limit per distinct value at that
	// path of the event (KeyOf). It needs a Rate.
	RateKey FieldPath
	// Debounce, when set, runs only the last of the rule's events that
	// share a key within its Period; the zero Debounce sets none.
	Debounce Debounce
	// MaxAge, when > 0, is the oldest a message may be, measured from the
	// time in its stream entry id, when an attempt of the rule would
	// start: an older one is dead-lettered, reason "older than max_age
	// <MaxAge>", without running. At least MinMaxAge; 0 sets none.
	MaxAge time.Duration
}

// IsZero reports whether l sets no limit at all.
func (l Limits) IsZero() bool { return l == Limits{} }

// String writes l as its template keys, in flow style, omitting the
// limits that are off: {concurrency: 2, concurrency_key: new_image.customer_id,
// rate: 100/s, rate_burst: 1, max_age: 1h}. The zero Limits is {}.
func (l Limits) String() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+": "+v) }
	if l.Concurrency > 0 {
		add("concurrency", strconv.Itoa(l.Concurrency))
		if l.ConcurrencyKey != "" {
			add("concurrency_key", string(l.ConcurrencyKey))
		} else if l.Scope != ScopeWorker {
			add("concurrency_scope", l.Scope.String())
		}
	}
	if !l.Rate.IsZero() {
		add("rate", l.Rate.String())
		add("rate_burst", strconv.Itoa(l.RateBurst))
		if l.RateKey != "" {
			add("rate_key", string(l.RateKey))
		}
	}
	if !l.Debounce.IsZero() {
		add("debounce", fmt.Sprintf("{key: %s, period: %s}", l.Debounce.Key, FormatDuration(l.Debounce.Period)))
	}
	if l.MaxAge > 0 {
		add("max_age", FormatDuration(l.MaxAge))
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

// Scope says where a rule's Concurrency holds.
type Scope uint8

const (
	// ScopeWorker bounds the rule's invocations on each worker: n
	// workers run up to n × Concurrency at once. The default, as for the
	// app's concurrency.
	ScopeWorker Scope = iota
	// ScopeCluster bounds them across every worker of the consumer
	// group. Each running invocation holds a slot in Redis under a lease,
	// so the slots of a worker that was killed come back when their
	// leases expire.
	ScopeCluster
)

// String returns "worker" or "cluster", the template's words.
func (s Scope) String() string {
	switch s {
	case ScopeWorker:
		return "worker"
	case ScopeCluster:
		return "cluster"
	}
	return fmt.Sprintf("Scope(%d)", uint8(s))
}

// ParseScope parses the template's concurrency_scope: worker or cluster.
func ParseScope(s string) (Scope, error) {
	switch s {
	case "worker":
		return ScopeWorker, nil
	case "cluster":
		return ScopeCluster, nil
	}
	return 0, fmt.Errorf("concurrency_scope %q: want worker (a bound on each worker, the default) or cluster (one bound across all workers)", s)
}

// Rate is a rate limit: at most Count starts per Per, spread evenly, one
// every Interval(), with RateBurst allowed at once (Limits.RateBurst).
// The zero Rate is none.
type Rate struct {
	// Count is in [1, MaxRateCount].
	Count int
	// Per is time.Second, time.Minute or time.Hour.
	Per time.Duration
}

// ParseRate parses a rate written <count>/<unit>, the unit s, m or h:
// 100/s, 30/m, 1000/h.
func ParseRate(s string) (Rate, error) {
	num, unit, ok := strings.Cut(s, "/")
	per, okUnit := rateUnits[unit]
	if !ok || !okUnit || num == "" || strings.Trim(num, "0123456789") != "" {
		return Rate{}, fmt.Errorf("rate %q: want <count>/<s|m|h>, like 100/s", s)
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 1 || n > MaxRateCount {
		return Rate{}, fmt.Errorf("rate %q: the count must be between 1 and %d", s, MaxRateCount)
	}
	return Rate{Count: n, Per: per}, nil
}

var rateUnits = map[string]time.Duration{"s": time.Second, "m": time.Minute, "h": time.Hour}

// IsZero reports whether r is no rate limit.
func (r Rate) IsZero() bool { return r == Rate{} }

// Interval returns the time between two starts at the steady rate,
// Per/Count: GCRA's emission interval.
func (r Rate) Interval() time.Duration {
	if r.Count <= 0 {
		return 0
	}
	return r.Per / time.Duration(r.Count)
}

// String writes r as a template does: 100/s.
func (r Rate) String() string {
	unit := ""
	switch r.Per {
	case time.Second:
		unit = "s"
	case time.Minute:
		unit = "m"
	case time.Hour:
		unit = "h"
	default:
		unit = r.Per.String()
	}
	return strconv.Itoa(r.Count) + "/" + unit
}

// check reports a Rate NewSet must refuse.
func (r Rate) check() error {
	if r.Count < 1 || r.Count > MaxRateCount || (r.Per != time.Second && r.Per != time.Minute && r.Per != time.Hour) {
		return fmt.Errorf("Rate{Count: %d, Per: %s}: want Count 1 to %d and Per time.Second, time.Minute or time.Hour", r.Count, r.Per, MaxRateCount)
	}
	return nil
}

// Debounce says that of a rule's events with the same key, only the last
// within Period runs. The zero Debounce is none.
type Debounce struct {
	// Key is the path of the event value the events are grouped by
	// (KeyOf); required.
	Key FieldPath
	// Period is how long an event waits for a successor with its key,
	// in [MinDebouncePeriod, MaxDebouncePeriod].
	Period time.Duration
}

// IsZero reports whether d is no debounce.
func (d Debounce) IsZero() bool { return d == Debounce{} }

// CheckDebouncePeriod reports a debounce period outside
// [MinDebouncePeriod, MaxDebouncePeriod].
func CheckDebouncePeriod(d time.Duration) error {
	if d < MinDebouncePeriod || d > MaxDebouncePeriod {
		return fmt.Errorf("debounce period %s: want at least %s and at most %s", FormatDuration(d), MinDebouncePeriod, FormatDuration(MaxDebouncePeriod))
	}
	return nil
}

// CheckMaxAge reports a max age shorter than MinMaxAge.
func CheckMaxAge(d time.Duration) error {
	if d < MinMaxAge {
		return fmt.Errorf("max_age %s: want at least %s (0 for none)", FormatDuration(d), MinMaxAge)
	}
	return nil
}

// FormatDuration writes d as a Go duration without zero units: 1h, 1h30m,
// 10s, 1m0.5s.
func FormatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// fill checks the Limits of a rule defined in Go and puts in the
// defaults: a RateBurst for a Rate, ScopeCluster for a ConcurrencyKey.
// appConcurrency is the app's bound per worker.
func (l *Limits) fill(appConcurrency int) error {
	switch {
	case l.Concurrency < 0 || l.Concurrency > MaxConcurrency:
		return fmt.Errorf("Limits.Concurrency %d: want 0 (no bound of the rule's own) to %d", l.Concurrency, MaxConcurrency)
	case l.Scope > ScopeCluster:
		return fmt.Errorf("Limits.Scope %s: want app.ScopeWorker or app.ScopeCluster", l.Scope)
	case l.Concurrency == 0 && l.Scope != ScopeWorker:
		return fmt.Errorf("Limits.Scope %s needs a Limits.Concurrency to bound", l.Scope)
	case l.Concurrency == 0 && l.ConcurrencyKey != "":
		return fmt.Errorf("Limits.ConcurrencyKey %s needs a Limits.Concurrency: the bound on runs per key", l.ConcurrencyKey)
	}
	if l.ConcurrencyKey != "" {
		if _, err := ParseFieldPath(string(l.ConcurrencyKey)); err != nil {
			return fmt.Errorf("Limits.ConcurrencyKey: %w", err)
		}
		l.Scope = ScopeCluster
	}
	if l.Scope == ScopeWorker && l.Concurrency > appConcurrency {
		return fmt.Errorf("Limits.Concurrency %d on each worker is more than the app's Concurrency %d, which bounds the rule too, so it would never apply: lower it, or set Limits.Scope app.ScopeCluster", l.Concurrency, appConcurrency)
	}
	if l.Rate.IsZero() {
		if l.RateBurst != 0 || l.RateKey != "" {
			return fmt.Errorf("Limits.RateBurst and Limits.RateKey need a Limits.Rate")
		}
	} else {
		if err := l.Rate.check(); err != nil {
			return fmt.Errorf("Limits.Rate: %w", err)
		}
		if l.RateBurst == 0 {
			l.RateBurst = DefaultRateBurst
		}
		if l.RateBurst < 1 || l.RateBurst > MaxRateBurst {
			return fmt.Errorf("Limits.RateBurst %d: want 1 to %d (0 takes the default %d)", l.RateBurst, MaxRateBurst, DefaultRateBurst)
		}
		if l.RateKey != "" {
			if _, err := ParseFieldPath(string(l.RateKey)); err != nil {
				return fmt.Errorf("Limits.RateKey: %w", err)
			}
		}
	}
	if !l.Debounce.IsZero() {
		if _, err := ParseFieldPath(string(l.Debounce.Key)); err != nil {
			return fmt.Errorf("Limits.Debounce.Key: %w", err)
		}
		if err := CheckDebouncePeriod(l.Debounce.Period); err != nil {
			return fmt.Errorf("Limits.Debounce.Period: %w", err)
		}
	}
	if l.MaxAge != 0 {
		if err := CheckMaxAge(l.MaxAge); err != nil {
			return fmt.Errorf("Limits.MaxAge: %w", err)
		}
		if !l.Debounce.IsZero() && l.MaxAge <= l.Debounce.Period {
			return fmt.Errorf("Limits.MaxAge %s is not longer than Limits.Debounce.Period %s: every debounced event waits the period before it runs, so each would be dead-lettered", FormatDuration(l.MaxAge), FormatDuration(l.Debounce.Period))
		}
	}
	return nil
}
