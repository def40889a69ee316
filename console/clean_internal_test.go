package console

import "testing"

// TestClean: what the console shows of stored text is valid UTF-8 with
// control and bidirectional characters escaped, newlines and tabs kept.
func TestClean(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"plain text, ünïcode", "plain text, ünïcode"},
		{"line 1\n\tline 2", "line 1\n\tline 2"},
		{"\x1b[31mred\x1b[0m", `\x1b[31mred\x1b[0m`},
		{"abc\u202edcba", `abc\u202edcba`},
		{"bad \xff byte", "bad \uFFFD byte"},
		{"nul\x00 and del\x7f and c1\u0085", `nul\x00 and del\x7f and c1\u0085`},
	} {
		if got := clean(c.in); got != c.want {
			t.Errorf("clean(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}
