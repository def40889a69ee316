package matcher

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// op is the kind of one alternative of a field condition.
type op uint8

const (
	opEqual  op = iota // bare literal
	opNested           // map of child fields
	opPrefix
	opSuffix
	opExists
	opGT
	opGTE
	opLT
	opLTE
)

// operators maps the operator names of docs/apps.md#patterns to their op.
var operators = map[string]op{
	"prefix": opPrefix,
	"suffix": opSuffix,
	"exists": opExists,
	"gt":     opGT,
	"gte":    opGTE,
	"lt":     opLT,
	"lte":    opLTE,
}

// operatorList is the operator names in the order the spec lists them, for
// messages.
const operatorList = "prefix, suffix, exists, gt, gte, lt, lte"

func (o op) String() string {
	for name, v := range operators {
		if v == o {
			return name
		}
	}
	switch o {
	case opEqual:
		return "equal"
	case opNested:
		return "nested"
	}
	return fmt.Sprintf("op(%d)", uint8(o))
}

// foreign is what Relay has instead of an operator of another pattern
// language, or of a common misspelling of its own.
type foreign struct {
	// hint says what Relay has instead.
	hint string
	// as is the operator that does the same with one operand ("=" for a
	// bare literal, "numeric" for EventBridge's [">", n] pairs), from which
	// a fix is written out; "" when there is none.
	as string
	// field marks a name refused as a field name too (its value a list or
	// a map): an operator name of another pattern language read as a
	// nested field would only ever match events that have such a field,
	// which is never what was meant (docs/apps.md#patterns). The few
	// ordinary words among the spellings (present, missing, matches) stay
	// field names.
	field bool
}

// foreigns are operator names from other pattern languages (EventBridge
// and quamina, MongoDB without its $, SQL) and common spellings, keyed as
// normaliseKey writes them.
var foreigns = map[string]foreign{
	"startswith":       {`did you mean "prefix"?`, "prefix", true},
	"beginswith":       {`did you mean "prefix"?`, "prefix", true},
	"endswith":         {`did you mean "suffix"?`, "suffix", true},
	"exist":            {`did you mean "exists"?`, "exists", true},
	">":                {`did you mean "gt"?`, "gt", true},
	">=":               {`did you mean "gte"?`, "gte", true},
	"<":                {`did you mean "lt"?`, "lt", true},
	"<=":               {`did you mean "lte"?`, "lte", true},
	"ge":               {`did you mean "gte"?`, "gte", true},
	"le":               {`did you mean "lte"?`, "lte", true},
	"eq":               {noEquals, "=", true},
	"equal":            {noEquals, "=", true},
	"equals":           {noEquals, "=", true},
	"=":                {noEquals, "=", true},
	"==":               {noEquals, "=", true},
	"in":               {"there is no in operator: a list of literals matches any of them", "=", true},
	"ne":               {noNegation, "", true},
	"neq":              {noNegation, "", true},
	"not":              {noNegation, "", true},
	"nin":              {noNegation, "", true},
	"notin":            {noNegation, "", true},
	"anythingbut":      {noNegation, "", true},
	"!=":               {noNegation, "", true},
	"<>":               {noNegation, "", true},
	"numeric":          {"there is no numeric operator: compare with gt, gte, lt or lte", "numeric", true},
	"regex":            {noRegex, "", true},
	"regexp":           {noRegex, "", true},
	"wildcard":         {noWildcard, "", true},
	"shellstyle":       {noWildcard, "", true},
	"glob":             {noWildcard, "", true},
	"like":             {noWildcard, "", true},
	"contains":         {noWildcard, "", true},
	"cidr":             {"there is no cidr operator: use prefix for an address prefix, or list the addresses", "", true},
	"equalsignorecase": {"there is no case-insensitive operator: list each spelling to match", "", true},
	"present":          {`did you mean "exists: true"?`, "", false},
	"missing":          {`did you mean "exists: false"?`, "", false},
	"matches":          {noRegex, "", false},
}

const (
	noEquals   = "there is no equals operator: a bare literal is equality"
	noNegation = "there is no negation operator: list the values to match, or use exists: false for an absent field"
	noRegex    = "there is no regular expression operator (a pattern matches in time linear in the event): use prefix or suffix, or list the values"
	noWildcard = "there is no wildcard or substring operator: use prefix or suffix, or list the values"
)

