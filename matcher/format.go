package matcher

import (
	"strconv"
	"strings"
)

// String returns p in canonical YAML flow form, every condition written as
// a list: {status: [COMPLETED], id: [{prefix: "user_"}]}. Parsing the result
// gives an equivalent pattern.
func (p *Pattern) String() string {
	if p == nil {
		return "<nil>"
	}
	var b strings.Builder
	writeFields(&b, p.fields)
	return b.String()
}

func writeFields(b *strings.Builder, fields []field) {
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(formatKey(f.name))
		b.WriteString(": [")
		for j := range f.alts {
			if j > 0 {
				b.WriteString(", ")
			}
			writeAlt(b, &f.alts[j])
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
}

func writeAlt(b *strings.Builder, a *alt) {
	switch a.op {
	case opEqual:
		b.WriteString(a.lit.String())
	case opNested:
		writeFields(b, a.fields)
	case opPrefix, opSuffix:
		b.WriteString("{" + a.op.String() + ": " + strconv.Quote(a.str) + "}")
	case opExists:
		b.WriteString("{exists: " + strconv.FormatBool(a.exists) + "}")
	default:
		if a.temporal {
			b.WriteString("{" + a.op.String() + ": " + strconv.Quote(a.nowText) + "}")
		} else {
			b.WriteString("{" + a.op.String() + ": " + a.num.String() + "}")
		}
	}
}

func (l literal) String() string {
	switch l.kind {
	case litString:
		return strconv.Quote(l.str)
	case litNumber:
		return l.num.String()
	case litBool:
		return strconv.FormatBool(l.b)
	}
	return "null"
}

// formatKey writes a field name as the parser reads it back: with a
// leading backslash when the name would read as an operator or starts with
// one itself (docs/apps.md#patterns), then bare when YAML reads it back
// unchanged as a plain scalar, else double-quoted.
func formatKey(name string) string {
	key := name
	if isOperator(name) || refusedAsField(name) || strings.HasPrefix(name, `\`) {
		key = `\` + name
	}
	if name == "" {
		return `""`
	}
	for i := range len(name) {
		c := name[i]
		if !(c == '_' || isDigit(c) && i > 0 || c == '-' && i > 0 || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z') {
			return strconv.Quote(key)
		}
	}
	return key
}
