package yamlpattern

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"

	"github.com/goccy/go-yaml"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/relaydev/relay/matcher"
)

// Parse parses pattern YAML text: one document holding a mapping of field
// names to conditions, within the limits of CheckBounds. file names the
// source in errors. The error is a
// matcher.ErrorList holding every problem found, YAML syntax errors
// included, each with its 1-based line and column in src.
func Parse(file string, src []byte) (*matcher.Pattern, error) {
	if line, col, msg := CheckBounds(src); msg != "" {
		var l matcher.ErrorList
		l.Add(file, line, col, "", "pattern "+msg)
		return nil, l
	}
	f, err := parser.ParseBytes(src, 0)
	if err != nil {
		var l matcher.ErrorList
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
			var l matcher.ErrorList
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
		var l matcher.ErrorList
		l.Add(file, 1, 1, "", "empty pattern: a pattern maps at least one field to a list of alternatives, e.g. status: [COMPLETED]")
		return nil, l
	}
	p, errs := ParseNode(file, "", body)
	return p, errs.Err()
}

// ParseNode parses the YAML node of one rule's pattern: value, as
// matcher.ParseTree does: file names the template in errors (e.g.
// "orders/template.yaml"), path is the pattern's path in messages (e.g.
// "events[1].pattern"), and every error found is returned, sorted, with the
// line and column of the offending node in the file; the Pattern is nil when
// there is any. node may be nil (an empty pattern, reported as such).
func ParseNode(file, path string, node ast.Node) (*matcher.Pattern, matcher.ErrorList) {
	return matcher.ParseTree(file, path, convert(node))
}

// NodePos returns the 1-based line and column where n starts in its source:
// the key of a mapping entry, the first key of a block mapping, the "{", "["
// or "-" of a flow mapping or sequence, the first character of a scalar. It
// returns 0, 0 for nil or a node without position.
func NodePos(n ast.Node) (line, col int) {
	if isNilNode(n) {
		return 0, 0
	}
	switch v := n.(type) {
	case *ast.MappingValueNode:
		if !isNilNode(v.Key) {
			if line, col := NodePos(v.Key); line > 0 {
				return line, col
			}
		}
	case *ast.MappingNode:
		if !v.IsFlowStyle && len(v.Values) > 0 {
			if line, col := NodePos(v.Values[0]); line > 0 {
				return line, col
			}
		}
	case *ast.DocumentNode:
		// A document's token is its body's: without a body, the "---"
		// that starts it, if any.
		if !isNilNode(v.Body) {
			return NodePos(v.Body)
		}
		if v.Start == nil || v.Start.Position == nil {
			return 0, 0
		}
		return v.Start.Position.Line, v.Start.Position.Column
	}
	tk := n.GetToken()
	if tk == nil || tk.Position == nil {
		return 0, 0
	}
	return tk.Position.Line, tk.Position.Column
}

// convert turns a go-yaml node into matcher's syntax tree, keeping every
// position (NodePos) and the source text messages quote.
func convert(n ast.Node) *matcher.Node {
	if isNilNode(n) {
		return nil
	}
	if doc, ok := n.(*ast.DocumentNode); ok {
		return convert(doc.Body)
	}
	line, col := NodePos(n)
	out := &matcher.Node{Line: line, Col: col, Text: tokenValue(n)}
	switch v := n.(type) {
	case *ast.MappingNode:
		out.Kind = matcher.KindMapping
		out.Entries = make([]matcher.Entry, 0, len(v.Values))
		for _, mv := range v.Values {
			if !isNilNode(mv) {
				out.Entries = append(out.Entries, entry(mv))
			}
		}
	case *ast.MappingValueNode:
		// A mapping of one entry, as go-yaml reads "a: b" in some places.
		out.Kind = matcher.KindMapping
		out.Entries = []matcher.Entry{entry(v)}
	case *ast.SequenceNode:
		out.Kind = matcher.KindSequence
		out.Elems = make([]*matcher.Node, len(v.Values))
		for i, elem := range v.Values {
			out.Elems[i] = convert(elem)
		}
	case *ast.StringNode:
		out.Kind = matcher.KindString
		out.Value = v.Value
		if tk := v.GetToken(); tk != nil {
			switch tk.Type {
			case token.DoubleQuoteType:
				out.Style = matcher.DoubleQuoted
			case token.SingleQuoteType:
				out.Style = matcher.SingleQuoted
			}
		}
	case *ast.LiteralNode:
		out.Kind = matcher.KindBlock
		if v.Value != nil {
			out.Value = v.Value.Value
		}
	case *ast.IntegerNode:
		out.Kind = matcher.KindInt
		out.Number = decimalText(v.GetValue())
	case *ast.FloatNode:
		out.Kind = matcher.KindFloat
		out.Number = decimalText(v.GetValue())
	case *ast.BoolNode:
		out.Kind = matcher.KindBool
		out.Bool = v.Value
	case *ast.NullNode:
		out.Kind = matcher.KindNull
		if tk := v.GetToken(); tk != nil && tk.Type == token.ImplicitNullType {
			out.Kind = matcher.KindImplicitNull
		}
	case *ast.InfinityNode:
		out.Kind = matcher.KindInf
	case *ast.NanNode:
		out.Kind = matcher.KindNaN
	case *ast.TagNode:
		out.Kind = matcher.KindTag
		out.Inner = convert(v.Value)
	case *ast.AnchorNode:
		out.Kind = matcher.KindAnchor
		out.Inner = convert(v.Value)
	case *ast.AliasNode:
		out.Kind = matcher.KindAlias
		out.Value = tokenValue(v.Value)
	case *ast.MergeKeyNode:
		out.Kind = matcher.KindMergeKey
	case *ast.MappingKeyNode:
		out.Kind = matcher.KindComplexKey
	default:
		out.Kind = matcher.KindUnknown
	}
	return out
}

func entry(mv *ast.MappingValueNode) matcher.Entry {
	line, col := NodePos(mv)
	return matcher.Entry{Key: convert(mv.Key), Value: convert(mv.Value), Line: line, Col: col}
}

// decimalText formats the value go-yaml decoded from a number written in
// another base or with underscores (0x1f, 0o17, 1_000) in decimal, for the
// suggestion in the error that rejects it.
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

func tokenValue(n ast.Node) string {
	if tk := n.GetToken(); tk != nil {
		return tk.Value
	}
	return ""
}

// isNilNode reports whether n is nil or a nil pointer in a non-nil interface,
// which the go-yaml node methods would dereference.
func isNilNode(n ast.Node) bool {
	if n == nil {
		return true
	}
	v := reflect.ValueOf(n)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
