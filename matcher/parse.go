package matcher

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	yamlparser "github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"
)

// Parse parses pattern YAML text: one document holding a mapping of field
// names to conditions. file names the source in errors. The error is an
// ErrorList holding every problem found, YAML syntax errors included.
func Parse(file string, src []byte) (*Pattern, error) {
	f, err := yamlparser.ParseBytes(src, 0)
	if err != nil {
		var l ErrorList
		var yerr yaml.Error
		if errors.As(err, &yerr) {
			line, col := 0, 0
			if tk := yerr.GetToken(); tk != nil && tk.Position != nil {
				line, col = tk.Position.Line, tk.Position.Column
			}
			l.Add(file, max(line, 1), max(col, 1), "", "invalid YAML: "+yerr.GetMessage())
		} else {
			l.Add(file, 1, 1, "", "invalid YAML: "+err.Error())
		}
		return nil, l
	}
	var body ast.Node
	for i, doc := range f.Docs {
		if isNilNode(doc) || isNilNode(doc.Body) {
			continue
		}
		if body != nil {
			var l ErrorList
			line, col := NodePos(doc)
			if doc.Start != nil && doc.Start.Position != nil {
				line, col = doc.Start.Position.Line, doc.Start.Position.Column
			}
			l.Add(file, max(line, 1), max(col, 1), "", fmt.Sprintf("a pattern is one YAML document; found a document #%d", i+1))
			return nil, l
		}
		body = doc.Body
	}
	if body == nil {
		var l ErrorList
		l.Add(file, 1, 1, "", "empty pattern: a pattern maps at least one field to a list of alternatives, e.g. status: [COMPLETED]")
		return nil, l
	}
	p, errs := ParseNode(file, "", body)
	return p, errs.Err()
}