// normaliseKey is key as operator look-ups compare it: lower case, without
// "-", "_" and a leading "$" (MongoDB's operators start with one).
func normaliseKey(key string) string {
	return strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(strings.TrimPrefix(key, "$")))
}

// foreignOperator reports what Relay has instead of key when key is an
// operator name of another pattern language or a known spelling of one of
// Relay's own ($gt, EXISTS); ok is false for any other key.
func foreignOperator(key string) (f foreign, ok bool) {
	k := normaliseKey(key)
	if f, ok := foreigns[k]; ok {
		return f, true
	}
	if isOperator(k) && k != key {
		// Refused as a field name only with a $: "Prefix" may well be a
		// field of someone's events, "$prefix" is not.
		return foreign{hint: fmt.Sprintf("did you mean %q?", k), as: k, field: strings.HasPrefix(key, "$")}, true
	}
	return foreign{}, false
}

// refusedAsField reports whether key, unescaped, is an operator name of
// another pattern language, which is never read as a field name.
func refusedAsField(key string) bool {
	f, ok := foreignOperator(key)
	return ok && f.field
}

// operatorHint returns a hint when key looks like a misspelled or foreign
// operator name. Case, "-", "_" and a leading "$" are ignored. A known
// foreign name (eq, >=, starts_with) or a name at edit distance 0 or 1
// from an operator is a sure hint; distance 2 from prefix, suffix or
// exists, or distance 1 from gt, gte, lt or lte with a different first
// letter ("at"), is an unsure one, and the caller also says how to write
// the key as a field. Anything further gets no hint, so that short field
// names such as "id" are not taken for "gt".
func operatorHint(key string) (hint string, sure, ok bool) {
	k := normaliseKey(key)
	if f, ok := foreigns[k]; ok {
		return f.hint, true, true
	}
	best, bestDist, bestSure := "", 3, false
	for _, name := range []string{"prefix", "suffix", "exists", "gt", "gte", "lt", "lte"} {
		d := editDistance(k, name)
		if d >= bestDist {
			continue
		}
		switch {
		case len(name) > 3 && d <= 2:
			best, bestDist, bestSure = name, d, d <= 1
		case len(name) <= 3 && d <= 1:
			best, bestDist, bestSure = name, d, d == 0 || k[0] == name[0]
		}
	}
	if best == "" {
		return "", false, false
	}
	return fmt.Sprintf("did you mean %q?", best), bestSure, true
}

// foreignFix writes out what to write instead of key: value under field,
// when key is a foreign operator Relay has an equivalent of and value holds
// scalar operands; "" otherwise. field is "" at the top level.
func foreignFix(key, field string, value *Node) string {
	f, ok := foreignOperator(key)
	if !ok || f.as == "" {
		return ""
	}
	if field == "" {
		field = "<field>"
	}
	operands, ok := scalarOperands(value)
	if !ok {
		return ""
	}
	if f.as == "numeric" {
		return numericFix(field, operands)
	}
	alts := make([]string, len(operands))
	for i, o := range operands {
		switch f.as {
		case "=":
			alts[i] = scalarText(o)
		case "prefix", "suffix":
			text := o.Text
			if o.Kind == KindString || o.Kind == KindBlock {
				text = o.Value
			}
			alts[i] = "{" + f.as + ": " + strconv.Quote(text) + "}"
		default:
			alts[i] = "{" + f.as + ": " + scalarText(o) + "}"
		}
	}
	return "write " + field + ": [" + strings.Join(alts, ", ") + "]"
}

// numericFix translates EventBridge's numeric: [">", 0] into a Relay
// comparison; a range ([">=", 0, "<", 5]) has no equivalent, since the
// alternatives of one field are OR.
func numericFix(field string, operands []*Node) string {
	ops := map[string]string{">": "gt", ">=": "gte", "<": "lt", "<=": "lte", "=": "="}
	switch {
	case len(operands) > 2:
		return "a range cannot be one condition: the alternatives of a field are OR, so match one bound, e.g. " + field + ": [{gt: 0}]"
	case len(operands) == 2:
		if op, ok := ops[operands[0].Text]; ok && operands[0].Kind == KindString {
			if op == "=" {
				return "write " + field + ": [" + scalarText(operands[1]) + "]"
			}
			return "write " + field + ": [{" + op + ": " + scalarText(operands[1]) + "}]"
		}
	}
	return "write e.g. " + field + ": [{gt: 0}]"
}

