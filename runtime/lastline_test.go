package runtime

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"
)

func TestLineWriterLastLine(t *testing.T) {
	var out bytes.Buffer
	w := NewLineWriter(&out, "[a/h] ")
	if w.LastLine() != "" {
		t.Fatal("LastLine before any output")
	}
	fmt.Fprint(w, "first\nsecond: card declined\n  \n")
	if got := w.LastLine(); got != "second: card declined" {
		t.Errorf("LastLine = %q (blank lines must not replace it)", got)
	}
	fmt.Fprint(w, "partial without newline")
	w.Close()
	if got := w.LastLine(); got != "partial without newline" {
		t.Errorf("LastLine after Close = %q", got)
	}
	long := NewLineWriter(io.Discard, "")
	fmt.Fprint(long, strings.Repeat("y", 1000)+"\n")
	if n := len(long.LastLine()); n != maxLastLine {
		t.Errorf("LastLine kept %d bytes, want %d", n, maxLastLine)
	}
}
