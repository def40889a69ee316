package matcher

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseTree parses the syntax tree of one pattern: a mapping of field names
// to conditions, in the language of docs/apps.md#patterns. file names the source in errors (e.g.
// "orders/template.yaml"); path is the pattern's path in messages (e.g.
// "events[1].pattern") and child paths append ".field" and "[i]". It
// returns every error found, sorted by position, each with the line and
// column of the offending node; the Pattern is nil when there is any.
// Anchors are followed; aliases, merge keys, complex keys and tags other
// than !!str (or !!map and !!seq on a mapping and a sequence) are reported
// as errors. Package matcher/yamlpattern parses YAML through it.
func ParseTree(file, path string, root *Node) (*Pattern, ErrorList) {
	p := &parser{file: file}
	fields := p.topLevel(root, path)
	if len(p.errs) > 0 {
		p.errs.Sort()
		return nil, p.errs
	}
	return &Pattern{fields: fields}, nil
}

// parser collects errors while it walks one pattern.
type parser struct {
	file string
	errs ErrorList
}

// pos is a 1-based line and column.
type pos struct{ line, col int }

// at returns the position of n, or fallback when n has none.
func at(n *Node, fallback pos) pos {
	if n != nil && n.Line > 0 {
		return pos{n.Line, max(n.Col, 1)}
	}
	return fallback
}

func (p *parser) errorf(at pos, path, format string, args ...any) {
	p.errs.Add(p.file, max(at.line, 1), max(at.col, 1), path, fmt.Sprintf(format, args...))
}

// entry is one key: value pair of a mapping.
type entry struct {
	name string
	// escaped is set when the key was written with a leading backslash:
	// then it names a field whatever it reads as (docs/apps.md#patterns).
	escaped bool
	keyPos  pos
	value   *Node // anchors removed; may be nil
	valPos  pos
}

