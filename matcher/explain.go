package matcher

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Explanation says whether one rule's pattern matched an event, and why,
// condition by condition. Matched always equals what Pattern.MatchValue (and
// so a Set) decides for the same event and time.
type Explanation struct {
	// Target names the rule; it is the zero Target for Explain on a lone
	// Pattern.
	Target  Target
	Matched bool
	// Conditions lists the outcome of every field condition, in pattern
	// order. A field whose condition is a single nested map is not listed
	// itself: its children are, under their own paths. Matched is true
	// exactly when every condition matched.
	Conditions []Condition
}

// Condition is the outcome of one field condition.
type Condition struct {
	// Path locates the field in the event: field names joined by "." (names
	// that are not plain words are quoted), with [i] after an array whose
	// element i a nested map was checked against: new_image.status,
	// items[0].sku.
	Path    string
	Matched bool
	// Reason says why, in words, e.g. `"PENDING" is not one of
	// [COMPLETED]`, `missing`, `present (exists: false)`, `42 is not > 70`.
	Reason string
}

// String returns "path: reason".
func (c Condition) String() string { return c.Path + ": " + c.Reason }

// Explain evaluates p against event, like p.MatchValue(event, now), and
// returns the outcome of every condition. A nil p matches nothing and
// explains nothing.
func Explain(p *Pattern, event map[string]any, now time.Time) Explanation {
	if p == nil {
		return Explanation{}
	}
	e := explainer{now: now}
	e.fields(p.fields, event, "", "")
	return Explanation{Matched: p.MatchValue(event, now), Conditions: e.conds}
}

// Explain explains every rule of s for event, in the order of the rules (the
// dispatch order), whether it matched or not. The Explanations whose Matched
// is true name exactly the Targets that MatchValue returns.
func (s *Set) Explain(event map[string]any, now time.Time) []Explanation {
	out := make([]Explanation, len(s.rules))
	for i, r := range s.rules {
		out[i] = Explain(r.Pattern, event, now)
		out[i].Target = s.targets[i]
	}
	return out
}

// explainer collects conditions while it walks a pattern and an event. Every
// decision it reports comes from the matching functions themselves; the
// explainer only adds the words.
type explainer struct {
	now   time.Time
	conds []Condition
}

func (e *explainer) add(path string, matched bool, reason string) {
	e.conds = append(e.conds, Condition{Path: path, Matched: matched, Reason: reason})
}

// fields explains every field of a map against obj. A nil obj has no keys;
// noKeys then says why ("new_image is missing"), or is empty at the top.
func (e *explainer) fields(fields []field, obj map[string]any, prefix, noKeys string) {
	for i := range fields {
		f := &fields[i]
		v, present := obj[f.name]
		e.field(f, v, present, joinPath(prefix, f.name), noKeys)
	}
}

func (e *explainer) field(f *field, v any, present bool, path, noKeys string) {
	if len(f.alts) == 1 && f.alts[0].op == opNested {
		fields := f.alts[0].fields
		if !present {
			e.fields(fields, nil, path, firstOf(noKeys, path+" is missing"))
			return
		}
		e.nested(fields, v, path)
		return
	}
	matched := matchAlts(f.alts, v, present, e.now)
	var reason string
	switch {
	case !present:
		reason = e.missingReason(f.alts, matched, noKeys)
	case matched:
		reason = e.matchedReason(f.alts, v)
	default:
		reason = e.failedReason(f.alts, v)
	}
	e.add(path, matched, reason)
}

// nested explains a present value against a nested map, as matchNested
// decides: an object directly, an array through the first element that
// matches, anything else as a value without keys.
func (e *explainer) nested(fields []field, v any, path string) {
	switch v := v.(type) {
	case map[string]any:
		e.fields(fields, v, path, "")
		return
	case []any:
		if len(v) == 0 {
			e.fields(fields, nil, path, path+" is an empty array")
			return
		}
		for i, el := range v {
			if matchNested(fields, el, e.now) {
				e.nested(fields, el, path+"["+strconv.Itoa(i)+"]")
				return
			}
		}
		if len(v) == 1 {
			e.nested(fields, v[0], path+"[0]")
			return
		}
		e.add(path, false, "no element of "+formatValue(v)+" matches "+formatFields(fields))
		return
	}
	e.fields(fields, nil, path, path+" is "+kindOf(v)+", not an object")
}