// ParseNode parses the YAML node of one rule's pattern: value. file names
// the template in errors (e.g. "orders/template.yaml"); path is the
// pattern's path in messages (e.g. "events[1].pattern") and child paths
// append ".field" and "[i]". It returns every error found, sorted by
// position, each with the line and column of the offending node; the
// Pattern is nil when there is any. Anchors are followed; aliases, merge
// keys and tags other than !!str are reported as errors.
func ParseNode(file, path string, node ast.Node) (*Pattern, ErrorList) {
	p := &parser{file: file}
	fields := p.topLevel(node, path)
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
func at(n ast.Node, fallback pos) pos {
	if line, col := NodePos(n); line > 0 {
		return pos{line, max(col, 1)}
	}
	return fallback
}

func (p *parser) errorf(at pos, path, format string, args ...any) {
	p.errs.Add(p.file, max(at.line, 1), max(at.col, 1), path, fmt.Sprintf(format, args...))
}

// entry is one key: value pair of a mapping.
type entry struct {
	name   string
	keyPos pos
	value  ast.Node // anchors removed; may be nil
	valPos pos
}

// topLevel parses the pattern's root mapping: fields only, no operators.
func (p *parser) topLevel(node ast.Node, path string) []field {
	start := at(node, pos{1, 1})
	node, ok := p.resolve(node, path, start)
	if !ok {
		return nil
	}
	switch node.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
	case nil, *ast.NullNode:
		p.errorf(start, path, "empty pattern: a pattern maps at least one field to a list of alternatives, e.g. status: [COMPLETED]")
		return nil
	case *ast.SequenceNode:
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
		if _, isOp := operators[e.name]; isOp {
			p.errorf(e.keyPos, cpath, "%q is an operator, not a field name; an operator goes inside a field's list, e.g. id: [{%s: ...}]", e.name, e.name)
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
	switch v := e.value.(type) {
	case nil:
		p.errorf(e.valPos, path, "empty condition: give a list of alternatives, e.g. %s: [value]", e.name)
		return nil
	case *ast.NullNode:
		if v.GetToken() != nil && v.GetToken().Type == token.ImplicitNullType {
			p.errorf(e.valPos, path, "empty condition: give a list of alternatives, e.g. %s: [value]", e.name)
		} else {
			p.errorf(e.valPos, path, "null condition: every condition is a list; to match JSON null write %s: [null]", e.name)
		}
		return nil
	case *ast.SequenceNode:
		if len(v.Values) == 0 {
			p.errorf(e.valPos, path, "empty list: a condition needs at least one alternative, e.g. %s: [value]", e.name)
			return nil
		}
		alts := make([]alt, 0, len(v.Values))
		for i, elem := range v.Values {
			epath := path + "[" + strconv.Itoa(i) + "]"
			if a, ok := p.element(elem, e.name, epath, at(elem, e.valPos)); ok {
				alts = append(alts, a)
			}
		}
		return alts
	case *ast.MappingNode, *ast.MappingValueNode:
		if a, ok := p.mapElement(v, e.name, path, e.valPos); ok {
			return []alt{a}
		}
		return nil
	}
	p.errorf(e.valPos, path, "a condition is a list of alternatives, not a scalar: write %s: [%s]", e.name, scalarText(e.value))
	return nil
}

// element parses one alternative of a condition list.
func (p *parser) element(node ast.Node, fieldName, path string, where pos) (alt, bool) {
	node, ok := p.resolve(node, path, where)
	if !ok {
		return alt{}, false
	}
	switch v := node.(type) {
	case *ast.SequenceNode:
		p.errorf(where, path, "a list element cannot be a list: put every alternative in one flat list, e.g. status: [A, B]")
		return alt{}, false
	case *ast.MappingNode, *ast.MappingValueNode:
		return p.mapElement(v, fieldName, path, where)
	case nil:
		p.errorf(where, path, "empty list element: write null to match JSON null")
		return alt{}, false
	case *ast.NullNode:
		if tk := v.GetToken(); tk != nil && tk.Type == token.ImplicitNullType {
			p.errorf(where, path, "empty list element: write null to match JSON null")
			return alt{}, false
		}
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
func (p *parser) mapElement(node ast.Node, fieldName, path string, where pos) (alt, bool) {
	entries, ok := p.entries(node, path, where)
	if !ok {
		return alt{}, false
	}
	if len(entries) == 0 {
		p.errorf(where, path, "empty map: give an operator such as {prefix: \"x\"} or child fields such as {status: [OK]}")
		return alt{}, false
	}
	var ops, opLike, children []entry
	for _, e := range entries {
		switch {
		case isOperator(e.name):
			ops = append(ops, e)
		case isScalar(e.value):
			opLike = append(opLike, e)
		default:
			children = append(children, e)
		}
	}
	if len(ops) == 1 && len(entries) == 1 {
		return p.operator(ops[0], fieldName, path)
	}
	if len(ops) == 0 && len(opLike) == 0 {
		fields := make([]field, 0, len(children))
		for _, e := range children {
			cpath := childPath(path, e.name)
			fields = append(fields, field{name: e.name, alts: p.condition(e, cpath)})
		}
		return alt{op: opNested, fields: fields}, true
	}

	// A broken map. Report what is wrong with each key, once.
	for _, e := range opLike {
		cpath := childPath(path, e.name)
		if hint, sure, ok := operatorHint(e.name); ok {
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
			p.errorf(e.keyPos, childPath(path, e.name), "operator %q cannot be used as a field name or beside fields (%s): an operator map holds exactly one operator", e.name, children[0].name)
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
	switch v := e.value.(type) {
	case *ast.SequenceNode:
		if o == opExists {
			p.errorf(e.valPos, path, "exists takes a boolean, not a list: write exists: true or exists: false (an operator name cannot be a field name)")
		} else {
			p.errorf(e.valPos, path, "%s takes a single operand, not a list: write each %s as its own alternative, e.g. %s: [{%s: a}, {%s: b}] (an operator name cannot be a field name)", e.name, e.name, fieldName, e.name, e.name)
		}
		return alt{}, false
	case *ast.MappingNode, *ast.MappingValueNode:
		p.errorf(e.valPos, path, "%s takes a single scalar operand, not a map (an operator name cannot be a field name)", e.name)
		return alt{}, false
	case nil:
		p.errorf(e.valPos, path, "%s needs an operand, e.g. %s", e.name, operandExample(o))
		return alt{}, false
	case *ast.NullNode:
		if tk := v.GetToken(); tk != nil && tk.Type == token.ImplicitNullType {
			p.errorf(e.valPos, path, "%s needs an operand, e.g. %s", e.name, operandExample(o))
		} else {
			p.errorf(e.valPos, path, "%s needs an operand, not null, e.g. %s", e.name, operandExample(o))
		}
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
	if n, ok := e.value.(*ast.NullNode); ok {
		p.condition(entry{name: e.name, keyPos: e.keyPos, value: n, valPos: e.valPos}, path)
		return
	}
	p.errorf(e.valPos, path, "a condition is a list of alternatives, not a scalar: write %s: [%s]", e.name, scalarText(e.value))
}

// literal converts a scalar node to a literal. Plain (unquoted) scalars that
// read as numbers in YAML 1.2 are numbers; numbers must be written in decimal.
func (p *parser) literal(node ast.Node, path string, where pos) (literal, bool) {
	switch v := node.(type) {
	case *ast.StringNode:
		tk := v.GetToken()
		if tk != nil && tk.Type == token.StringType {
			if d, ok := parseDecimal(v.Value, true); ok {
				return literal{kind: litNumber, num: d}, true
			}
		}
		return literal{kind: litString, str: v.Value}, true
	case *ast.LiteralNode:
		if v.Value == nil {
			return literal{kind: litString}, true
		}
		return literal{kind: litString, str: v.Value.Value}, true
	case *ast.BoolNode:
		return literal{kind: litBool, b: v.Value}, true
	case *ast.NullNode:
		return literal{kind: litNull}, true
	case *ast.IntegerNode, *ast.FloatNode:
		text := tokenValue(v)
		if d, ok := parseDecimal(text, true); ok {
			return literal{kind: litNumber, num: d}, true
		}
		if hasLeadingZero(text) {
			p.errorf(where, path, "%s has a leading zero, which YAML may read as octal: write %s for a number or quote it (%q) to match a string", text, withoutLeadingZeros(text), text)
			return literal{}, false
		}
		if sv, ok := v.(ast.ScalarNode); ok {
			if alt := decimalText(sv.GetValue()); alt != "" && alt != text {
				p.errorf(where, path, "write the number %s in plain decimal, e.g. %s, or quote it (%q) to match a string", text, alt, text)
				return literal{}, false
			}
		}
		p.errorf(where, path, "write the number %s in plain decimal, or quote it (%q) to match a string", text, text)
		return literal{}, false
	case *ast.InfinityNode, *ast.NanNode:
		text := tokenValue(v)
		p.errorf(where, path, "%s is not a JSON number; quote it (%q) to match a string", text, text)
		return literal{}, false
	case *ast.TagNode:
		if tk := v.GetToken(); tk != nil && tk.Value == "!!str" {
			switch s := v.Value.(type) {
			case *ast.StringNode:
				return literal{kind: litString, str: s.Value}, true
			case *ast.LiteralNode:
				return p.literal(s, path, where)
			case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.NullNode, *ast.InfinityNode, *ast.NanNode:
				return literal{kind: litString, str: tokenValue(s)}, true
			}
		}
		p.unsupported(v, path, where)
		return literal{}, false
	case *ast.AliasNode, *ast.MergeKeyNode:
		p.unsupported(v, path, where)
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

// decimalText formats an integer YAML value (hex, octal, binary, with
// underscores) in decimal for a suggestion.
func decimalText(v any) string {
	switch n := v.(type) {
	case int64:
		return strconv.FormatInt(n, 10)
	case uint64:
		return strconv.FormatUint(n, 10)
	case float64:
		return strconv.FormatFloat(n, 'g', -1, 64)
	}
	return ""
}

// entries lists the key/value pairs of a mapping, reporting bad and
// duplicate keys. ok is false if the mapping could not be read at all.
func (p *parser) entries(node ast.Node, path string, where pos) ([]entry, bool) {
	var values []*ast.MappingValueNode
	switch v := node.(type) {
	case *ast.MappingNode:
		values = v.Values
	case *ast.MappingValueNode:
		values = []*ast.MappingValueNode{v}
	default:
		return nil, false
	}
	entries := make([]entry, 0, len(values))
	seen := make(map[string]bool, len(values))
	good := true
	for _, mv := range values {
		if isNilNode(mv) {
			continue
		}
		kpos := at(mv.Key, at(mv, where))
		name, ok := p.key(mv.Key, path, kpos)
		if !ok {
			good = false
			continue
		}
		cpath := childPath(path, name)
		if seen[name] {
			p.errorf(kpos, cpath, "duplicate key %q: list every alternative once, e.g. %s: [a, b]", name, name)
			good = false
			continue
		}
		seen[name] = true
		vpos := at(mv.Value, kpos)
		value, ok := p.resolve(mv.Value, cpath, vpos)
		if !ok {
			good = false
			continue
		}
		if !isNilNode(value) {
			vpos = at(value, vpos)
		}
		entries = append(entries, entry{name: name, keyPos: kpos, value: value, valPos: vpos})
	}
	if !good && len(entries) == 0 {
		return nil, false
	}
	return entries, true
}

// key returns the field name of a mapping key.
func (p *parser) key(k ast.MapKeyNode, path string, where pos) (string, bool) {
	if isNilNode(k) {
		p.errorf(where, path, "missing key")
		return "", false
	}
	switch v := ast.Node(k).(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode, *ast.NullNode, *ast.InfinityNode, *ast.NanNode:
		// A JSON key is always a string; take the key as written.
		return tokenValue(v), true
	case *ast.MergeKeyNode:
		p.errorf(where, path, "merge keys (<<) are not supported in patterns: write the fields out")
		return "", false
	case *ast.MappingKeyNode:
		p.errorf(where, path, "complex keys (?) are not supported: a field name is a plain string")
		return "", false
	}
	p.errorf(where, path, "unsupported key %s: a field name is a plain string", nodeKind(k))
	return "", false
}

// resolve removes anchors around node and reports aliases and unsupported
// tags. A !!map or !!seq tag on the matching kind of node is removed; a
// !!str tag is kept for literal to handle.
func (p *parser) resolve(node ast.Node, path string, where pos) (ast.Node, bool) {
	for depth := 0; ; depth++ {
		if isNilNode(node) {
			return nil, true
		}
		if depth > 8 {
			p.errorf(where, path, "too many nested anchors or tags")
			return nil, false
		}
		switch v := node.(type) {
		case *ast.AnchorNode:
			node = v.Value
		case *ast.TagNode:
			tag := ""
			if tk := v.GetToken(); tk != nil {
				tag = tk.Value
			}
			switch inner := v.Value.(type) {
			case *ast.MappingNode, *ast.MappingValueNode:
				if tag == "!!map" {
					node = inner
					continue
				}
			case *ast.SequenceNode:
				if tag == "!!seq" {
					node = inner
					continue
				}
			}
			if tag == "!!str" {
				return v, true
			}
			p.unsupported(v, path, at(v, where))
			return nil, false
		case *ast.AliasNode:
			p.unsupported(v, path, at(v, where))
			return nil, false
		case *ast.DocumentNode:
			node = v.Body
		default:
			return node, true
		}
	}
}

func (p *parser) unsupported(n ast.Node, path string, where pos) {
	switch v := n.(type) {
	case *ast.AliasNode:
		p.errorf(where, path, "aliases (*%s) are not supported in patterns: write the value out", strings.TrimPrefix(aliasName(v), "*"))
	case *ast.TagNode:
		tag := ""
		if tk := v.GetToken(); tk != nil {
			tag = tk.Value
		}
		p.errorf(where, path, "YAML tag %s is not supported in patterns; quote a value to make it a string", tag)
	default:
		p.errorf(where, path, "unsupported %s in a pattern", nodeKind(n))
	}
}

func aliasName(a *ast.AliasNode) string {
	if isNilNode(a.Value) {
		return ""
	}
	return tokenValue(a.Value)
}

// isOperator reports whether name is exactly an operator name.
func isOperator(name string) bool {
	_, ok := operators[name]
	return ok
}

// isScalar reports whether a (resolved) value node is a scalar or null,
// which is never a valid field condition.
func isScalar(n ast.Node) bool {
	switch n.(type) {
	case *ast.SequenceNode, *ast.MappingNode, *ast.MappingValueNode:
		return false
	}
	return true
}

// scalarText is a node's source text for messages, quoted as written.
func scalarText(n ast.Node) string {
	if isNilNode(n) {
		return "null"
	}
	switch v := n.(type) {
	case *ast.LiteralNode:
		if v.Value != nil {
			return strconv.Quote(v.Value.Value)
		}
	case *ast.TagNode:
		if !isNilNode(v.Value) {
			return tokenValue(v) + " " + scalarText(v.Value)
		}
	}
	tk := n.GetToken()
	if tk == nil {
		return nodeKind(n)
	}
	switch tk.Type {
	case token.DoubleQuoteType:
		return strconv.Quote(tk.Value)
	case token.SingleQuoteType:
		return "'" + strings.ReplaceAll(tk.Value, "'", "''") + "'"
	}
	return tk.Value
}

func tokenValue(n ast.Node) string {
	if isNilNode(n) {
		return ""
	}
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

func nodeKind(n ast.Node) string {
	if isNilNode(n) {
		return "empty value"
	}
	return strings.ToLower(n.Type().String())
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
