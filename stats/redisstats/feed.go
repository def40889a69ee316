package redisstats

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/stats"
)

// maxReason bounds an outcome's reason in the feed.
const maxReason = 300

// feedBuffer holds the events of one flush interval.
type feedBuffer struct {
	mu      sync.Mutex
	events  []stats.Event
	dropped int
}

// Record adds ev to the feed with the next flush, unless stats.FeedBurst
// events are waiting already. A nil Recorder records nothing.
func (r *Recorder) Record(ev stats.Event) {
	if r == nil {
		return
	}
	r.feed.mu.Lock()
	defer r.feed.mu.Unlock()
	if len(r.feed.events) >= stats.FeedBurst {
		r.feed.dropped++
		return
	}
	if i := strings.IndexByte(ev.Reason, '\n'); i >= 0 {
		ev.Reason = ev.Reason[:i]
	}
	if len(ev.Reason) > maxReason {
		ev.Reason = ev.Reason[:maxReason] + "…"
	}
	r.feed.events = append(r.feed.events, ev)
}

// takeFeed returns the XADDs of the events waiting, and forgets them.
func (r *Recorder) takeFeed() rueidis.Commands {
	r.feed.mu.Lock()
	events := r.feed.events
	r.feed.events, r.feed.dropped = nil, 0
	r.feed.mu.Unlock()
	cmds := make(rueidis.Commands, 0, len(events))
	for _, ev := range events {
		fv := r.client.B().Xadd().Key(r.feedKey).Maxlen().Almost().Threshold(strconv.Itoa(stats.FeedLength)).Id("*").FieldValue().
			FieldValue("time", strconv.FormatInt(ev.Time.UnixMilli(), 10)).
			FieldValue("consumer", ev.Consumer).
			FieldValue("message_id", ev.MessageID).
			FieldValue("app", ev.App).
			FieldValue("handler", ev.Handler).
			FieldValue("outcome", ev.Outcome).
			FieldValue("result", ev.Result).
			FieldValue("attempt", strconv.Itoa(ev.Attempt)).
			FieldValue("max_attempts", strconv.Itoa(ev.MaxAttempts)).
			FieldValue("duration_ms", strconv.FormatInt(ev.Duration.Milliseconds(), 10)).
			FieldValue("reason", ev.Reason).
			FieldValue("dlq_id", ev.DLQID)
		cmds = append(cmds, fv.Build())
	}
	return cmds
}

// ReadFeed returns up to count feed events of stream and group after the
// entry id after ("$" for only new ones, "0" for everything kept), waiting
// up to block for one to arrive (0 does not wait). It returns the events
// in order; the last one's ID is where the next call goes on.
func ReadFeed(ctx context.Context, client rueidis.Client, stream, group, after string, count int, block time.Duration) ([]stats.Event, error) {
	key := keys.Feed(stream, group)
	var cmd rueidis.Completed
	if block > 0 {
		// A reader that goes away (a closed console tab, a stop) ends the
		// wait at once; the client then unblocks the connection (CLIENT
		// UNBLOCK) or, without that permission, closes it.
		cmd = client.B().Xread().Count(int64(count)).Block(block.Milliseconds()).Streams().Key(key).Id(after).Build().UnblockOnCancel()
	} else {
		cmd = client.B().Xread().Count(int64(count)).Streams().Key(key).Id(after).Build()
	}
	res, err := client.Do(ctx, cmd).AsXRead()
	if rueidis.IsRedisNil(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read feed %s: %w", key, err)
	}
	var out []stats.Event
	for _, e := range res[key] {
		out = append(out, decodeEvent(e.ID, e.FieldValues))
	}
	return out, nil
}

// LatestFeed returns the newest count events, newest first (XREVRANGE).
func LatestFeed(ctx context.Context, client rueidis.Client, stream, group string, count int) ([]stats.Event, error) {
	key := keys.Feed(stream, group)
	res, err := client.Do(ctx, client.B().Xrevrange().Key(key).End("+").Start("-").Count(int64(count)).Build()).AsXRange()
	if err != nil {
		return nil, fmt.Errorf("read feed %s: %w", key, err)
	}
	out := make([]stats.Event, 0, len(res))
	for _, e := range res {
		out = append(out, decodeEvent(e.ID, e.FieldValues))
	}
	return out, nil
}

func decodeEvent(id string, f map[string]string) stats.Event {
	atoi := func(s string) int { n, _ := strconv.Atoi(s); return n }
	ms, _ := strconv.ParseInt(f["time"], 10, 64)
	dur, _ := strconv.ParseInt(f["duration_ms"], 10, 64)
	return stats.Event{
		ID: id, Time: time.UnixMilli(ms).UTC(), Consumer: f["consumer"], MessageID: f["message_id"],
		App: f["app"], Handler: f["handler"], Outcome: f["outcome"], Result: f["result"],
		Attempt: atoi(f["attempt"]), MaxAttempts: atoi(f["max_attempts"]),
		Duration: time.Duration(dur) * time.Millisecond, Reason: f["reason"], DLQID: f["dlq_id"],
	}
}