// missingReason explains a condition on an absent field.
func (e *explainer) missingReason(alts []alt, matched bool, noKeys string) string {
	why := ""
	if noKeys != "" {
		why = "; " + noKeys
	}
	if matched {
		for i := range alts {
			a := &alts[i]
			if !matchAlts(alts[i:i+1], nil, false, e.now) {
				continue
			}
			if a.op == opExists {
				return "missing (exists: false" + why + ")"
			}
			return "missing, and " + formatFields(a.fields) + " allows that" + paren(noKeys)
		}
	}
	for i := range alts {
		if alts[i].op == opExists && alts[i].exists {
			return "missing (exists: true" + why + ")"
		}
	}
	return "missing" + paren(noKeys)
}

// matchedReason names the first alternative that matches the present
// value v.
func (e *explainer) matchedReason(alts []alt, v any) string {
	for i := range alts {
		a := &alts[i]
		if !matchAlts(alts[i:i+1], v, true, e.now) {
			continue
		}
		switch a.op {
		case opExists:
			return "present (exists: true)"
		case opNested:
			return formatValue(v) + " matches " + formatFields(a.fields)
		}
		if arr, ok := v.([]any); ok {
			if el, ok := firstElement(arr, func(x any) bool { return matchValue(a, x, e.now) }); ok {
				return formatValue(v) + " contains " + formatValue(el) + ", which " + e.phrase(alts, a, true)
			}
		}
		return formatValue(v) + " " + e.phrase(alts, a, true)
	}
	return formatValue(v) + " matches" // not reached: the caller saw a match
}

// failedReason says why no alternative matches the present value v: one
// part for the literals together, one for each other alternative.
func (e *explainer) failedReason(alts []alt, v any) string {
	arr, isArray := v.([]any)
	if len(alts) == 1 && alts[0].op == opExists {
		return "present (exists: " + strconv.FormatBool(alts[0].exists) + ")"
	}
	var parts, elemParts []string
	literals := false
	for i := range alts {
		a := &alts[i]
		switch {
		case a.op == opExists:
			parts = append(parts, "is present (exists: false)")
		case a.op == opNested:
			parts = append(parts, "does not match "+formatFields(a.fields))
		case a.op == opEqual && literals:
			// Already covered by the first literal's "one of" list.
		case isArray:
			literals = literals || a.op == opEqual
			elemParts = append(elemParts, e.phrase(alts, a, true))
		default:
			literals = literals || a.op == opEqual
			parts = append(parts, e.phrase(alts, a, false)+e.hint(alts, a, v))
		}
	}
	if len(elemParts) > 0 {
		p := "has no element that " + strings.Join(elemParts, " or ")
		if len(arr) == 0 {
			p = "is an empty array"
		}
		parts = append([]string{p}, parts...)
	}
	return formatValue(v) + " " + strings.Join(parts, "; ")
}

// phrase is the verb phrase of one value alternative: "is one of [A, B]",
// "starts with "x"", "is > 70"; negated when !positive. A literal speaks for
// every literal alternative of the field.
func (e *explainer) phrase(alts []alt, a *alt, positive bool) string {
	is, does := "is ", "does not "
	if !positive {
		is = "is not "
	}
	switch a.op {
	case opEqual:
		return is + "one of " + formatLiterals(alts)
	case opPrefix:
		if positive {
			return "starts with " + strconv.Quote(a.str)
		}
		return does + "start with " + strconv.Quote(a.str)
	case opSuffix:
		if positive {
			return "ends with " + strconv.Quote(a.str)
		}
		return does + "end with " + strconv.Quote(a.str)
	case opGT, opGTE, opLT, opLTE:
		if a.temporal {
			cutoff := e.now.Add(a.offset).UTC().Format(time.RFC3339Nano)
			return is + opSymbol(a.op) + " " + a.nowText + " = " + cutoff
		}
		return is + opSymbol(a.op) + " " + a.num.String()
	}
	return is + a.op.String()
}

