package matcher

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseDecimal(t *testing.T) {
	tests := []struct {
		in        string
		yamlForms bool
		ok        bool
		want      string // canonical String()
	}{
		{"0", false, true, "0"},
		{"-0", false, true, "0"},
		{"-0.0e-7", false, true, "0"},
		{"35", false, true, "35"},
		{"35.0", false, true, "35"},
		{"3.5e1", false, true, "35"},
		{"3.5E+1", false, true, "35"},
		{"350e-1", false, true, "35"},
		{"0.35e2", false, true, "35"},
		{"100", false, true, "100"},
		{"1e20", false, true, "100000000000000000000"},
		{"1e21", false, true, "1e21"},
		{"-1.5e-3", false, true, "-0.0015"},
		{"1e-7", false, true, "1e-7"},
		{"123.456", false, true, "123.456"},
		{"0.001", false, true, "0.001"},
		{"9007199254740993", false, true, "9007199254740993"},
		{"1e999999999999999999999", false, true, "1e1125899906842624"},
		{"1e-999999999999999999999", false, true, "1e-1125899906842624"},
		// Not JSON.
		{"", false, false, ""},
		{"-", false, false, ""},
		{"+1", false, false, ""},
		{".5", false, false, ""},
		{"5.", false, false, ""},
		{"01", false, false, ""},
		{"1e", false, false, ""},
		{"1e+", false, false, ""},
		{"1x", false, false, ""},
		{"0x10", false, false, ""},
		{"1_000", false, false, ""},
		{" 1", false, false, ""},
		{"NaN", false, false, ""},
		{"Infinity", false, false, ""},
		// YAML 1.2 float forms.
		{"+1", true, true, "1"},
		{".5", true, true, "0.5"},
		{"+.5", true, true, "0.5"},
		{"5.", true, true, "5"},
		{".", true, false, ""},
		{"+", true, false, ""},
		{"00", true, false, ""},
		{"1e3", true, true, "1000"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			d, ok := parseDecimal(tt.in, tt.yamlForms)
			if ok != tt.ok {
				t.Fatalf("parseDecimal(%q, %v) ok = %v, want %v", tt.in, tt.yamlForms, ok, tt.ok)
			}
			if !ok {
				return
			}
			if diff := cmp.Diff(tt.want, d.String()); diff != "" {
				t.Errorf("String() (-want +got):\n%s", diff)
			}
			// The canonical form is a JSON number with the same value.
			e, ok := parseDecimal(d.String(), false)
			if !ok || e.cmp(d) != 0 {
				t.Errorf("canonical %q does not parse back to an equal value", d.String())
			}
		})
	}
}

func TestDecimalCmp(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"0", "-0", 0},
		{"35", "3.5e1", 0},
		{"35", "35.000", 0},
		{"1", "2", -1},
		{"2", "1", 1},
		{"-1", "1", -1},
		{"1", "-1", 1},
		{"-2", "-1", -1},
		{"-1", "-2", 1},
		{"0", "1e-400", -1},
		{"0", "-1e-400", 1},
		{"-1e-400", "0", -1},
		{"1e-400", "0", 1},
		{"10", "9", 1},
		{"9", "10", -1},
		{"100", "99.99999999999999999999", 1},
		{"12", "123", -1},
		{"123", "12", 1},
		{"1.2", "1.23", -1},
		{"1.23", "1.2", 1},
		{"0.1", "0.09", 1},
		{"0.001", "0.01", -1},
		{"9007199254740993", "9007199254740992", 1},
		{"9007199254740993", "9007199254740993.0", 0},
		{"-9007199254740993", "-9007199254740992", -1},
		{"1e400", "1e399", 1},
		{"-1e400", "-1e399", -1},
		{"123456789012345678901234567890", "1.23456789012345678901234567890e29", 0},
		{"0.30000000000000004", "0.3", 1},
	}
	for _, tt := range tests {
		t.Run(tt.a+"_vs_"+tt.b, func(t *testing.T) {
			a, ok1 := parseDecimal(tt.a, false)
			b, ok2 := parseDecimal(tt.b, false)
			if !ok1 || !ok2 {
				t.Fatalf("parse failed: %v %v", ok1, ok2)
			}
			if got := a.cmp(b); got != tt.want {
				t.Errorf("cmp(%s, %s) = %d, want %d", tt.a, tt.b, got, tt.want)
			}
			if got := b.cmp(a); got != -tt.want {
				t.Errorf("cmp(%s, %s) = %d, want %d", tt.b, tt.a, got, -tt.want)
			}
		})
	}
}

func TestParseDecimalNoAlloc(t *testing.T) {
	a, _ := parseDecimal("12345.678e3", false)
	allocs := testing.AllocsPerRun(100, func() {
		b, _ := parseDecimal("12345678", false)
		if a.cmp(b) != 0 {
			t.Fatal("not equal")
		}
	})
	if allocs != 0 {
		t.Errorf("parseDecimal+cmp allocate %v times, want 0", allocs)
	}
}
