package runtime_test

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/runtime"
)

// recorder records every Write call separately.
type recorder struct {
	mu     sync.Mutex
	writes []string
}

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.writes = append(r.writes, string(p))
	return len(p), nil
}

func TestLineWriter(t *testing.T) {
	tests := []struct {
		name   string
		writes []string
		want   []string // one entry per Write call on the destination
	}{
		{"one line", []string{"hello\n"}, []string{"[a/h] hello\n"}},
		{"two lines one write", []string{"a\nb\n"}, []string{"[a/h] a\n", "[a/h] b\n"}},
		{"split across writes", []string{"hel", "lo\nwor", "ld\n"}, []string{"[a/h] hello\n", "[a/h] world\n"}},
		{"partial flushed on close", []string{"no newline"}, []string{"[a/h] no newline\n"}},
		{"empty lines kept", []string{"\n\n"}, []string{"[a/h] \n", "[a/h] \n"}},
		{"crlf verbatim", []string{"dos\r\n"}, []string{"[a/h] dos\r\n"}},
		{"nothing", nil, nil},
		{"empty write", []string{""}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var rec recorder
			lw := runtime.NewLineWriter(&rec, runtime.Prefix("a", "h"))
			for _, w := range tt.writes {
				n, err := lw.Write([]byte(w))
				if err != nil || n != len(w) {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if err := lw.Close(); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, rec.writes); diff != "" {
				t.Errorf("writes (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLineWriterLongLine(t *testing.T) {
	const max = runtime.MaxLineBytes
	for _, size := range []int{max - 1, max, max + 1, 2*max + 5} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			line := strings.Repeat("x", size)
			var rec recorder
			lw := runtime.NewLineWriter(&rec, "> ")
			// in small chunks and in one piece
			for i := 0; i < len(line); i += 1000 {
				lw.Write([]byte(line[i:min(i+1000, len(line))]))
			}
			lw.Write([]byte("\nnext\n"))
			lw.Close()

			var got strings.Builder
			for _, w := range rec.writes[:len(rec.writes)-1] {
				if !strings.HasPrefix(w, "> ") || !strings.HasSuffix(w, "\n") {
					t.Fatalf("write %.20q... is not a prefixed line", w)
				}
				if len(w) > len("> ")+max+1 {
					t.Fatalf("line of %d bytes exceeds the cap", len(w))
				}
				got.WriteString(strings.TrimSuffix(strings.TrimPrefix(w, "> "), "\n"))
			}
			if got.String() != line {
				t.Errorf("reassembled %d bytes, want %d (nothing dropped)", got.Len(), len(line))
			}
			if wantLines := (size + max - 1) / max; len(rec.writes)-1 != wantLines {
				t.Errorf("got %d lines for %d bytes, want %d", len(rec.writes)-1, size, wantLines)
			}
			if last := rec.writes[len(rec.writes)-1]; last != "> next\n" {
				t.Errorf("last line = %q", last)
			}
		})
	}
}

// TestLineWriterConcurrent checks that lines of concurrent LineWriters sharing
// one Output around a plain bytes.Buffer never interleave.
func TestLineWriterConcurrent(t *testing.T) {
	var buf bytes.Buffer
	out := runtime.NewOutput(&buf)
	const writers, lines = 8, 200
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			lw := out.LineWriter(runtime.Prefix("app", fmt.Sprint(w)))
			defer lw.Close()
			line := strings.Repeat(fmt.Sprint(w), 100+w) + "\n"
			for range lines {
				// byte by byte, so every line spans many Write calls
				for i := range len(line) {
					lw.Write([]byte{line[i]})
				}
			}
		})
	}
	wg.Wait()
	got := strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n")
	if len(got) != writers*lines {
		t.Fatalf("got %d lines, want %d", len(got), writers*lines)
	}
	for _, l := range got {
		var w int
		if _, err := fmt.Sscanf(l, "[app/%d] ", &w); err != nil {
			t.Fatalf("malformed line %q", l)
		}
		if want := runtime.Prefix("app", fmt.Sprint(w)) + strings.Repeat(fmt.Sprint(w), 100+w); l != want {
			t.Fatalf("interleaved line %q", l)
		}
	}
}

type failWriter struct{ calls int }

func (f *failWriter) Write(p []byte) (int, error) {
	f.calls++
	return 0, errors.New("disk full")
}

func TestLineWriterDestinationError(t *testing.T) {
	var fw failWriter
	lw := runtime.NewLineWriter(&fw, "")
	for range 3 {
		if n, err := lw.Write([]byte("line\n")); n != 5 || err != nil {
			t.Fatalf("Write = %d, %v; want the handler never to see sink errors", n, err)
		}
	}
	if err := lw.Close(); err == nil || err.Error() != "disk full" {
		t.Errorf("Close = %v, want the first destination error", err)
	}
	if fw.calls != 1 {
		t.Errorf("destination called %d times after failing, want 1", fw.calls)
	}
	if _, err := lw.Write([]byte("x")); err == nil {
		t.Error("Write after Close succeeded")
	}
}

func TestSharedOutputs(t *testing.T) {
	var a, b bytes.Buffer
	if o1, o2 := runtime.SharedOutputs(&a, &a); o1 != o2 {
		t.Error("same writer: want one shared Output")
	}
	if o1, o2 := runtime.SharedOutputs(&a, &b); o1 == o2 {
		t.Error("different writers: want two Outputs")
	}
	o := runtime.NewOutput(&a)
	if runtime.NewOutput(o) != o {
		t.Error("NewOutput(*Output) must return it unchanged")
	}
}

func TestEnviron(t *testing.T) {
	req := runtime.Request{
		App: "users", Handler: "events.created", MessageID: "1-0", Attempt: 2,
		Env:  map[string]string{"TRACEPARENT": "00-abc", "SHARED": "request"},
		Spec: runtime.Spec{Env: map[string]string{"GREETING": "hi", "SHARED": "app", "RELAY_APP": "spoofed"}},
	}
	want := []string{
		"GREETING=hi",
		"RELAY_APP=users",
		"RELAY_ATTEMPT=2",
		"RELAY_HANDLER=events.created",
		"RELAY_MESSAGE_ID=1-0",
		"SHARED=request",
		"TRACEPARENT=00-abc",
	}
	if diff := cmp.Diff(want, runtime.Environ(req)); diff != "" {
		t.Errorf("Environ (-want +got):\n%s", diff)
	}
}
