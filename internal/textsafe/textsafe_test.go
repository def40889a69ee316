package textsafe

import "testing"

func TestEscape(t *testing.T) {
	for _, tc := range []struct {
		in        string
		keepLines bool
		want      string
	}{
		{"plain text, ünïcödé", false, "plain text, ünïcödé"},
		{"\x1b[31mred\x1b[0m", false, `\x1b[31mred\x1b[0m`},
		{"bad \xff\xfe bytes", false, `bad \xff\xfe bytes`},
		{"c1 \u009b2J", false, `c1 \u009b2J`},
		{"bidi \u202egnp.exe", false, `bidi \u202egnp.exe`},
		{"a\nb\tc", false, `a\x0ab\x09c`},
		{"a\nb\tc\r", true, "a\nb\tc\\x0d"},
		{"", false, ""},
	} {
		if got := Escape(tc.in, tc.keepLines); got != tc.want {
			t.Errorf("Escape(%q, %v) = %q, want %q", tc.in, tc.keepLines, got, tc.want)
		}
	}
}
