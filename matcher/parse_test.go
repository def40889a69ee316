package matcher_test

import (
	"strings"
	"testing"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
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
		p, errs := matcher.ParseNode("users/template.yaml", "events[0].pattern", nodes[0])
		if errs != nil {
			t.Fatalf("events[0]: %v", errs)
		}
		if diff := cmp.Diff("{event_name: [\"INSERT\"], table_name: [\"users\"]}", p.String()); diff != "" {
			t.Errorf("String() (-want +got):\n%s", diff)
		}

		p, errs = matcher.ParseNode("orders/template.yaml", "events[1].pattern", nodes[1])
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
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, errs := matcher.ParseNode("f.yaml", "events[0].pattern", tt.node)
			if p != nil || len(errs) != 1 || !strings.HasPrefix(errs[0].Error(), tt.want) {
				t.Errorf("ParseNode = %v, %v; want error %q", p, errs, tt.want)
			}
		})
	}
}

func TestParseReturnsErrorList(t *testing.T) {
	_, err := matcher.Parse("p.yaml", []byte("a: x\nb: []\n"))
	list, ok := err.(matcher.ErrorList)
	if !ok || len(list) != 2 {
		t.Fatalf("Parse error = %#v, want an ErrorList of 2", err)
	}
	if list[0].File != "p.yaml" || list[0].Path != "a" || list[1].Path != "b" {
		t.Errorf("errors = %v", list)
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
			p, err := matcher.Parse("p.yaml", []byte(tt.in))
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
	p, err := matcher.Parse("p.yaml", []byte("n: [35]\nm: [{gt: 1.5}]\nk: [{exists: false}]"))
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

	abs, err := matcher.Parse("p.yaml", []byte("k: [{exists: false}]"))
	if err != nil {
		t.Fatal(err)
	}
	if !abs.MatchValue(nil, now) {
		t.Error("exists: false does not match a nil event")
	}
}
