package invocation_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay/invocation"
)

// ParseValue reads every stored form of docs/delivery.md#invocation-state
// and refuses anything else, naming it; Final agrees with it.
func TestParseValue(t *testing.T) {
	ok := []struct {
		v     string
		want  invocation.Value
		final bool
	}{
		{"running:1700000000000:2:tok", invocation.Value{State: invocation.StateRunning, Attempt: 2, Until: time.UnixMilli(1700000000000), Token: "tok"}, false},
		{"next_attempt_at:1700000000001:0:t", invocation.Value{State: invocation.StateWaiting, Until: time.UnixMilli(1700000000001), Token: "t"}, false},
		{"ok", invocation.Value{State: invocation.StateSucceeded}, true},
		{"exhausted:3:tok", invocation.Value{State: invocation.StateExhausted, Attempt: 3, Token: "tok"}, false},
		{"exhausted:3:tok:dlq", invocation.Value{State: invocation.StateDeadLettered, Attempt: 3, Token: "tok"}, true},
		{"superseded:1700000000000-4", invocation.Value{State: invocation.StateSuperseded, SupersededBy: "1700000000000-4"}, true},
	}
	for _, c := range ok {
		got, err := invocation.ParseValue(c.v)
		if err != nil || got != c.want {
			t.Errorf("ParseValue(%q) = %+v, %v; want %+v", c.v, got, err, c.want)
		}
		if f := invocation.Final(c.v); f != c.final {
			t.Errorf("Final(%q) = %v, want %v", c.v, f, c.final)
		}
	}
	for _, v := range []string{"", "OK", "running:1:2", "running:x:2:tok", "running:1:2:", "next_attempt_at:1:-1:t",
		"exhausted:3", "exhausted:3:tok:dl", "superseded:", "exhausted:a:tok:dlq"} {
		if got, err := invocation.ParseValue(v); err == nil {
			t.Errorf("ParseValue(%q) = %+v, want an error", v, got)
		}
		if invocation.Final(v) {
			t.Errorf("Final(%q) = true", v)
		}
	}
}
