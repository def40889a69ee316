package matcher

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestParseNow(t *testing.T) {
	accept := []struct {
		in   string
		want time.Duration
	}{
		{"now()", 0},
		{"now()-5m", -5 * time.Minute},
		{"now()+10m", 10 * time.Minute},
		{"now()-1h30m", -(time.Hour + 30*time.Minute)},
		{"now()+1h30m15s", time.Hour + 30*time.Minute + 15*time.Second},
		{"now()-1.5h", -90 * time.Minute},
		{"now()-.5s", -500 * time.Millisecond},
		{"now()+250ms", 250 * time.Millisecond},
		{"now()-10us", -10 * time.Microsecond},
		{"now()-10µs", -10 * time.Microsecond},
		{"now()+1ns", time.Nanosecond},
		{"now()-0", 0},
		{"now()-0s", 0},
		{"now()-2562047h", -2562047 * time.Hour},
	}
	for _, tt := range accept {
		t.Run(tt.in, func(t *testing.T) {
			got, ok, msg := parseNow(tt.in)
			if !ok {
				t.Fatalf("parseNow(%q) rejected: %s", tt.in, msg)
			}
			if got != tt.want {
				t.Errorf("parseNow(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
	reject := []struct {
		in, msg string
	}{
		{"", "neither a number nor a now() expression"},
		{"abc", "neither a number nor a now() expression"},
		{"now", `write "now()"`},
		{"now-5m", `write "now()-5m"`},
		{"now+1h", `write "now()+1h"`},
		{"now - 5m", `write "now()-5m"`},
		{"NOW()-5m", "lower case"},
		{"Now()", "lower case"},
		{" now()-5m", "lower case"},
		{"now() - 5m", `no spaces are allowed in a now() expression: write "now()-5m"`},
		{"now()-5m ", `no spaces`},
		{"now()- 5m", `no spaces`},
		{"now()-5 m", `no spaces`},
		{"now()5m", `after now() comes "+" or "-"`},
		{"now()*5m", `after now() comes "+" or "-"`},
		{"now()-", "expected a duration"},
		{"now()+", "expected a duration"},
		{"now()--5m", "expected a duration"},
		{"now()+-5m", "expected a duration"},
		{"now()-+5m", "expected a duration"},
		{"now()-m", "expected a duration"},
		{"now()-5", "not a Go duration"},
		{"now()-1d", "no day unit"},
		{"now()-1w", "no day unit"},
		{"now()-5mm", "not a Go duration"},
		{"now()-9999999999h", "not a Go duration"},
		{"now()()", `after now() comes "+" or "-"`},
		{"2026-09-12T10:00:00Z", "literal timestamp"},
		{"2026-09-12T10:00:00.5+02:00", "literal timestamp"},
		{"70", "quoted number"},
		{"-1.5e3", "quoted number"},
		{"today", "neither a number nor a now() expression"},
	}
	for _, tt := range reject {
		t.Run("reject/"+tt.in, func(t *testing.T) {
			_, ok, msg := parseNow(tt.in)
			if ok {
				t.Fatalf("parseNow(%q) accepted", tt.in)
			}
			if !strings.Contains(msg, tt.msg) {
				t.Errorf("parseNow(%q) message %q, want it to contain %q", tt.in, msg, tt.msg)
			}
		})
	}
}

func TestOperatorHint(t *testing.T) {
	tests := []struct {
		key    string
		want   string // "" when no hint
		unsure bool
	}{
		{"prefx", `did you mean "prefix"?`, false},
		{"prefixx", `did you mean "prefix"?`, false},
		{"perfix", `did you mean "prefix"?`, false},
		{"PREFIX", `did you mean "prefix"?`, false},
		{"pre-fix", `did you mean "prefix"?`, false},
		{"suffx", `did you mean "suffix"?`, false},
		{"exist", `did you mean "exists"?`, false},
		{"exsits", `did you mean "exists"?`, false},
		{"Exists", `did you mean "exists"?`, false},
		{"gte_", `did you mean "gte"?`, false},
		{"ge", `did you mean "gte"?`, false},
		{"le", `did you mean "lte"?`, false},
		{"ltt", `did you mean "lt"?`, false},
		{"g", `did you mean "gt"?`, false},
		{"startsWith", `did you mean "prefix"?`, false},
		{"ends_with", `did you mean "suffix"?`, false},
		{"present", `did you mean "exists: true"?`, false},
		{">=", `did you mean "gte"?`, false},
		{"<", `did you mean "lt"?`, false},
		{"eq", "there is no equals operator", false},
		{"Equals", "there is no equals operator", false},
		{"$eq", "there is no equals operator", false},
		{"$in", "there is no in operator", false},
		{"NOT", "no negation operator", false},
		{"$exists", `did you mean "exists"?`, false},
		// Ordinary field names get no hint.
		{"at", `did you mean "gt"?`, true},
		{"it", `did you mean "gt"?`, true},
		{"exit", `did you mean "exists"?`, true},
		{"suffixes", `did you mean "suffix"?`, true},
		{"regex", "no regular expression operator", false},
		{"wildcard", "no wildcard or substring operator", false},
		{"anything-but", "no negation operator", false},
		{"equals-ignore-case", "no case-insensitive operator", false},
		{"id", "", false},
		{"to", "", false},
		{"status", "", false},
		{"name", "", false},
		{"price", "", false},
		{"", "", false},
		{strings.Repeat("prefix", 20), "", false},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			got, sure, ok := operatorHint(tt.key)
			if ok != (tt.want != "") || !strings.Contains(got, tt.want) || ok && sure == tt.unsure {
				t.Errorf("operatorHint(%q) = %q, sure %v, ok %v; want %q, sure %v", tt.key, got, sure, ok, tt.want, !tt.unsure)
			}
		})
	}
}

func TestEditDistance(t *testing.T) {
	tests := []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"a", "", 1},
		{"", "abc", 3},
		{"prefix", "prefix", 0},
		{"prefx", "prefix", 1},
		{"perfix", "prefix", 1},
		{"exsits", "exists", 1},
		{"exit", "exists", 2},
		{"ab", "ba", 1},
		{"id", "gt", 2},
		{"kitten", "sitting", 3},
	}
	for _, tt := range tests {
		if got := editDistance(tt.a, tt.b); got != tt.want {
			t.Errorf("editDistance(%q, %q) = %d, want %d", tt.a, tt.b, got, tt.want)
		}
	}
}

func TestParseTimestamp(t *testing.T) {
	accept := map[string]string{ // input: UTC instant
		"2026-09-12T10:00:00Z":                "2026-09-12T10:00:00Z",
		"2026-09-12t10:00:00z":                "2026-09-12T10:00:00Z",
		"2026-09-12T12:00:00+02:00":           "2026-09-12T10:00:00Z",
		"2026-09-12T05:30:00-04:30":           "2026-09-12T10:00:00Z",
		"2026-09-12T10:00:00-00:00":           "2026-09-12T10:00:00Z",
		"2026-09-12T10:00:00.5Z":              "2026-09-12T10:00:00.5Z",
		"2026-09-12T10:00:00.123456789Z":      "2026-09-12T10:00:00.123456789Z",
		"2026-09-12T10:00:00.1234567899999Z":  "2026-09-12T10:00:00.123456789Z",
		"2026-09-12T23:59:59.999+23:59":       "2026-09-12T00:00:59.999Z",
		"2024-02-29T00:00:00Z":                "2024-02-29T00:00:00Z",
		"0001-01-01T00:00:00Z":                "0001-01-01T00:00:00Z",
		"9999-12-31T23:59:59Z":                "9999-12-31T23:59:59Z",
		"2026-09-12T10:00:00.000000000+00:00": "2026-09-12T10:00:00Z",
	}
	for in, want := range accept {
		t.Run(in, func(t *testing.T) {
			got, ok := parseTimestamp(in)
			if !ok {
				t.Fatalf("parseTimestamp(%q) rejected", in)
			}
			if diff := cmp.Diff(want, got.UTC().Format(time.RFC3339Nano)); diff != "" {
				t.Errorf("instant (-want +got):\n%s", diff)
			}
		})
	}
	reject := []string{
		"", "2026", "2026-09-12", "2026-09-12T10:00:00", "2026-09-12T10:00Z",
		"2026-09-12 10:00:00Z", "2026-09-12_10:00:00Z", "2026-9-12T10:00:00Z",
		"2026-09-12T10:00:00.Z", "2026-09-12T10:00:00,5Z", "2026-09-12T10:00:00+0200",
		"2026-09-12T10:00:00+02", "2026-09-12T10:00:00+24:00", "2026-09-12T10:00:00+23:60",
		"2026-09-12T10:00:00 Z", "2026-09-12T10:00:00ZZ", " 2026-09-12T10:00:00Z",
		"2026-09-12T10:00:00Z ", "+2026-09-12T10:00:00Z", "20260-09-12T10:00:00Z",
		"2026-02-29T00:00:00Z", "2026-02-30T00:00:00Z", "2026-13-01T00:00:00Z",
		"2026-00-01T00:00:00Z", "2026-01-00T00:00:00Z", "2026-01-01T24:00:00Z",
		"2026-01-01T00:60:00Z", "2016-12-31T23:59:60Z", "2026-01-01T00:00:00UTC",
		"2026-01-01T00:00:00+02:00:00", "２０２６-01-01T00:00:00Z", "2026-01-01T00:00:00.5",
	}
	for _, in := range reject {
		t.Run("reject/"+in, func(t *testing.T) {
			if got, ok := parseTimestamp(in); ok {
				t.Errorf("parseTimestamp(%q) = %v, want rejection", in, got)
			}
		})
	}
}
