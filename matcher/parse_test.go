package matcher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

// TestParseTree parses trees built in Go, as a front end other than YAML
// would: positions come from the nodes, a node without one is reported at
// the node holding it, and kinds the language has no use for are errors.
func TestParseTree(t *testing.T) {
	str := func(line, col int, s string) *matcher.Node {
		return &matcher.Node{Kind: matcher.KindString, Line: line, Col: col, Text: s, Value: s}
	}
	mapping := func(line, col int, kv ...*matcher.Node) *matcher.Node {
		n := &matcher.Node{Kind: matcher.KindMapping, Line: line, Col: col}
		for i := 0; i < len(kv); i += 2 {
			n.Entries = append(n.Entries, matcher.Entry{Key: kv[i], Value: kv[i+1], Line: kv[i].Line, Col: kv[i].Col})
		}
		return n
	}
	seq := func(line, col int, elems ...*matcher.Node) *matcher.Node {
		return &matcher.Node{Kind: matcher.KindSequence, Line: line, Col: col, Elems: elems}
	}

	good := mapping(1, 1,
		str(1, 1, "status"), seq(1, 9, str(1, 10, "OK"), &matcher.Node{Kind: matcher.KindString, Style: matcher.DoubleQuoted, Text: "35", Value: "35"}, str(0, 0, "35")),
		str(2, 1, "id"), mapping(2, 5, str(2, 6, "prefix"), str(2, 14, "u_")),
	)
	p, errs := matcher.ParseTree("go", "rule", good)
	if errs != nil {
		t.Fatal(errs)
	}
	if diff := cmp.Diff(`{status: ["OK", "35", 35], id: [{prefix: "u_"}]}`, p.String()); diff != "" {
		t.Errorf("String() (-want +got):\n%s", diff)
	}

	bad := mapping(3, 1,
		str(3, 1, "a"), seq(3, 4, &matcher.Node{Kind: matcher.KindUnknown}, &matcher.Node{Kind: matcher.KindAlias, Line: 3, Col: 9, Text: "*", Value: "x"}),
		str(4, 1, "b"), &matcher.Node{Kind: matcher.KindInt, Line: 4, Col: 4, Text: "0x1f", Number: "31"},
		str(5, 1, "c"), seq(5, 4, &matcher.Node{Kind: matcher.KindInt, Line: 5, Col: 5, Text: "0x1f", Number: "31"}),
	)
	_, errs = matcher.ParseTree("go", "rule", bad)
	var got []string
	for _, e := range errs {
		got = append(got, e.Error())
	}
	want := []string{
		"go:3:4: rule.a[0]: unexpected unknown: expected a scalar value",
		"go:3:9: rule.a[1]: aliases (*x) are not supported in patterns: write the value out",
		"go:4:4: rule.b: a condition is a list of alternatives, not a scalar: write b: [0x1f]",
		"go:5:5: rule.c[0]: write the number 0x1f in plain decimal, e.g. 31, or quote it (\"0x1f\") to match a string",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("errors (-want +got):\n%s", diff)
	}

	if p, errs := matcher.ParseTree("go", "rule", nil); p != nil || len(errs) != 1 || !strings.Contains(errs[0].Error(), "go:1:1: rule: empty pattern") {
		t.Errorf("ParseTree(nil) = %v, %v", p, errs)
	}
}

// TestCanonicalForm checks String, which also shows how a pattern was read:
// shorthand maps become one-element lists, numbers become canonical.
func TestCanonicalForm(t *testing.T) {
	tests := []struct {
		name, in, want string
	}{
		{"spec rule", "event_name: [INSERT]\ntable_name: [users]",
			`{event_name: ["INSERT"], table_name: ["users"]}`},
		{"shorthand map", "new_image: {status: [COMPLETED]}",
			`{new_image: [{status: ["COMPLETED"]}]}`},
		{"shorthand map in a list", "new_image: [{status: [COMPLETED]}]",
			`{new_image: [{status: ["COMPLETED"]}]}`},
		{"shorthand operator", `id: {prefix: "user_"}`,
			`{id: [{prefix: "user_"}]}`},
		{"operators", "a: [{prefix: x}, {suffix: y}, {exists: false}, {gt: 1}, {gte: 2.50}, {lt: -3e2}, {lte: \"now()-1h30m\"}]",
			`{a: [{prefix: "x"}, {suffix: "y"}, {exists: false}, {gt: 1}, {gte: 2.5}, {lt: -300}, {lte: "now()-1h30m"}]}`},
		{"literals", `a: [35, 35.0, 3.5e1, "35", true, null, x]`,
			`{a: [35, 35, 35, "35", true, null, "x"]}`},
		{"quoted keys", `"a.b": [1]` + "\n" + `"with space": [2]` + "\n" + `"": [3]`,
			`{"a.b": [1], "with space": [2], "": [3]}`},
		{"field order kept", "z: [1]\na: [2]", `{z: [1], a: [2]}`},
		{"unicode", "名前: [太郎]", `{"名前": ["太郎"]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := yamlpattern.Parse("p.yaml", []byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, p.String()); diff != "" {
				t.Errorf("String() (-want +got):\n%s", diff)
			}
		})
	}
	var nilPattern *matcher.Pattern
	if got := nilPattern.String(); got != "<nil>" {
		t.Errorf("nil String() = %q", got)
	}
}

// TestMatchValueGoValues covers values built in Go rather than by
// DecodeEvent: float64 and int numbers, a nil event, a nil pattern.
func TestMatchValueGoValues(t *testing.T) {
	p, err := yamlpattern.Parse("p.yaml", []byte("n: [35]\nm: [{gt: 1.5}]\nk: [{exists: false}]"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	tests := []struct {
		name  string
		event map[string]any
		want  bool
	}{
		{"float64", map[string]any{"n": 35.0, "m": 1.6}, true},
		{"int", map[string]any{"n": 35, "m": int64(2)}, true},
		{"float64 below", map[string]any{"n": 35.0, "m": 1.5}, false},
		{"nil event", nil, false},
		{"unsupported number type", map[string]any{"n": int32(35), "m": 2.0}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := p.MatchValue(tt.event, now); got != tt.want {
				t.Errorf("MatchValue(%v) = %v, want %v", tt.event, got, tt.want)
			}
		})
	}
	var nilPattern *matcher.Pattern
	if nilPattern.MatchValue(map[string]any{}, now) {
		t.Error("nil pattern matched")
	}

	abs, err := yamlpattern.Parse("p.yaml", []byte("k: [{exists: false}]"))
	if err != nil {
		t.Fatal(err)
	}
	if !abs.MatchValue(nil, now) {
		t.Error("exists: false does not match a nil event")
	}
}