// key is the entry's key as written, for the fixes messages suggest.
func (e entry) key() string {
	if e.escaped {
		return `\` + e.name
	}
	return e.name
}

// escapeNote tells how to write a field that is named like operator name.
func escapeNote(name string) string {
	return fmt.Sprintf("to match a field named %q, write \\%s", name, name)
}

// topLevel parses the pattern's root mapping: fields only, no operators.
func (p *parser) topLevel(node *Node, path string) []field {
	start := at(node, pos{1, 1})
	node, ok := p.resolve(node, path, start)
	if !ok {
		return nil
	}
	switch syntaxKind(node) {
	case KindMapping:
	case missing, KindNull, KindImplicitNull:
		p.errorf(start, path, "empty pattern: a pattern maps at least one field to a list of alternatives, e.g. status: [COMPLETED]")
		return nil
	case KindSequence:
		p.errorf(start, path, "a pattern is a mapping of field names to conditions, not a list: write e.g. status: [COMPLETED]")
		return nil
	default:
		p.errorf(start, path, "a pattern is a mapping of field names to conditions, not a scalar: write e.g. status: [COMPLETED]")
		return nil
	}
	entries, ok := p.entries(node, path, start)
	if !ok {
		return nil
	}
	if len(entries) == 0 {
		p.errorf(start, path, "empty pattern: a pattern maps at least one field to a list of alternatives, e.g. status: [COMPLETED]")
		return nil
	}
	fields := make([]field, 0, len(entries))
	for _, e := range entries {
		cpath := childPath(path, e.name)
		if !e.escaped && isOperator(e.name) {
			p.errorf(e.keyPos, cpath, "%q is an operator, not a field name; an operator goes inside a field's list, e.g. id: [{%s: ...}]; %s", e.name, e.name, escapeNote(e.name))
			continue
		}
		if !e.escaped && refusedAsField(e.name) {
			f, _ := foreignOperator(e.name)
			msg := f.hint
			if fix := foreignFix(e.name, "", e.value); fix != "" {
				msg += ": " + fix
			}
			p.errorf(e.keyPos, cpath, "%q is an operator of other pattern languages, not a field name: %s; %s", e.name, msg, escapeNote(e.name))
			p.condition(e, cpath) // report the errors inside too
			continue
		}
		alts := p.condition(e, cpath)
		fields = append(fields, field{name: e.name, alts: alts})
	}
	return fields
}

// condition parses the value of a field: a list of alternatives, or a map as
// shorthand for a one-element list.
func (p *parser) condition(e entry, path string) []alt {
	v := e.value
	switch syntaxKind(v) {
	case missing, KindImplicitNull:
		p.errorf(e.valPos, path, "empty condition: give a list of alternatives, e.g. %s: [value]", e.key())
		return nil
	case KindNull:
		p.errorf(e.valPos, path, "null condition: every condition is a list; to match JSON null write %s: [null]", e.key())
		return nil
	case KindSequence:
		if len(v.Elems) == 0 {
			p.errorf(e.valPos, path, "empty list: a condition needs at least one alternative, e.g. %s: [value]", e.key())
			return nil
		}
		alts := make([]alt, 0, len(v.Elems))
		for i, elem := range v.Elems {
			epath := path + "[" + strconv.Itoa(i) + "]"
			if a, ok := p.element(elem, e.name, epath, at(elem, e.valPos)); ok {
				alts = append(alts, a)
			}
		}
		return alts
	case KindMapping:
		if a, ok := p.mapElement(v, e.name, path, e.valPos); ok {
			return []alt{a}
		}
		return nil
	}
	p.errorf(e.valPos, path, "a condition is a list of alternatives, not a scalar: write %s: [%s]", e.key(), scalarText(e.value))
	return nil
}

// element parses one alternative of a condition list.
func (p *parser) element(node *Node, fieldName, path string, where pos) (alt, bool) {
	node, ok := p.resolve(node, path, where)
	if !ok {
		return alt{}, false
	}
	switch syntaxKind(node) {
	case KindSequence:
		p.errorf(where, path, "a list element cannot be a list: put every alternative in one flat list, e.g. status: [A, B]")
		return alt{}, false
	case KindMapping:
		return p.mapElement(node, fieldName, path, where)
	case missing, KindImplicitNull:
		p.errorf(where, path, "empty list element: write null to match JSON null")
		return alt{}, false
	}
	lit, ok := p.literal(node, path, where)
	if !ok {
		return alt{}, false
	}
	return alt{op: opEqual, lit: lit}, true
}

// mapElement parses a map in a condition: a single-operator map or a nested
// map of child fields.
//
// A key is an operator when it is exactly an operator name. A key whose
// value is a scalar or null is taken as an attempted operator too, since a
// field's condition is never a scalar; when it is not an operator name this
// is reported as an unknown operator (with a suggestion) or as a scalar
// condition. Any map holding an operator key must hold nothing else.
// Otherwise the map is a nested map and every key is a child field.
func (p *parser) mapElement(node *Node, fieldName, path string, where pos) (alt, bool) {
	entries, ok := p.entries(node, path, where)
	if !ok {
		return alt{}, false
	}
	if len(entries) == 0 {
		p.errorf(where, path, "empty map: give an operator such as {prefix: \"x\"} or child fields such as {status: [OK]}")
		return alt{}, false
	}
	var ops, opLike, foreignOps, children []entry
	for _, e := range entries {
		switch {
		case e.escaped:
			children = append(children, e)
		case isOperator(e.name):
			ops = append(ops, e)
		case isScalar(e.value):
			opLike = append(opLike, e)
		case refusedAsField(e.name):
			foreignOps = append(foreignOps, e)
		default:
			children = append(children, e)
		}
	}
	if len(ops) == 1 && len(entries) == 1 {
		return p.operator(ops[0], fieldName, path)
	}
	if len(ops) == 0 && len(opLike) == 0 && len(foreignOps) == 0 {
		fields := make([]field, 0, len(children))
		for _, e := range children {
			cpath := childPath(path, e.name)
			fields = append(fields, field{name: e.name, alts: p.condition(e, cpath)})
		}
		return alt{op: opNested, fields: fields}, true
	}

	// A broken map. Report what is wrong with each key, once.
	for _, e := range foreignOps {
		// An operator of another language with a list or a map: not a
		// field, which would never match what was meant.
		f, _ := foreignOperator(e.name)
		msg := f.hint
		if fix := foreignFix(e.name, fieldName, e.value); fix != "" {
			msg += ": " + fix
		}
		p.errorf(e.keyPos, childPath(path, e.name), "unknown operator %q: %s; %s", e.name, msg, escapeNote(e.name))
	}
	for _, e := range opLike {
		cpath := childPath(path, e.name)
		if hint, sure, ok := operatorHint(e.name); ok {
			if fix := foreignFix(e.name, fieldName, e.value); fix != "" {
				hint += ": " + fix
			}
			if sure || len(ops) > 0 {
				p.errorf(e.keyPos, cpath, "unknown operator %q: %s", e.name, hint)
			} else {
				p.errorf(e.keyPos, cpath, "unknown operator %q: %s If %q is a field, its condition is a list: write %s: [%s]", e.name, hint, e.name, e.name, scalarText(e.value))
			}
		} else if len(ops) > 0 {
			p.errorf(e.keyPos, cpath, "unknown operator %q: the operators are %s, and an operator map holds exactly one", e.name, operatorList)
		} else {
			p.scalarCondition(e, cpath)
		}
	}
	if len(ops) > 1 {
		names := make([]string, len(ops))
		for i, e := range ops {
			names[i] = e.name
		}
		p.errorf(ops[1].keyPos, path, "one map holds exactly one operator, found %s: write each as its own alternative, e.g. - %s: ... and - %s: ...", strings.Join(names, ", "), names[0], names[1])
	}
	if len(children) > 0 {
		for _, e := range ops {
			p.errorf(e.keyPos, childPath(path, e.name), "operator %q cannot be used as a field name or beside fields (%s): an operator map holds exactly one operator; %s", e.name, children[0].name, escapeNote(e.name))
		}
	}
	for _, e := range children {
		// Still look inside, so every error is reported in one pass.
		p.condition(e, childPath(path, e.name))
	}
	if len(ops) == 1 && len(children) == 0 {
		p.operator(ops[0], fieldName, path) // report operand errors too
	}
	return alt{}, false
}

// operator parses a single-operator map.
func (p *parser) operator(e entry, fieldName, path string) (alt, bool) {
	o := operators[e.name]
	path = childPath(path, e.name)
	switch syntaxKind(e.value) {
	case KindSequence:
		if o == opExists {
			p.errorf(e.valPos, path, "exists takes a boolean, not a list: write exists: true or exists: false (%s)", escapeNote(e.name))
		} else {
			p.errorf(e.valPos, path, "%s takes a single operand, not a list: write each %s as its own alternative, e.g. %s: [{%s: a}, {%s: b}] (%s)", e.name, e.name, fieldName, e.name, e.name, escapeNote(e.name))
		}
		return alt{}, false
	case KindMapping:
		p.errorf(e.valPos, path, "%s takes a single scalar operand, not a map (%s)", e.name, escapeNote(e.name))
		return alt{}, false
	case missing, KindImplicitNull:
		p.errorf(e.valPos, path, "%s needs an operand, e.g. %s", e.name, operandExample(o))
		return alt{}, false
	case KindNull:
		p.errorf(e.valPos, path, "%s needs an operand, not null, e.g. %s", e.name, operandExample(o))
		return alt{}, false
	}
	lit, ok := p.literal(e.value, path, e.valPos)
	if !ok {
		return alt{}, false
	}
	switch o {
	case opPrefix, opSuffix:
		if lit.kind != litString {
			p.errorf(e.valPos, path, "%s takes a string: quote it, e.g. %s: %q", e.name, e.name, scalarText(e.value))
			return alt{}, false
		}
		return alt{op: o, str: lit.str}, true
	case opExists:
		if lit.kind != litBool {
			p.errorf(e.valPos, path, "exists takes a boolean (true or false, unquoted), not %s", scalarText(e.value))
			return alt{}, false
		}
		return alt{op: o, exists: lit.b}, true
	default: // gt, gte, lt, lte
		switch lit.kind {
		case litNumber:
			return alt{op: o, num: lit.num}, true
		case litString:
			off, ok, msg := parseNow(lit.str)
			if !ok {
				p.errorf(e.valPos, path, "%s", msg)
				return alt{}, false
			}
			return alt{op: o, temporal: true, offset: off, nowText: lit.str}, true
		}
		p.errorf(e.valPos, path, "%s takes a number or a now()-relative string such as \"now()-5m\", not %s", e.name, scalarText(e.value))
		return alt{}, false
	}
}

func operandExample(o op) string {
	switch o {
	case opPrefix:
		return `prefix: "user_"`
	case opSuffix:
		return `suffix: ".png"`
	case opExists:
		return "exists: true"
	}
	return fmt.Sprintf("%s: 10 or %s: \"now()-5m\"", o, o)
}

// scalarCondition reports a field whose condition is a single scalar.
func (p *parser) scalarCondition(e entry, path string) {
	if k := syntaxKind(e.value); k == KindNull || k == KindImplicitNull {
		p.condition(e, path)
		return
	}
	p.errorf(e.valPos, path, "a condition is a list of alternatives, not a scalar: write %s: [%s]", e.key(), scalarText(e.value))
}

// literal converts a scalar node to a literal. Plain (unquoted) scalars that
// read as numbers in YAML 1.2 are numbers; numbers must be written in decimal.
func (p *parser) literal(node *Node, path string, where pos) (literal, bool) {
	switch syntaxKind(node) {
	case KindString:
		if node.Style == Plain {
			if d, ok := parseDecimal(node.Value, true); ok {
				return literal{kind: litNumber, num: d}, true
			}
		}
		return literal{kind: litString, str: node.Value}, true
	case KindBlock:
		return literal{kind: litString, str: node.Value}, true
	case KindBool:
		return literal{kind: litBool, b: node.Bool}, true
	case KindNull, KindImplicitNull:
		return literal{kind: litNull}, true
	case KindInt, KindFloat:
		text := node.Text
		if d, ok := parseDecimal(text, true); ok {
			return literal{kind: litNumber, num: d}, true
		}
		if hasLeadingZero(text) {
			p.errorf(where, path, "%s has a leading zero, which YAML may read as octal: write %s for a number or quote it (%q) to match a string", text, withoutLeadingZeros(text), text)
			return literal{}, false
		}
		if alt := node.Number; alt != "" && alt != text {
			p.errorf(where, path, "write the number %s in plain decimal, e.g. %s, or quote it (%q) to match a string", text, alt, text)
			return literal{}, false
		}
		p.errorf(where, path, "write the number %s in plain decimal, or quote it (%q) to match a string", text, text)
		return literal{}, false
	case KindInf, KindNaN:
		text := node.Text
		p.errorf(where, path, "%s is not a JSON number; quote it (%q) to match a string", text, text)
		return literal{}, false
	case KindTag:
		if node.Text == "!!str" {
			switch s := node.Inner; syntaxKind(s) {
			case KindString:
				return literal{kind: litString, str: s.Value}, true
			case KindBlock:
				return p.literal(s, path, where)
			case KindInt, KindFloat, KindBool, KindNull, KindImplicitNull, KindInf, KindNaN:
				return literal{kind: litString, str: s.Text}, true
			}
		}
		p.unsupported(node, path, where)
		return literal{}, false
	case KindAlias, KindMergeKey:
		p.unsupported(node, path, where)
		return literal{}, false
	}
	p.errorf(where, path, "unexpected %s: expected a scalar value", nodeKind(node))
	return literal{}, false
}

// hasLeadingZero reports a decimal integer such as 017 or -00.
func hasLeadingZero(s string) bool {
	s = strings.TrimLeft(s, "+-")
	if len(s) < 2 || s[0] != '0' {
		return false
	}
	for i := range len(s) {
		if !isDigit(s[i]) {
			return false
		}
	}
	return true
}

func withoutLeadingZeros(s string) string {
	sign := ""
	if s != "" && s[0] == '-' {
		sign = "-"
	}
	digits := strings.TrimLeft(strings.TrimLeft(s, "+-"), "0")
	if digits == "" {
		return "0"
	}
	return sign + digits
}

// entries lists the key/value pairs of a mapping, reporting bad and
// duplicate keys. ok is false if the mapping could not be read at all.
func (p *parser) entries(node *Node, path string, where pos) ([]entry, bool) {
	if syntaxKind(node) != KindMapping {
		return nil, false
	}
	entries := make([]entry, 0, len(node.Entries))
	seen := make(map[string]bool, len(node.Entries))
	good := true
	for _, en := range node.Entries {
		epos := where
		if en.Line > 0 {
			epos = pos{en.Line, max(en.Col, 1)}
		}
		kpos := at(en.Key, epos)
		name, ok := p.key(en.Key, path, kpos)
		if !ok {
			good = false
			continue
		}
		// A leading backslash makes the key a field name, whatever it
		// reads as: \not names the field "not" (docs/apps.md#patterns).
		name, escaped := strings.CutPrefix(name, `\`)
		cpath := childPath(path, name)
		if seen[name] {
			p.errorf(kpos, cpath, "duplicate key %q: list every alternative once, e.g. %s: [a, b]", name, name)
			good = false
			continue
		}
		seen[name] = true
		vpos := at(en.Value, kpos)
		value, ok := p.resolve(en.Value, cpath, vpos)
		if !ok {
			good = false
			continue
		}
		vpos = at(value, vpos)
		entries = append(entries, entry{name: name, escaped: escaped, keyPos: kpos, value: value, valPos: vpos})
	}
	if !good && len(entries) == 0 {
		return nil, false
	}
	return entries, true
}

// key returns the field name of a mapping key.
func (p *parser) key(k *Node, path string, where pos) (string, bool) {
	switch syntaxKind(k) {
	case missing:
		p.errorf(where, path, "missing key")
		return "", false
	case KindString:
		return k.Value, true
	case KindInt, KindFloat, KindBool, KindNull, KindImplicitNull, KindInf, KindNaN:
		// A JSON key is always a string; take the key as written.
		return k.Text, true
	case KindMergeKey:
		p.errorf(where, path, "merge keys (<<) are not supported in patterns: write the fields out")
		return "", false
	case KindComplexKey:
		p.errorf(where, path, "complex keys (?) are not supported: a field name is a plain string")
		return "", false
	}
	p.errorf(where, path, "unsupported key %s: a field name is a plain string", nodeKind(k))
	return "", false
}

// resolve removes anchors around node and reports aliases and unsupported
// tags. A !!map or !!seq tag on the matching kind of node is removed; a
// !!str tag is kept for literal to handle.
func (p *parser) resolve(node *Node, path string, where pos) (*Node, bool) {
	for depth := 0; ; depth++ {
		if node == nil {
			return nil, true
		}
		if depth > 8 {
			p.errorf(where, path, "too many nested anchors or tags")
			return nil, false
		}
		switch node.Kind {
		case KindAnchor:
			node = node.Inner
		case KindTag:
			tag := node.Text
			switch syntaxKind(node.Inner) {
			case KindMapping:
				if tag == "!!map" {
					node = node.Inner
					continue
				}
			case KindSequence:
				if tag == "!!seq" {
					node = node.Inner
					continue
				}
			}
			if tag == "!!str" {
				return node, true
			}
			p.unsupported(node, path, at(node, where))
			return nil, false
		case KindAlias:
			p.unsupported(node, path, at(node, where))
			return nil, false
		default:
			return node, true
		}
	}
}

func (p *parser) unsupported(n *Node, path string, where pos) {
	switch n.Kind {
	case KindAlias:
		p.errorf(where, path, "aliases (*%s) are not supported in patterns: write the value out", strings.TrimPrefix(n.Value, "*"))
	case KindTag:
		p.errorf(where, path, "YAML tag %s is not supported in patterns; quote a value to make it a string", n.Text)
	default:
		p.errorf(where, path, "unsupported %s in a pattern", nodeKind(n))
	}
}

// missing is the kind of a missing (nil) node, for switches on syntaxKind.
const missing NodeKind = 255

// syntaxKind returns n's kind, or missing when n is nil.
func syntaxKind(n *Node) NodeKind {
	if n == nil {
		return missing
	}
	return n.Kind
}

// isOperator reports whether name is exactly an operator name.
func isOperator(name string) bool {
	_, ok := operators[name]
	return ok
}

// isScalar reports whether a (resolved) value node is a scalar or null,
// which is never a valid field condition.
func isScalar(n *Node) bool {
	switch syntaxKind(n) {
	case KindSequence, KindMapping:
		return false
	}
	return true
}

// scalarText is a node's source text for messages, quoted as written.
func scalarText(n *Node) string {
	switch syntaxKind(n) {
	case missing:
		return "null"
	case KindBlock:
		return strconv.Quote(n.Value)
	case KindTag:
		if n.Inner != nil {
			return n.Text + " " + scalarText(n.Inner)
		}
	case KindString:
		switch n.Style {
		case DoubleQuoted:
			return strconv.Quote(n.Text)
		case SingleQuoted:
			return "'" + strings.ReplaceAll(n.Text, "'", "''") + "'"
		}
	}
	return n.Text
}

func nodeKind(n *Node) string {
	if n == nil {
		return "empty value"
	}
	return n.Kind.String()
}

// childPath appends a field name to a path: ".name" for plain names,
// `["a.b"]` for names with other characters.
func childPath(path, name string) string {
	plain := name != ""
	for _, r := range name {
		if !(r == '_' || r == '-' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r > 0x7f && r != 0xfffd) {
			plain = false
			break
		}
	}
	switch {
	case !plain:
		return path + "[" + strconv.Quote(name) + "]"
	case path == "":
		return name
	}
	return path + "." + name
}
