package matcher

import (
	"encoding/json"
	"math"
	"strconv"
	"strings"
	"time"
)

// Pattern is one rule's parsed pattern (docs/apps.md#patterns). It is
// immutable and safe for concurrent use. Build one with ParseTree, or from
// YAML with package matcher/yamlpattern.
type Pattern struct {
	fields []field
}

// field is one field condition: the event value under name must match at
// least one of alts.
type field struct {
	name string
	alts []alt
}

// alt is one alternative of a field condition.
type alt struct {
	op op
	// lit is the literal of opEqual.
	lit literal
	// str is the operand of opPrefix and opSuffix.
	str string
	// exists is the operand of opExists.
	exists bool
	// num is the numeric operand of opGT..opLTE, unless temporal.
	num decimal
	// temporal marks a now()-relative operand of opGT..opLTE; the cutoff is
	// the match time plus offset.
	temporal bool
	offset   time.Duration
	nowText  string // the now() expression as written
	// fields are the children of opNested, ANDed.
	fields []field
}

type litKind uint8

const (
	litNull litKind = iota
	litString
	litNumber
	litBool
)

// literal is a scalar from a pattern: the operand of equality.
type literal struct {
	kind litKind
	str  string
	num  decimal
	b    bool
}

// MatchValue reports whether event matches p, with now() cutoffs taken
// relative to now. event is an object as DecodeEvent returns it: values are
// map[string]any, []any, string, json.Number, bool or nil; float64, int and
// int64 are accepted as numbers too. A nil event has no fields.
func (p *Pattern) MatchValue(event map[string]any, now time.Time) bool {
	if p == nil {
		return false
	}
	return matchFields(p.fields, event, now)
}

// matchFields reports whether obj satisfies every field. A nil obj stands for
// an absent or non-object parent: it has no keys.
func matchFields(fields []field, obj map[string]any, now time.Time) bool {
	for i := range fields {
		f := &fields[i]
		v, present := obj[f.name]
		if !matchAlts(f.alts, v, present, now) {
			return false
		}
	}
	return true
}

func matchAlts(alts []alt, v any, present bool, now time.Time) bool {
	for i := range alts {
		a := &alts[i]
		switch {
		case a.op == opExists:
			if present == a.exists {
				return true
			}
		case a.op == opNested:
			if !present {
				if matchFields(a.fields, nil, now) {
					return true
				}
			} else if matchNested(a.fields, v, now) {
				return true
			}
		case present:
			if matchValue(a, v, now) {
				return true
			}
		}
	}
	return false
}

// matchNested matches a present value against a nested map. An object is
// matched directly; a non-empty array matches when one of its elements does;
// anything else (a scalar, null, an empty array) has no keys, so only absence
// conditions such as exists: false can hold.
func matchNested(fields []field, v any, now time.Time) bool {
	switch v := v.(type) {
	case map[string]any:
		return matchFields(fields, v, now)
	case []any:
		for _, e := range v {
			if matchNested(fields, e, now) {
				return true
			}
		}
		if len(v) > 0 {
			return false
		}
	}
	return matchFields(fields, nil, now)
}

// matchValue matches a present value against a literal or an operator other
// than exists. An array matches when one of its elements does.
func matchValue(a *alt, v any, now time.Time) bool {
	if arr, ok := v.([]any); ok {
		for _, e := range arr {
			if matchValue(a, e, now) {
				return true
			}
		}
		return false
	}
	switch a.op {
	case opEqual:
		return equalLiteral(&a.lit, v)
	case opPrefix:
		s, ok := eventString(v)
		return ok && strings.HasPrefix(s, a.str)
	case opSuffix:
		s, ok := eventString(v)
		return ok && strings.HasSuffix(s, a.str)
	case opGT, opGTE, opLT, opLTE:
		var c int
		if a.temporal {
			s, ok := eventString(v)
			if !ok {
				return false
			}
			t, ok := parseTimestamp(s)
			if !ok {
				return false
			}
			c = t.Compare(now.Add(a.offset))
		} else {
			d, ok := eventNumber(v)
			if !ok {
				return false
			}
			c = d.cmp(a.num)
		}
		switch a.op {
		case opGT:
			return c > 0
		case opGTE:
			return c >= 0
		case opLT:
			return c < 0
		default:
			return c <= 0
		}
	}
	return false
}

func equalLiteral(l *literal, v any) bool {
	switch l.kind {
	case litNull:
		return v == nil
	case litString:
		s, ok := eventString(v)
		return ok && s == l.str
	case litBool:
		b, ok := v.(bool)
		return ok && b == l.b
	case litNumber:
		d, ok := eventNumber(v)
		return ok && d.cmp(l.num) == 0
	}
	return false
}

// eventString returns the text of an event's string value: a string, or
// a *string as the decoder of Set.Match builds them (scan.go) to spare an
// allocation per value. Matching code reads strings only through it.
func eventString(v any) (string, bool) {
	switch s := v.(type) {
	case string:
		return s, true
	case *string:
		return *s, true
	}
	return "", false
}

// eventNumber converts an event's number value to a decimal: a
// json.Number, a *json.Number as the decoder of Set.Match builds them, or
// a Go number as MatchValue accepts them.
func eventNumber(v any) (decimal, bool) {
	switch n := v.(type) {
	case json.Number:
		return parseDecimal(string(n), false)
	case *json.Number:
		return parseDecimal(string(*n), false)
	case float64:
		if math.IsNaN(n) || math.IsInf(n, 0) {
			return decimal{}, false
		}
		return parseDecimal(strconv.FormatFloat(n, 'g', -1, 64), false)
	case int:
		return parseDecimal(strconv.Itoa(n), false)
	case int64:
		return parseDecimal(strconv.FormatInt(n, 10), false)
	}
	return decimal{}, false
}
