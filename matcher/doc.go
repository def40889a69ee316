// Package matcher parses event patterns and matches external events against
// them: it owns the pattern language of docs/apps.md#patterns, whose full
// rules are below.
//
// ParseTree turns the syntax tree of one rule's pattern: value (a Node) into
// a Pattern and reports every problem at once as an ErrorList of PosErrors
// carrying file:line:col. Package matcher/yamlpattern reads that tree from
// YAML: yamlpattern.ParseNode from a node of a template, yamlpattern.Parse
// from pattern text; this package does not depend on a YAML library, so a
// program that only matches events does not link one. DecodeEvent decodes an
// event's JSON, keeping numbers exact. Pattern.MatchValue matches one event;
// a Set matches an event against every rule and returns the matching
// Targets in the order the rules were given.
//
// # Language
//
// A pattern maps field names to conditions. A condition is a list of
// alternatives, any of which may match (OR); a map is shorthand for a list
// holding that one map. Sibling fields and the children of a nested map must
// all match (AND). An alternative is
//
//   - a scalar literal, matched by equality: strings byte for byte (no
//     Unicode normalisation), numbers by exact decimal value (35, 35.0 and
//     3.5e1 are equal; the string "35" is not the number 35), true, false,
//     and null, which matches a JSON null (not a missing field);
//   - an operator map with exactly one key: prefix or suffix with a string
//     (non-string values never match), exists with a boolean, or gt, gte,
//     lt, lte with a number or a now() expression;
//   - a nested map of child fields.
//
// Field names are literal keys: "a.b" names one key containing a dot, not a
// path. An unquoted YAML scalar that reads as a YAML 1.2 number (1e3 too) is
// a number and must be written in plain decimal: hex, octal, binary,
// underscores and leading zeros are errors, as are .inf and .nan. Anchors are
// followed; aliases, merge keys and tags other than !!str are errors.
//
// # Operator maps and nested maps
//
// A map in a condition is read as follows.
//
//  1. A key that is exactly an operator name (prefix, suffix, exists, gt,
//     gte, lt, lte) makes the map an operator map, which must hold that one
//     key and nothing else, with an operand of the right type. So an operator
//     name is never read as a field name, at any level (prefix: [x] at the
//     top, or {exists: [true]} in a list, are errors), and
//     {prefix: a, suffix: b} must be written as two alternatives.
//  2. A key that is an operator name of another pattern language (eq,
//     equals, in, ne, not, nin, anything-but, numeric, contains, regex,
//     wildcard, equals-ignore-case, starts_with, $gt, ... ignoring case,
//     "-", "_" and a leading "$") is an error whatever its value, at any
//     level, top level included: read as a nested field it would only
//     match events that have such a field, which is never what was meant.
//     The error says what Relay has instead, written out when it can be
//     (status: {equals: [COMPLETED]} says write status: [COMPLETED]).
//  3. A key whose value is a scalar or null is an attempted operator too,
//     because a field's condition is never a scalar. It is an error: "unknown
//     operator" with a suggestion when the key looks like an operator, else
//     "a condition is a list" with the fix (write status: [COMPLETED]). A key
//     looks like an operator when, ignoring case, "-" and "_", it is a known
//     foreign spelling (as in 2, or >=, exist, present) or within edit
//     distance 1 of an operator name (transpositions count 1: prefx, perfix,
//     GTE, exist). Distance 2 from prefix, suffix or exists, or distance 1
//     from gt, gte, lt, lte with another first letter ("exit", "at"), gives a
//     suggestion that also shows the field spelling. Short names such as
//     "id" (distance 2 from "gt") get no suggestion.
//  4. Every other map, where each key has a list or map value, is a nested
//     map, and its keys are child fields.
//
// A key written with a leading backslash names the field after the
// backslash and is never an operator: \not: [x] matches an event whose
// field "not" is "x", new_image: {\prefix: [{prefix: "p_"}]} tests a field
// named "prefix", and \\x names the field "\x". Quoting a key does not make
// it a field ({"prefix": "user_"} is still an operator map), since patterns
// written in JSON style quote every key. String writes such names escaped.
//
// An unknown key therefore either is an error or, having a list or map
// value, names a child field that must then match, which can only narrow a
// match, never widen it. The same rules hold for a bare map used as
// shorthand for a one-element list.
//
// # Missing fields and exists
//
// exists tests presence only: null, false, 0, "", {} and [] are present. A
// missing field fails every alternative but exists: false and a nested map,
// whose children are then matched against an absent object: nested
// exists: false holds and everything else fails. A present value that is not
// an object (a string, a number, null, an empty array) has no keys either,
// so a nested map matches it only through such absence conditions.
//
// # Arrays
//
// An event value that is an array matches a literal or an operator other
// than exists when any of its elements does (arrays inside arrays are
// searched too). It matches a nested map when one of its elements matches
// that whole map: the children are checked against the same element, so
// items: {sku: [A], qty: [{gt: 5}]} needs one item with both. An empty array
// has no elements and is treated like any other non-object (no keys). exists
// looks at the key only, never into the array. A pattern literal is never a
// list, so an array cannot be matched as a whole.
//
// # Comparisons
//
// gt, gte, lt and lte with a number match JSON numbers only, compared
// exactly. With a string operand the operand must be now() or now()
// followed by + or - and a Go duration, without spaces: now()-5m, now()+10m,
// now()-1h30m. Any other string is a parse error, literal timestamps and the
// old now-5m form included. The cutoff is the match time plus the offset,
// computed at every match. The event value must then be an RFC 3339
// date-time string (fraction and offset allowed, "T" and "Z" in either case);
// it is compared with the cutoff as an instant. Anything else, including
// impossible dates and leap seconds, never matches. Alternatives are OR, so a
// range cannot be written as two alternatives of one field.
//
// Events must be JSON objects; DecodeEvent wraps ErrMalformed otherwise.
// Fields of the event that the pattern does not name are ignored.
//
// # Sets
//
// A Set evaluates each rule independently and reports every match, without
// deduplication, in the order the rules were given. It indexes each rule
// under one field (top-level, or nested under maps) whose alternatives are
// all literals or prefixes, so an event is only matched in full against
// rules that can match it; results are the same as a scan of every rule.
// Matching an event decoded by DecodeEvent allocates little more than the
// result (Set.AppendMatches reuses the caller's slice; see MatchValue for
// the exceptions). Explain says, condition by condition, why each rule
// matched or not.
//
// The package does not load templates (the loader calls
// yamlpattern.ParseNode for each rule) and does not run handlers. Patterns and Sets are immutable and safe
// for concurrent use.
package matcher
