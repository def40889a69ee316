// Command latency measures end-to-end latency (XADD → XACK) of a running
// relay worker: it publishes events one at a time and polls the consumer
// group until each is acknowledged.
//
//	go run ./bench/latency -redis 127.0.0.1:6390 -stream events -group relay -n 50 \
//	    -event '{"event_name":"INSERT","table_name":"users","new_image":{"id":1}}'
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stream"
)

func main() {
	addr := flag.String("redis", "127.0.0.1:6390", "Redis address")
	streamName := flag.String("stream", "events", "stream the worker consumes")
	group := flag.String("group", "relay", "the worker's consumer group")
	n := flag.Int("n", 50, "events to publish, one at a time")
	event := flag.String("event", `{"event_name":"INSERT","table_name":"users","new_image":{"id":1}}`, "event JSON")
	flag.Parse()
	if err := run(*addr, *streamName, *group, *n, *event); err != nil {
		fmt.Fprintln(os.Stderr, "latency:", err)
		os.Exit(1)
	}
}

func run(addr, streamName, group string, n int, event string) error {
	ctx := context.Background()
	c, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return err
	}
	defer c.Close()
	var lat []time.Duration
	for range n {
		start := time.Now()
		id, err := c.Do(ctx, c.B().Xadd().Key(streamName).Id("*").FieldValue().FieldValue("event", event).Build()).ToString()
		if err != nil {
			return err
		}
		for {
			if time.Since(start) > time.Minute {
				return fmt.Errorf("%s not acknowledged within a minute", id)
			}
			if acked(ctx, c, streamName, group, id) {
				break
			}
			time.Sleep(time.Millisecond)
		}
		lat = append(lat, time.Since(start))
	}
	slices.Sort(lat)
	pct := func(p float64) time.Duration { return lat[min(len(lat)-1, int(p*float64(len(lat))))] }
	fmt.Printf("events=%d p50=%s p90=%s p99=%s max=%s\n", n, pct(0.5).Round(time.Millisecond),
		pct(0.9).Round(time.Millisecond), pct(0.99).Round(time.Millisecond), lat[len(lat)-1].Round(time.Millisecond))
	return nil
}

// acked reports whether id was delivered to group and is no longer pending.
func acked(ctx context.Context, c rueidis.Client, streamName, group, id string) bool {
	groups, err := c.Do(ctx, c.B().XinfoGroups().Key(streamName).Build()).ToArray()
	if err != nil {
		return false
	}
	for _, g := range groups {
		m, err := g.AsMap()
		if err != nil {
			continue
		}
		name, last := m["name"], m["last-delivered-id"]
		if s, _ := name.ToString(); s != group {
			continue
		}
		if l, _ := last.ToString(); stream.CompareID(l, id) < 0 {
			return false
		}
		pending, err := c.Do(ctx, c.B().Xpending().Key(streamName).Group(group).Start(id).End(id).Count(1).Build()).ToArray()
		return err == nil && len(pending) == 0
	}
	return false
}
