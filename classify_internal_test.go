package relay

import (
	"testing"

	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/stream"
)

// TestClassifyAgreesWithIsEnvelope: the string test classify runs before
// schedule.IsEnvelope never turns away an envelope, escaped or not.
func TestClassifyAgreesWithIsEnvelope(t *testing.T) {
	for _, ev := range []string{
		`{"source":"relay.schedule"}`,
		`{"source":"relay\u002eschedule"}`,
		`{"\u0073ource":"relay.schedule"}`,
		`{"source":"relay.other"}`,
		`{"kind":"order","note":"relay.schedule"}`,
		`{"kind":"order"}`,
		`not json`,
	} {
		got := classify(stream.Message{Fields: map[string]string{"event": ev}}, 0).kind == classOccurrence
		if want := schedule.IsEnvelope([]byte(ev)); got != want {
			t.Errorf("classify(%s) is an occurrence: %v, schedule.IsEnvelope: %v", ev, got, want)
		}
	}
}
