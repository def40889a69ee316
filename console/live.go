package console

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	relaystream "github.com/relaydev/relay/stream"
)

// Live tail settings.
const (
	// liveBacklog is how many feed events the live page starts with.
	liveBacklog = 50
	// liveBlock is how long one feed read waits; the stream then sends a
	// keep-alive comment, so proxies and the browser keep it open.
	liveBlock = 5 * time.Second
)

type liveView struct {
	Stream  string
	Events  []feedEvent
	Problem string
}

// feedEvent is one outcome as the live page and its event stream show it.
type feedEvent struct {
	ID        string `json:"id"`
	Time      string `json:"time"`
	Stream    string `json:"stream"`
	MessageID string `json:"message_id"`
	Target    string `json:"target"`
	Outcome   string `json:"outcome"`
	Attempt   string `json:"attempt"`
	Duration  string `json:"duration"`
	Reason    string `json:"reason"`
	Consumer  string `json:"consumer"`
	EventURL  string `json:"event_url"`
	DLQURL    string `json:"dlq_url,omitempty"`
}

func toFeedEvent(stream string, ev stats.Event) feedEvent {
	f := feedEvent{ID: ev.ID, Time: ev.Time.UTC().Format("15:04:05"), Stream: stream, MessageID: clean(ev.MessageID),
		Target: clean(ev.App + "/" + ev.Handler), Outcome: clean(ev.Outcome), Reason: clean(ev.Reason),
		Consumer: clean(ev.Consumer), Duration: ev.Duration.Round(time.Millisecond).String()}
	if ev.Attempt > 0 {
		f.Attempt = fmt.Sprint(ev.Attempt)
		if ev.MaxAttempts > 0 {
			f.Attempt += " of " + fmt.Sprint(ev.MaxAttempts)
		}
	}
	if relaystream.IsID(ev.MessageID) {
		f.EventURL = query("/event", "stream", stream, "id", ev.MessageID)
	}
	if relaystream.IsID(ev.DLQID) {
		f.DLQURL = query("/dlq/entry", "stream", stream, "id", ev.DLQID)
	}
	return f
}

// live renders the newest outcomes of the feed; live.js then appends what
// /live/events sends.
func (s *Server) live(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	v := liveView{Stream: st}
	evs, err := redisstats.LatestFeed(r.Context(), s.redis(r.Context()), st, s.cfg.Group, liveBacklog)
	if err != nil {
		v.Problem = err.Error()
	}
	for _, ev := range evs {
		v.Events = append(v.Events, toFeedEvent(st, ev))
	}
	s.renderPage(w, r, "live", page{Title: "Live", Stream: st, Data: v})
}

// liveEvents is a server-sent event stream of the feed's new outcomes,
// one "outcome" event (JSON of feedEvent) each, from the entry after
// ?after= (or Last-Event-ID when the browser reconnects), else from now.
func (s *Server) liveEvents(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		http.Error(w, "no such stream in this console", http.StatusNotFound)
		return
	}
	after := "$"
	if id := r.Header.Get("Last-Event-ID"); relaystream.IsID(id) {
		after = id
	} else if id := r.FormValue("after"); relaystream.IsID(id) {
		after = id
	}
	fl, ok := w.(http.Flusher)
	if !ok {
		http.Error(w, "streaming unsupported", http.StatusInternalServerError)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	fmt.Fprint(w, ": relay console live feed\nretry: 3000\n\n")
	fl.Flush()
	ctx := r.Context()
	failing := false
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, liveBlock+s.cfg.RequestTimeout)
		evs, err := redisstats.ReadFeed(rctx, s.redis(rctx), st, s.cfg.Group, after, 100, liveBlock)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			failing = true
			fmt.Fprintf(w, "event: problem\ndata: %s\n\n", jsonString(err.Error()))
			fl.Flush()
			select {
			case <-ctx.Done():
				return
			case <-time.After(liveBlock):
			}
			continue
		}
		if failing {
			// The page's badge turns from the error back to live.
			failing = false
			fmt.Fprint(w, "event: recovered\ndata: {}\n\n")
		}
		for _, ev := range evs {
			b, _ := json.Marshal(toFeedEvent(st, ev))
			fmt.Fprintf(w, "id: %s\nevent: outcome\ndata: %s\n\n", ev.ID, b)
			after = ev.ID
		}
		if len(evs) == 0 {
			fmt.Fprint(w, ": keep-alive\n\n")
			if after == "$" {
				// Pin the position, so an outcome added between two
				// blocking reads is not missed.
				if last, err := redisstats.LatestFeed(ctx, s.redis(ctx), st, s.cfg.Group, 1); err == nil && len(last) == 1 {
					after = last[0].ID
				}
			}
		}
		fl.Flush()
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
