package yamlpattern_test

import (
	"strings"
	"testing"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

const template = `runtime: python3
events:
  - handler: users.created
    pattern:
      event_name: [INSERT]
      table_name: [users]
  - handler: orders.done
    # a comment the loader may keep
    pattern:
      status: COMPLETED
      id: [{prefx: "x"}]
      new_image:
        amount: [{gt: "2026-09-12T10:00:00Z"}]
`

// rulePatterns returns the pattern: node of each rule in src, as the
// template loader would find it.
func rulePatterns(t *testing.T, src string, mode parser.Mode) []ast.Node {
	t.Helper()
	f, err := parser.ParseBytes([]byte(src), mode)
	if err != nil {
		t.Fatal(err)
	}
	var out []ast.Node
	for _, top := range f.Docs[0].Body.(*ast.MappingNode).Values {
		if top.Key.GetToken().Value != "events" {
			continue
		}
		for _, rule := range top.Value.(*ast.SequenceNode).Values {
			for _, kv := range rule.(*ast.MappingNode).Values {
				if kv.Key.GetToken().Value == "pattern" {
					out = append(out, kv.Value)
				}
			}
		}
	}
	return out
}

func TestParseNodeInTemplate(t *testing.T) {
	for _, mode := range []parser.Mode{0, parser.ParseComments} {
		nodes := rulePatterns(t, template, mode)
		if len(nodes) != 2 {
			t.Fatalf("found %d patterns", len(nodes))
		}
		p, errs := yamlpattern.ParseNode("users/template.yaml", "events[0].pattern", nodes[0])
		if errs != nil {
			t.Fatalf("events[0]: %v", errs)
		}
		if diff := cmp.Diff("{event_name: [\"INSERT\"], table_name: [\"users\"]}", p.String()); diff != "" {
			t.Errorf("String() (-want +got):\n%s", diff)
		}

		p, errs = yamlpattern.ParseNode("orders/template.yaml", "events[1].pattern", nodes[1])
		if p != nil {
			t.Errorf("pattern %v returned with errors", p)
		}
		var got []string
		for _, e := range errs {
			got = append(got, e.Error())
		}
		want := []string{
			`orders/template.yaml:10:15: events[1].pattern.status: a condition is a list of alternatives, not a scalar: write status: [COMPLETED]`,
			`orders/template.yaml:11:13: events[1].pattern.id[0].prefx: unknown operator "prefx": did you mean "prefix"?`,
			`orders/template.yaml:13:23: events[1].pattern.new_image.amount[0].gt: literal timestamp "2026-09-12T10:00:00Z" is not accepted; use a now()-relative expression such as "now()-5m"`,
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("mode %v errors (-want +got):\n%s", mode, diff)
		}
		if err := errs.Err(); err == nil || !strings.HasSuffix(err.Error(), "(and 2 more errors)") {
			t.Errorf("Err() = %v", err)
		}
	}
}

func TestParseNodeEdgeInputs(t *testing.T) {
	tests := []struct {
		name string
		node ast.Node
		want string
	}{
		{"nil", nil, "f.yaml:1:1: events[0].pattern: empty pattern"},
		{"typed nil", (*ast.MappingNode)(nil), "f.yaml:1:1: events[0].pattern: empty pattern"},
		{"document without body", &ast.DocumentNode{}, "f.yaml:1:1: events[0].pattern: empty pattern"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, errs := yamlpattern.ParseNode("f.yaml", "events[0].pattern", tt.node)
			if p != nil || len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), tt.want) {
				t.Errorf("ParseNode = %v, %v; want error %q", p, errs, tt.want)
			}
		})
	}
}

func TestParseReturnsErrorList(t *testing.T) {
	_, err := yamlpattern.Parse("p.yaml", []byte("a: x\nb: []\n"))
	list, ok := err.(matcher.ErrorList)
	if !ok || len(list) != 2 {
		t.Fatalf("Parse error = %#v, want an ErrorList of 2", err)
	}
	if list[0].File != "p.yaml" || list[0].Path != "a" || list[1].Path != "b" {
		t.Errorf("errors = %v", list)
	}
}

func TestNodePos(t *testing.T) {
	src := "a: 1\nb:\n  c: [x, {d: 2}]\n  e:\n    - f\n"
	f, err := parser.ParseBytes([]byte(src), 0)
	if err != nil {
		t.Fatal(err)
	}
	empty, err := parser.ParseBytes([]byte("a: [1]\n---\n"), 0)
	if err != nil || len(empty.Docs) != 2 || empty.Docs[1].Body != nil {
		t.Fatalf("want a second document without body: %v", err)
	}
	root := f.Docs[0].Body.(*ast.MappingNode)
	b := root.Values[1]
	bmap := b.Value.(*ast.MappingNode)
	c := bmap.Values[0]
	seq := c.Value.(*ast.SequenceNode)
	e := bmap.Values[1]
	tests := []struct {
		name string
		node ast.Node
		want [2]int
	}{
		{"document", f.Docs[0], [2]int{1, 1}},
		{"block mapping", root, [2]int{1, 1}},
		{"mapping value is its key", b, [2]int{2, 1}},
		{"nested block mapping", bmap, [2]int{3, 3}},
		{"flow sequence", seq, [2]int{3, 6}},
		{"scalar in flow sequence", seq.Values[0], [2]int{3, 7}},
		{"flow mapping", seq.Values[1], [2]int{3, 10}},
		{"block sequence", e.Value, [2]int{5, 5}},
		{"scalar", root.Values[0].Value, [2]int{1, 4}},
		{"document without body is its ---", empty.Docs[1], [2]int{2, 1}},
		{"nil", nil, [2]int{0, 0}},
		{"typed nil", (*ast.StringNode)(nil), [2]int{0, 0}},
		{"typed nil mapping", (*ast.MappingNode)(nil), [2]int{0, 0}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, col := yamlpattern.NodePos(tt.node)
			if diff := cmp.Diff(tt.want, [2]int{line, col}); diff != "" {
				t.Errorf("NodePos (-want +got):\n%s", diff)
			}
		})
	}
}

// TestParseIsBounded: pattern text from a user (the console's playground)
// cannot make the YAML parser take gigabytes: the depth and the number of
// tokens are checked on the scanner's tokens before it parses.
func TestParseIsBounded(t *testing.T) {
	for name, c := range map[string]struct{ src, want string }{
		"deep":    {"k: " + strings.Repeat("[", 30000) + "v" + strings.Repeat("]", 30000), "p.yaml:1:68: pattern nests [ and { more than 64 deep"},
		"compact": {"k:\n  " + strings.Repeat("- ", 30000) + "v", "p.yaml:2:257: pattern is indented more than 256 columns"},
		// The parser's lexer scans on past an error: so does the check.
		"after an error": {"k: [\"\\q\"]\nj: " + strings.Repeat("[", 30000) + "v" + strings.Repeat("]", 30000), "p.yaml:2:68: pattern nests [ and { more than 64 deep"},
		"flat":           {"k: [" + strings.Repeat("v,", 200000) + "v]", "p.yaml:1:1: pattern has more than 100000 YAML tokens"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := yamlpattern.Parse("p.yaml", []byte(c.src))
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("err = %v, want %q", err, c.want)
			}
		})
	}
}
