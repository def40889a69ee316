package redisstream_test

import (
	"testing"
	"time"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/stream/redisstream"
)

// TestSourceContract runs the shared relay.StreamSource suite against Source
// on the shared redis-server, each sub-test on a stream and group of its
// own. PEL idle time runs on the server's clock.
func TestSourceContract(t *testing.T) {
	t.Parallel()
	c := redistest.Client(t)
	now := func(t *testing.T) time.Time { return redistest.ServerTime(t, c) }
	relaytest.TestStreamSource(t, func(t *testing.T) relaytest.StreamSourceHarness {
		name, group := relaytest.UniqueName(t), "group"
		return relaytest.StreamSourceHarness{
			Publish: func(t *testing.T, fields map[string]string) string {
				t.Helper()
				id, err := redisstream.New(c, name, group, "producer").Publish(t.Context(), fields)
				if err != nil {
					t.Fatal(err)
				}
				return id
			},
			Consumer: func(t *testing.T, consumer string) relay.StreamSource {
				t.Helper()
				s := redisstream.New(c, name, group, consumer, redisstream.WithBlock(20*time.Millisecond))
				if err := s.EnsureGroup(t.Context()); err != nil {
					t.Fatal(err)
				}
				return s
			},
			Ack: func(t *testing.T, ids ...string) {
				t.Helper()
				if err := c.Do(t.Context(), c.B().Xack().Key(name).Group(group).Id(ids...).Build()).Error(); err != nil {
					t.Fatalf("XACK: %v", err)
				}
			},
			Delete: func(t *testing.T, ids ...string) {
				t.Helper()
				if err := c.Do(t.Context(), c.B().Xdel().Key(name).Id(ids...).Build()).Error(); err != nil {
					t.Fatalf("XDEL: %v", err)
				}
			},
			Advance: relaytest.AdvanceByPolling(now),
			Short:   250 * time.Millisecond,
		}
	})
}
