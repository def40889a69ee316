package matcher

import (
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Rule is one event rule of an app: its handler and its parsed pattern.
type Rule struct {
	App, Handler string
	Pattern      *Pattern
}

// Set matches events against many rules (docs/apps.md#patterns,
// docs/delivery.md#from-entry-to-acknowledgement). Every rule is evaluated on its own; an event
// may match several rules and every match is reported, in the order the
// rules were given. A Set is immutable and safe for concurrent use.
//
// To avoid evaluating every rule for every event, a Set indexes each rule
// under one field condition whose alternatives are all literals or
// prefixes, when the rule has one: a top-level field, or a field reached
// through nested maps that are a field's only alternative (new_image.status).
// Such a rule can only match an event whose value there (or an element of
// it, for an array) equals one of the literals or starts with one of the
// prefixes. Of several such fields, NewSet picks the one whose values the
// fewest other rules share. Rules without one are evaluated for every
// event. The index only selects candidates; each candidate is then matched
// in full, so results equal a plain scan, in the same order.
type Set struct {
	rules   []Rule
	targets []Target
	// paths holds one index per field path that rules are indexed under.
	paths []*pathIndex
	// scan lists, ascending, the rules indexed under no path.
	scan []int
	// fields is the trie of every field path some rule references: Match
	// decodes only the values under these paths.
	fields *pathNode
	// scratch holds *scratch buffers, so that a match allocates nothing.
	scratch sync.Pool
}

// pathIndex maps the values at one field path to the ascending indexes of
// the rules indexed there.
type pathIndex struct {
	path  []string // field names from the top of the event
	strs  map[string][]int
	nums  map[uint64][]int // by decimal.hash; collisions only add candidates
	bools [2][]int         // false, true
	nulls []int
	// prefixes maps each prefix to its rules; prefixLens lists the distinct
	// lengths of its keys, ascending, so that a value is looked up once per
	// length.
	prefixes   map[string][]int
	prefixLens []int
}

// scratch is the per-match working memory.
type scratch struct {
	cand, hits []int
	scan       scanner
}

// slot is a field condition a rule can be indexed under: its path and its
// alternatives, all literals or prefixes.
type slot struct {
	path []string
	alts []alt
}

// NewSet returns a Set over rules, kept in the given order. Callers pass
// them sorted by app name, then in each app's declaration order; the Rule
// index of a Target counts the rules of its App in that order. A rule with a
// nil Pattern never matches. NewSet copies rules.
func NewSet(rules []Rule) *Set {
	s := &Set{
		rules:   slices.Clone(rules),
		targets: make([]Target, len(rules)),
		fields:  new(pathNode),
	}
	s.scratch.New = func() any { return new(scratch) }
	next := make(map[string]int)
	slotsOf := make([][]slot, len(rules))
	// shared counts the rules listing each (path, value) key, to estimate
	// how many candidates a slot would bring.
	shared := make(map[string]int)
	for i, r := range rules {
		s.targets[i] = Target{App: r.App, Handler: r.Handler, Rule: next[r.App]}
		next[r.App]++
		if r.Pattern == nil {
			continue
		}
		s.fields.addFields(r.Pattern.fields)
		slotsOf[i] = collectSlots(r.Pattern.fields, nil, nil)
		for _, sl := range slotsOf[i] {
			for _, k := range sl.keys() {
				shared[k]++
			}
		}
	}
	byPath := make(map[string]*pathIndex)
	for i, r := range rules {
		if r.Pattern == nil {
			continue
		}
		best, bestCost := -1, 0
		for j, sl := range slotsOf[i] {
			cost := 0
			for _, k := range sl.keys() {
				cost += shared[k]
			}
			if best < 0 || cost < bestCost {
				best, bestCost = j, cost
			}
		}
		if best < 0 {
			s.scan = append(s.scan, i)
			continue
		}
		sl := slotsOf[i][best]
		name := strings.Join(sl.path, "\x00")
		ix := byPath[name]
		if ix == nil {
			ix = &pathIndex{path: sl.path}
			byPath[name] = ix
			s.paths = append(s.paths, ix)
		}
		ix.add(sl.alts, i)
	}
	for _, ix := range s.paths {
		for p := range ix.prefixes {
			ix.prefixLens = append(ix.prefixLens, len(p))
		}
		slices.Sort(ix.prefixLens)
		ix.prefixLens = slices.Compact(ix.prefixLens)
	}
	return s
}

// collectSlots appends the slots of fields under the path prefix: fields
// whose alternatives are all literals or prefixes, and the slots of the
// children of a field whose only alternative is a nested map. (A rule can
// only match when such a child is present and matches.)
func collectSlots(fields []field, prefix []string, out []slot) []slot {
	for i := range fields {
		f := &fields[i]
		path := append(prefix[:len(prefix):len(prefix)], f.name)
		if len(f.alts) == 1 && f.alts[0].op == opNested {
			out = collectSlots(f.alts[0].fields, path, out)
			continue
		}
		if len(f.alts) > 0 && !slices.ContainsFunc(f.alts, func(a alt) bool { return a.op != opEqual && a.op != opPrefix }) {
			out = append(out, slot{path: path, alts: f.alts})
		}
	}
	return out
}

// keys identifies the slot's (path, value) pairs for counting.
func (sl slot) keys() []string {
	path := strings.Join(sl.path, "\x00") + "\x01"
	keys := make([]string, len(sl.alts))
	for i, a := range sl.alts {
		if a.op == opPrefix {
			keys[i] = path + "p" + a.str
			continue
		}
		switch a.lit.kind {
		case litString:
			keys[i] = path + "s" + a.lit.str
		case litNumber:
			keys[i] = path + "n" + a.lit.num.String()
		case litBool:
			keys[i] = path + "b" + strconv.FormatBool(a.lit.b)
		default:
			keys[i] = path + "z"
		}
	}
	return keys
}

// add indexes rule i under every alternative.
func (ix *pathIndex) add(alts []alt, i int) {
	for _, a := range alts {
		if a.op == opPrefix {
			ix.prefixes = addRule(ix.prefixes, a.str, i)
			continue
		}
		switch a.lit.kind {
		case litString:
			ix.strs = addRule(ix.strs, a.lit.str, i)
		case litNumber:
			ix.nums = addRule(ix.nums, a.lit.num.hash(), i)
		case litBool:
			b := 0
			if a.lit.b {
				b = 1
			}
			ix.bools[b] = appendRule(ix.bools[b], i)
		default:
			ix.nulls = appendRule(ix.nulls, i)
		}
	}
}

func addRule[K comparable](m map[K][]int, k K, i int) map[K][]int {
	if m == nil {
		m = make(map[K][]int)
	}
	m[k] = appendRule(m[k], i)
	return m
}

// appendRule appends i unless it is already last: rules are added in
// ascending order, so each list stays sorted and free of duplicates.
func appendRule(ids []int, i int) []int {
	if len(ids) > 0 && ids[len(ids)-1] == i {
		return ids
	}
	return append(ids, i)
}

// collect appends the rules indexed under the values that v holds at
// ix.path[depth:], walking objects and, as a nested map is matched, every
// element of an array.
func (ix *pathIndex) collect(v any, depth int, cand []int) []int {
	if depth == len(ix.path) {
		return ix.values(v, cand)
	}
	switch v := v.(type) {
	case map[string]any:
		if child, ok := v[ix.path[depth]]; ok {
			return ix.collect(child, depth+1, cand)
		}
	case []any:
		for _, e := range v {
			cand = ix.collect(e, depth, cand)
		}
	}
	return cand
}

// values appends the rules that a literal or prefix alternative could
// match v with: v itself or, for an array, any of its elements, as
// matchValue compares them.
func (ix *pathIndex) values(v any, cand []int) []int {
	if s, ok := eventString(v); ok {
		cand = append(cand, ix.strs[s]...)
		for _, n := range ix.prefixLens {
			if n > len(s) {
				break
			}
			cand = append(cand, ix.prefixes[s[:n]]...)
		}
		return cand
	}
	switch v := v.(type) {
	case bool:
		if v {
			cand = append(cand, ix.bools[1]...)
		} else {
			cand = append(cand, ix.bools[0]...)
		}
	case nil:
		cand = append(cand, ix.nulls...)
	case []any:
		for _, e := range v {
			cand = ix.values(e, cand)
		}
	case map[string]any:
	default:
		if len(ix.nums) > 0 {
			if d, ok := eventNumber(v); ok {
				cand = append(cand, ix.nums[d.hash()]...)
			}
		}
	}
	return cand
}

// hash returns a hash of d's value: equal values have equal hashes (the
// representation is normalised, see parseDecimal). FNV-1a.
func (d decimal) hash() uint64 {
	const prime = 1099511628211
	h := uint64(14695981039346656037)
	for i := range d.ndigits() {
		h = (h ^ uint64(d.digit(i))) * prime
	}
	h = (h ^ uint64(d.exp)) * prime
	if d.neg {
		h = (h ^ '-') * prime
	}
	return h
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
//
// It accepts and rejects exactly the events DecodeEvent does, with the
// same errors (a malformed event is dead-lettered,
// docs/delivery.md#from-entry-to-acknowledgement), and matches as
// MatchValue would on DecodeEvent's result. But it decodes in one pass that
// validates the whole text and builds only the values under the field
// paths some rule references, reusing its memory across calls: apart from
// the returned slice it allocates one string for the text of those values
// and one slice header per array among them. A malformed event costs a
// second decode, with DecodeEvent, for the error.
func (s *Set) MatchAt(event []byte, now time.Time) ([]Target, error) {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	obj, ok := sc.scan.decode(event, s.fields)
	defer sc.scan.reset()
	if !ok {
		// The scanner only tells that the event is malformed; DecodeEvent
		// says how. Should the two ever disagree (FuzzDecodeReferenced and
		// FuzzMatch look for that), DecodeEvent, the reference, wins.
		full, err := DecodeEvent(event)
		if err != nil {
			return nil, err
		}
		obj = full
	}
	hits := s.matches(obj, now, sc)
	if len(hits) == 0 {
		return nil, nil
	}
	out := make([]Target, len(hits))
	for j, i := range hits {
		out[j] = s.targets[i]
	}
	return out, nil
}

// MatchValue is MatchAt for an event decoded by DecodeEvent. Apart from
// the slice it returns (none when no rule matches), it allocates nothing,
// except to parse a timestamp longer than 32 bytes or with an offset that is
// not a whole number of hours.
func (s *Set) MatchValue(event map[string]any, now time.Time) []Target {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	hits := s.matches(event, now, sc)
	if len(hits) == 0 {
		return nil
	}
	out := make([]Target, len(hits))
	for j, i := range hits {
		out[j] = s.targets[i]
	}
	return out
}

// AppendMatches is MatchValue appending the targets to dst, for callers
// that reuse a slice: when dst has room, it allocates nothing (with the
// same timestamp exceptions as MatchValue).
func (s *Set) AppendMatches(dst []Target, event map[string]any, now time.Time) []Target {
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	for _, i := range s.matches(event, now, sc) {
		dst = append(dst, s.targets[i])
	}
	return dst
}

// matches returns the ascending indexes of the rules event matches, in
// sc's memory.
func (s *Set) matches(event map[string]any, now time.Time, sc *scratch) []int {
	cand := sc.cand[:0]
	for _, ix := range s.paths {
		cand = ix.collect(event, 0, cand)
	}
	ids := s.scan
	if len(cand) > 0 {
		cand = append(cand, s.scan...)
		slices.Sort(cand)
		cand = slices.Compact(cand)
		ids = cand
	}
	hits := sc.hits[:0]
	for _, i := range ids {
		if s.rules[i].Pattern.MatchValue(event, now) {
			hits = append(hits, i)
		}
	}
	sc.cand, sc.hits = cand[:0], hits
	return hits
}
