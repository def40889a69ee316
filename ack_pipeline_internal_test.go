package relay

import (
	"testing"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

// wrappedSource hides the concrete source type, as a user's wrapper does.
type wrappedSource struct{ StreamSource }

// uncomparable is a client of a type that cannot be compared with ==.
type uncomparable struct {
	rueidis.Client
	_ []int
}

// TestPipelinedAckOnlyForOneClient: the Engine acknowledges through the
// state store's pipelined XACK+retain only when the source is a
// stream.Source of the Engine's stream and group on the store's own
// client; any other pairing keeps Source.Ack and Retain.
func TestPipelinedAckOnlyForOneClient(t *testing.T) {
	c, other := redistest.Client(t), redistest.Client(t)
	src := stream.New(c, "s", "g", "c1")
	cases := []struct {
		name string
		c    Components
		want bool
	}{
		{"same client", Components{Source: src, State: invocation.New(c), Stream: "s", Group: "g"}, true},
		{"another client", Components{Source: src, State: invocation.New(other), Stream: "s", Group: "g"}, false},
		{"another stream", Components{Source: src, State: invocation.New(c), Stream: "t", Group: "g"}, false},
		{"another group", Components{Source: src, State: invocation.New(c), Stream: "s", Group: "h"}, false},
		{"wrapped source", Components{Source: wrappedSource{src}, State: invocation.New(c), Stream: "s", Group: "g"}, false},
		{"uncomparable client", Components{
			Source: stream.New(uncomparable{Client: c}, "s", "g", "c1"),
			State:  invocation.New(uncomparable{Client: c}), Stream: "s", Group: "g"}, false},
	}
	for _, tc := range cases {
		if got := pipelinedAck(tc.c) != nil; got != tc.want {
			t.Errorf("%s: pipelined = %v, want %v", tc.name, got, tc.want)
		}
	}
}

var _ ackRetainer = (*invocation.Store)(nil)
var _ boundedReclaimer = (*stream.Source)(nil)
