package warm

import (
	"bytes"
	"testing"
)

// TestDemux feeds a stream byte-split in every possible way and checks that
// the handler's output reaches the invocation's writer intact, that only the
// frame with the current token is taken out of the stream, and that output
// after the frame goes to the idle writer.
func TestDemux(t *testing.T) {
	token := "relay-frame-0123456789abcdef"
	fake := "relay-frame-ffffffffffffffff {\"code\": 0}\n" // an earlier token
	handler := "line one\nrelay-frame-01 looks like the start\n" + fake + "partial"
	stream := handler + token + " {\"code\": 1}\nlater\n"
	for split := 0; split <= len(stream); split++ {
		for step := 1; step <= 3; step++ {
			var inv, idle bytes.Buffer
			d := newDemux(&idle)
			done := d.begin(token, &inv)
			d.Write([]byte(stream[:split]))
			for rest := stream[split:]; len(rest) > 0; {
				n := min(step, len(rest))
				if n, err := d.Write([]byte(rest[:n])); err != nil || n == 0 {
					t.Fatalf("Write = %d, %v", n, err)
				}
				rest = rest[n:]
			}
			select {
			case payload := <-done:
				if code, _, err := parseOutcome(payload); err != nil || code != 1 {
					t.Fatalf("split %d step %d: outcome %q: %d, %v", split, step, payload, code, err)
				}
			default:
				t.Fatalf("split %d step %d: no frame", split, step)
			}
			if inv.String() != handler {
				t.Fatalf("split %d step %d: invocation output %q, want %q", split, step, inv.String(), handler)
			}
			if idle.String() != "later\n" {
				t.Fatalf("split %d step %d: idle output %q", split, step, idle.String())
			}
		}
	}
}

// TestDemuxEnd: output held back as a possible token start is not lost when
// the invocation ends without a frame.
func TestDemuxEnd(t *testing.T) {
	var inv, idle bytes.Buffer
	d := newDemux(&idle)
	d.begin("relay-frame-abc", &inv)
	d.Write([]byte("out relay-fr"))
	d.end()
	d.Write([]byte("ame-abc\n"))
	if inv.String() != "out relay-fr" || idle.String() != "ame-abc\n" {
		t.Fatalf("invocation %q, idle %q", inv.String(), idle.String())
	}
}

func TestParseOutcome(t *testing.T) {
	for _, bad := range []string{"", "{}", "nonsense", `{"code": "1"}`} {
		if _, _, err := parseOutcome([]byte(bad)); err == nil {
			t.Errorf("parseOutcome(%q) succeeded", bad)
		}
	}
	for payload, want := range map[string]struct {
		code  int
		clean bool
	}{
		`{"code": 3, "clean": true}`:  {3, true},
		`{"code": 0, "clean": false}`: {0, false},
		`{"code": 0}`:                 {0, false}, // a bootstrap that does not clean up
	} {
		code, clean, err := parseOutcome([]byte(payload))
		if err != nil || code != want.code || clean != want.clean {
			t.Errorf("parseOutcome(%s) = %d, %v, %v; want %d, %v", payload, code, clean, err, want.code, want.clean)
		}
	}
}