// hint adds why a scalar value cannot match an alternative at all, when its
// type is the reason: a number against a prefix, the string "35" against the
// number 35.
func (e *explainer) hint(alts []alt, a *alt, v any) string {
	_, isString := v.(string)
	switch a.op {
	case opPrefix, opSuffix:
		if !isString {
			return " (" + kindOf(v) + ", not a string)"
		}
	case opGT, opGTE, opLT, opLTE:
		if a.temporal {
			if !isString {
				return " (" + kindOf(v) + ", not an RFC 3339 timestamp)"
			}
			if _, ok := parseTimestamp(v.(string)); !ok {
				return " (not an RFC 3339 timestamp)"
			}
		} else if _, ok := eventNumber(v); !ok {
			return " (" + kindOf(v) + ", not a number)"
		}
	case opEqual:
		kinds := map[litKind]bool{}
		for i := range alts {
			if alts[i].op == opEqual {
				kinds[alts[i].lit.kind] = true
			}
		}
		if k, ok := valueKind(v); ok && !kinds[k] && len(kinds) == 1 {
			for want := range kinds {
				return " (" + kindOf(v) + ", not " + litKindName(want) + ")"
			}
		}
	}
	return ""
}

// firstElement returns the first scalar element of arr, searching nested
// arrays too, for which ok holds.
func firstElement(arr []any, ok func(any) bool) (any, bool) {
	for _, x := range arr {
		if inner, isArr := x.([]any); isArr {
			if el, found := firstElement(inner, ok); found {
				return el, true
			}
			continue
		}
		if ok(x) {
			return x, true
		}
	}
	return nil, false
}

func opSymbol(o op) string {
	switch o {
	case opGT:
		return ">"
	case opGTE:
		return ">="
	case opLT:
		return "<"
	case opLTE:
		return "<="
	}
	return o.String()
}

// valueKind returns the literal kind a scalar event value would compare
// equal under; ok is false for objects and arrays.
func valueKind(v any) (litKind, bool) {
	switch v.(type) {
	case nil:
		return litNull, true
	case string:
		return litString, true
	case bool:
		return litBool, true
	}
	if _, ok := eventNumber(v); ok {
		return litNumber, true
	}
	return 0, false
}

func litKindName(k litKind) string {
	switch k {
	case litString:
		return "a string"
	case litNumber:
		return "a number"
	case litBool:
		return "a boolean"
	}
	return "null"
}

// kindOf names the JSON type of an event value: "a string", "an object".
func kindOf(v any) string {
	switch v.(type) {
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	}
	if k, ok := valueKind(v); ok {
		return litKindName(k)
	}
	return jsonKind(v)
}

// formatLiterals lists the literal alternatives of a field in YAML flow
// style, with plain words unquoted: [COMPLETED, "35", 35, null].
func formatLiterals(alts []alt) string {
	var b strings.Builder
	b.WriteByte('[')
	n := 0
	for i := range alts {
		if alts[i].op != opEqual {
			continue
		}
		if n > 0 {
			b.WriteString(", ")
		}
		n++
		l := &alts[i].lit
		if l.kind == litString {
			b.WriteString(plainString(l.str))
		} else {
			b.WriteString(l.String())
		}
	}
	b.WriteByte(']')
	return b.String()
}

// plainString writes s bare when YAML would read it back as the same string
// (a word of letters, digits, "_" and "-" that is not a number, boolean or
// null), else double-quoted.
func plainString(s string) string {
	switch strings.ToLower(s) {
	case "true", "false", "null", "yes", "no", "on", "off", "y", "n", "~":
		return strconv.Quote(s)
	}
	if s == "" || !(s[0] == '_' || 'a' <= s[0] && s[0] <= 'z' || 'A' <= s[0] && s[0] <= 'Z') {
		return strconv.Quote(s)
	}
	return formatKey(s)
}

// formatFields writes a nested map in canonical flow form, shortened.
func formatFields(fields []field) string {
	var b strings.Builder
	writeFields(&b, fields)
	return shorten(b.String())
}

// maxValueRunes bounds how much of a value or nested map a reason quotes.
const maxValueRunes = 60

// formatValue writes an event value as compact JSON, shortened.
func formatValue(v any) string {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return "<" + kindOf(v) + ">"
	}
	return shorten(strings.TrimSuffix(buf.String(), "\n"))
}

func shorten(s string) string {
	if utf8.RuneCountInString(s) <= maxValueRunes {
		return s
	}
	r := []rune(s)
	return string(r[:maxValueRunes-1]) + "…"
}

func joinPath(prefix, name string) string {
	if prefix == "" {
		return formatKey(name)
	}
	return prefix + "." + formatKey(name)
}

func paren(s string) string {
	if s == "" {
		return ""
	}
	return " (" + s + ")"
}

func firstOf(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