// scalarOperands returns the operands of a foreign operator: value itself
// when it is a scalar, else its elements when every one is; ok is false
// otherwise (a map, a nested list, nothing).
func scalarOperands(value *Node) ([]*Node, bool) {
	switch syntaxKind(value) {
	case KindString, KindInt, KindFloat, KindBool, KindNull, KindBlock:
		return []*Node{value}, true
	case KindSequence:
		if len(value.Elems) == 0 {
			return nil, false
		}
		for _, e := range value.Elems {
			switch syntaxKind(e) {
			case KindString, KindInt, KindFloat, KindBool, KindNull, KindBlock:
			default:
				return nil, false
			}
		}
		return value.Elems, true
	}
	return nil, false
}

// editDistance is the optimal string alignment distance between a and b,
// in bytes: insertions, deletions, substitutions and transpositions of
// adjacent bytes each cost 1, so "perfix" is 1 away from "prefix".
func editDistance(a, b string) int {
	if len(a) > 32 || len(b) > 32 {
		return max(len(a), len(b)) // far apart anyway; keep the cost bounded
	}
	// d[i][j] is the distance between a[:i] and b[:j].
	var d [33][33]int
	for i := range len(a) + 1 {
		d[i][0] = i
	}
	for j := range len(b) + 1 {
		d[0][j] = j
	}
	for i := 1; i <= len(a); i++ {
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && a[i-1] == b[j-2] && a[i-2] == b[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(a)][len(b)]
}

// parseNow parses a now()-relative expression: "now()" or "now()" followed
// by "+" or "-" and a Go duration such as "5m" or "1h30m", with no spaces. It
// returns the offset to add to the match time. ok is false when s is not
// such an expression; msg then explains what is wrong and how to write it.
func parseNow(s string) (offset time.Duration, ok bool, msg string) {
	const example = `use a now()-relative expression such as "now()-5m"`
	if s == "now()" {
		return 0, true, ""
	}
	if rest, found := strings.CutPrefix(s, "now()"); found {
		if strings.ContainsAny(rest, " \t\n\r") {
			if fixed := strings.Join(strings.Fields(s), ""); fixed != s {
				if _, ok, _ := parseNow(fixed); ok {
					return 0, false, fmt.Sprintf("no spaces are allowed in a now() expression: write %q", fixed)
				}
			}
		}
		if rest[0] != '+' && rest[0] != '-' {
			return 0, false, fmt.Sprintf(`%q: after now() comes "+" or "-" and a duration, e.g. "now()-5m"`, s)
		}
		sign, dur := rest[0], rest[1:]
		if dur == "" || !(isDigit(dur[0]) || dur[0] == '.') {
			return 0, false, fmt.Sprintf(`%q: expected a duration after %q, e.g. "now()%c5m"`, s, "now()"+string(sign), sign)
		}
		d, err := time.ParseDuration(dur)
		if err != nil {
			hint := ""
			if strings.ContainsAny(dur, "dDwWyY") {
				hint = ` (there is no day unit: write 24h for a day)`
			}
			return 0, false, fmt.Sprintf("%q: %q is not a Go duration; use units h, m, s, ms, us, ns as in 1h30m%s", s, dur, hint)
		}
		if sign == '-' {
			d = -d
		}
		return d, true, ""
	}
	lower := strings.ToLower(strings.TrimSpace(s))
	switch {
	case isRFC3339(s):
		return 0, false, fmt.Sprintf("literal timestamp %q is not accepted; %s", s, example)
	case strings.HasPrefix(lower, "now()"):
		return 0, false, fmt.Sprintf("%q: write now() in lower case without surrounding spaces, e.g. %q", s, "now()-5m")
	case strings.HasPrefix(lower, "now"):
		fixed := "now()" + strings.Join(strings.Fields(s[strings.Index(lower, "now")+3:]), "")
		if _, ok, _ := parseNow(fixed); ok {
			return 0, false, fmt.Sprintf("%q is the old syntax: write %q", s, fixed)
		}
		return 0, false, fmt.Sprintf("%q is not a now() expression; %s", s, example)
	}
	if _, ok := parseDecimal(strings.TrimSpace(s), true); ok {
		return 0, false, fmt.Sprintf("%q is a quoted number: write it without quotes to compare numbers", s)
	}
	return 0, false, fmt.Sprintf("%q is neither a number nor a now() expression; %s", s, example)
}
