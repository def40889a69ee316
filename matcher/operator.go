package matcher

import (
	"fmt"
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

// aliases are operator names from other pattern languages and common
// spellings, mapped to the hint given when a key uses one.
var aliases = map[string]string{
	"startswith": `did you mean "prefix"?`,
	"beginswith": `did you mean "prefix"?`,
	"endswith":   `did you mean "suffix"?`,
	"exist":      `did you mean "exists"?`,
	"present":    `did you mean "exists: true"?`,
	"missing":    `did you mean "exists: false"?`,
	">":          `did you mean "gt"?`,
	">=":         `did you mean "gte"?`,
	"<":          `did you mean "lt"?`,
	"<=":         `did you mean "lte"?`,
	"ge":         `did you mean "gte"?`,
	"le":         `did you mean "lte"?`,
	"eq":         "there is no equals operator: a bare literal is equality, write field: [value]",
	"equal":      "there is no equals operator: a bare literal is equality, write field: [value]",
	"equals":     "there is no equals operator: a bare literal is equality, write field: [value]",
	"=":          "there is no equals operator: a bare literal is equality, write field: [value]",
	"==":         "there is no equals operator: a bare literal is equality, write field: [value]",
	// Operators of other pattern languages that Relay does not have.
	"regex":            noRegex,
	"regexp":           noRegex,
	"matches":          noRegex,
	"wildcard":         noWildcard,
	"glob":             noWildcard,
	"like":             noWildcard,
	"contains":         noWildcard,
	"anythingbut":      "there is no negation operator: list the values to match, or use exists: false for an absent field",
	"not":              "there is no negation operator: list the values to match, or use exists: false for an absent field",
	"equalsignorecase": "there is no case-insensitive operator: list each spelling to match",
}

const (
	noRegex    = "there is no regular expression operator (a pattern matches in time linear in the event): use prefix or suffix, or list the values"
	noWildcard = "there is no wildcard or substring operator: use prefix or suffix, or list the values"
)

// operatorHint returns a hint when key looks like a misspelled or foreign
// operator name. Case, "-" and "_" are ignored. A known alias (eq, >=,
// starts_with) or a name at edit distance 0 or 1 from an operator is a sure
// hint; distance 2 from prefix, suffix or exists, or distance 1 from gt, gte,
// lt or lte with a different first letter ("at"), is an unsure one, and the
// caller also says how to write the key as a field. Anything further gets no
// hint, so that short field names such as "id" are not taken for "gt".
func operatorHint(key string) (hint string, sure, ok bool) {
	k := strings.ToLower(strings.NewReplacer("-", "", "_", "").Replace(key))
	if h, ok := aliases[k]; ok {
		return h, true, true
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
