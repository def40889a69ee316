package relay

import (
	"context"
	"testing"

	"github.com/relaydev/relay/schedule"
	"github.com/relaydev/relay/stream"
)

// TestDecodeAgreesWithIsEnvelope: the string test decode runs before
// schedule.IsEnvelope never turns away an envelope, escaped or not.
func TestDecodeAgreesWithIsEnvelope(t *testing.T) {
	for _, ev := range []string{
		`{"source":"relay.schedule"}`,
		`{"source":"relay\u002eschedule"}`,
		`{"\u0073ource":"relay.schedule"}`,
		`{"source":"relay.other"}`,
		`{"kind":"order","note":"relay.schedule"}`,
		`{"kind":"order"}`,
		`not json`,
	} {
		p := &pipeline{obs: observers{}}
		d := &delivery{msg: stream.Message{Fields: map[string]string{"event": ev}}}
		got := p.decode(context.Background(), d).kind == entryOccurrence
		if want := schedule.IsEnvelope([]byte(ev)); got != want {
			t.Errorf("decode(%s) is an occurrence: %v, schedule.IsEnvelope: %v", ev, got, want)
		}
	}
}
