package main

import (
	"bytes"
	"strings"
	"testing"
)

// A malformed event or a handler's stderr line stored in the DLQ reaches
// the operator's terminal through dlq inspect and the tables: escape
// sequences and bytes that are not UTF-8 come out escaped, and a cell
// cannot add a row.
func TestOutputEscapesStoredBytes(t *testing.T) {
	for _, tc := range []struct{ event, want string }{
		{"not json \x1b]0;pwned\x07 \xff", `not json \x1b]0;pwned\x07 \xff` + "\n(not valid JSON"},
		{"{\"k\": \"\u009b2J\xff\"}", "{\n  \"k\": \"\\u009b2J\\xff\"\n}"},
		{`{"k": [1, 2]}`, "{\n  \"k\": [\n    1,\n    2\n  ]\n}"},
	} {
		if got := prettyEvent(tc.event); !strings.HasPrefix(got, tc.want) {
			t.Errorf("prettyEvent(%q) = %q, want prefix %q", tc.event, got, tc.want)
		}
	}

	var buf bytes.Buffer
	if err := table(&buf, []string{"ID", "REASON"}, [][]string{{"1-0", "exit 1: boom\n2-0\tforged row \x1b[2J"}}); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if strings.Count(out, "\n") != 2 || strings.ContainsRune(out, 0x1b) {
		t.Fatalf("table let a stored value break out of its cell:\n%q", out)
	}
	if !strings.Contains(out, `exit 1: boom\x0a2-0\x09forged row \x1b[2J`) {
		t.Fatalf("table cell not escaped as expected:\n%q", out)
	}
}
