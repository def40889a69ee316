package matcher

import (
	"slices"
	"sort"
	"strconv"
	"time"
)

// Rule is one event rule of an app: its handler and its parsed pattern.
type Rule struct {
	App, Handler string
	Pattern      *Pattern
}

// Set matches events against many rules (events.md "Combining conditions",
// "Dispatch and concurrency"). Every rule is evaluated on its own; an event
// may match several rules and every match is reported, in the order the
// rules were given. A Set is immutable and safe for concurrent use.
//
// To avoid evaluating every rule for every event, a Set indexes each rule
// under one top-level field whose alternatives are all literals, when the
// rule has one: such a rule can only match an event whose value there (or
// an element of it, for an array) equals one of them. The other rules are
// evaluated for every event. The index only selects candidates; each
// candidate is then matched in full, so results equal a plain scan.
type Set struct {
	rules   []Rule
	targets []Target
	// index maps a field name and a literal key (see literalKey) to the
	// ascending indexes of the rules indexed there.
	index map[string]map[string][]int
	// fields lists the keys of index in sorted order.
	fields []string
	// scan lists, ascending, the rules that are not indexed.
	scan []int
}

// NewSet returns a Set over rules, kept in the given order. Callers pass
// them sorted by app name, then in each app's declaration order; the Rule
// index of a Target counts the rules of its App in that order. A rule with a
// nil Pattern never matches. NewSet copies rules.
func NewSet(rules []Rule) *Set {
	s := &Set{
		rules:   slices.Clone(rules),
		targets: make([]Target, len(rules)),
		index:   make(map[string]map[string][]int),
	}
	next := make(map[string]int)
	for i, r := range rules {
		s.targets[i] = Target{App: r.App, Handler: r.Handler, Rule: next[r.App]}
		next[r.App]++
		if r.Pattern == nil {
			continue
		}
		f := indexField(r.Pattern)
		if f == nil {
			s.scan = append(s.scan, i)
			continue
		}
		byKey := s.index[f.name]
		if byKey == nil {
			byKey = make(map[string][]int)
			s.index[f.name] = byKey
			s.fields = append(s.fields, f.name)
		}
		for _, a := range f.alts {
			k := a.lit.key()
			if ids := byKey[k]; len(ids) == 0 || ids[len(ids)-1] != i {
				byKey[k] = append(ids, i)
			}
		}
	}
	sort.Strings(s.fields)
	return s
}

// indexField returns the top-level field of p whose alternatives are all
// literals, preferring the one with the fewest; nil when there is none.
func indexField(p *Pattern) *field {
	var best *field
	for i := range p.fields {
		f := &p.fields[i]
		if len(f.alts) == 0 || best != nil && len(f.alts) >= len(best.alts) {
			continue
		}
		if !slices.ContainsFunc(f.alts, func(a alt) bool { return a.op != opEqual }) {
			best = f
		}
	}
	return best
}

// key identifies a literal's value: equal values have equal keys.
func (l literal) key() string {
	switch l.kind {
	case litString:
		return "s" + l.str
	case litNumber:
		return "n" + l.num.String()
	case litBool:
		return "b" + strconv.FormatBool(l.b)
	}
	return "z"
}

// valueKeys calls fn with the literal key of v, or of every scalar element
// of v when it is an array, as equalLiteral would compare them.
func valueKeys(v any, fn func(string)) {
	switch v := v.(type) {
	case nil:
		fn("z")
	case string:
		fn("s" + v)
	case bool:
		fn("b" + strconv.FormatBool(v))
	case []any:
		for _, e := range v {
			valueKeys(e, fn)
		}
	default:
		if d, ok := eventNumber(v); ok {
			fn("n" + d.String())
		}
	}
}

// Len returns the number of rules.
func (s *Set) Len() int { return len(s.rules) }

// Match decodes event (see DecodeEvent) and returns the targets of every
// rule it matches, using time.Now for now() cutoffs. It returns nil when no
// rule matches, and an error wrapping ErrMalformed when event is not a JSON
// object.
func (s *Set) Match(event []byte) ([]Target, error) {
	return s.MatchAt(event, time.Now())
}

// MatchAt is Match with now() cutoffs relative to now.
func (s *Set) MatchAt(event []byte, now time.Time) ([]Target, error) {
	v, err := DecodeEvent(event)
	if err != nil {
		return nil, err
	}
	return s.MatchValue(v, now), nil
}

// MatchValue is MatchAt for an event decoded by DecodeEvent.
func (s *Set) MatchValue(event map[string]any, now time.Time) []Target {
	var cand []int
	for _, name := range s.fields {
		v, ok := event[name]
		if !ok {
			continue
		}
		byKey := s.index[name]
		valueKeys(v, func(k string) { cand = append(cand, byKey[k]...) })
	}
	if len(cand) == 0 && len(s.scan) == 0 {
		return nil
	}
	cand = append(cand, s.scan...)
	slices.Sort(cand)
	cand = slices.Compact(cand)
	var out []Target
	for _, i := range cand {
		if s.rules[i].Pattern.MatchValue(event, now) {
			out = append(out, s.targets[i])
		}
	}
	return out
}
