package matcher_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/matcher"
)

func TestDecodeEvent(t *testing.T) {
	accept := []struct {
		name string
		in   string
		want map[string]any
	}{
		{"empty object", `{}`, map[string]any{}},
		{"spec example", `{"event_name":"INSERT","table_name":"users"}`,
			map[string]any{"event_name": "INSERT", "table_name": "users"}},
		{"numbers keep their digits", `{"a":9007199254740993,"b":1.50,"c":3.5e1}`,
			map[string]any{"a": json.Number("9007199254740993"), "b": json.Number("1.50"), "c": json.Number("3.5e1")}},
		{"nested values", `{"o":{"a":[1,"x",null,true,{}]}}`,
			map[string]any{"o": map[string]any{"a": []any{json.Number("1"), "x", nil, true, map[string]any{}}}}},
		{"surrounding whitespace", " \n\t{\"a\":1}\r\n ", map[string]any{"a": json.Number("1")}},
		{"last duplicate key wins", `{"a":1,"a":2}`, map[string]any{"a": json.Number("2")}},
		{"unicode escapes", `{"k\u00e9":"\ud83d\ude00"}`, map[string]any{"ké": "😀"}},
	}
	deep := `{"a":` + strings.Repeat("[", matcher.MaxEventDepth-1) + strings.Repeat("]", matcher.MaxEventDepth-1) + `,"s":"[[[[{{\"[["}`
	if _, err := matcher.DecodeEvent([]byte(deep)); err != nil {
		t.Errorf("an event exactly %d deep, with brackets in a string: %v", matcher.MaxEventDepth, err)
	}
	for _, tt := range accept {
		t.Run(tt.name, func(t *testing.T) {
			got, err := matcher.DecodeEvent([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("DecodeEvent (-want +got):\n%s", diff)
			}
		})
	}

	reject := []struct {
		name, in, msg string
	}{
		{"empty", ``, "empty input"},
		{"whitespace", "  \n", "empty input"},
		{"null", `null`, "got null"},
		{"array", `[{"a":1}]`, "got an array"},
		{"string", `"{\"a\":1}"`, "got a string"},
		{"number", `42`, "got a number"},
		{"bool", `true`, "got a boolean"},
		{"truncated", `{"a":1`, "malformed event"},
		{"syntax", `{a:1}`, "malformed event"},
		{"trailing object", `{"a":1}{"b":2}`, "data after the JSON object"},
		{"trailing garbage", `{"a":1} x`, "data after the JSON object"},
		{"trailing brace", `{"a":1}}`, "data after the JSON object"},
		{"trailing comma", `{"a":1},`, "data after the JSON object"},
		{"nan", `{"a":NaN}`, "malformed event"},
		{"leading zero", `{"a":01}`, "malformed event"},
		{"invalid UTF-8", "{\"a\":\"ok \xff\xfe\"}", "not valid UTF-8 (first invalid byte at offset 9)"},
		{"too deep", `{"a":` + strings.Repeat("[", matcher.MaxEventDepth) + strings.Repeat("]", matcher.MaxEventDepth) + `}`, "nested deeper than 512 levels"},
	}
	for _, tt := range reject {
		t.Run("reject/"+tt.name, func(t *testing.T) {
			got, err := matcher.DecodeEvent([]byte(tt.in))
			if err == nil {
				t.Fatalf("DecodeEvent(%q) = %v, want an error", tt.in, got)
			}
			if !errors.Is(err, matcher.ErrMalformed) {
				t.Errorf("error %v does not wrap ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("error %q does not contain %q", err, tt.msg)
			}
		})
	}
}
