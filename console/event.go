package console

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stream"
)

type fieldView struct{ Name, Value string }

type eventView struct {
	Stream      string
	ID          string
	Found       bool
	Fields      []fieldView // every field but event, sorted
	Event       string      // pretty-printed
	Invocations []invocationView
	Pending     bool
	Consumer    string
	Deliveries  int64
	Idle        time.Duration
	Now         time.Time
}

// event shows one entry of a source stream: every field, its event
// pretty-printed, whether it is pending and its invocation state.
func (s *Server) event(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	id := r.FormValue("id")
	if !stream.IsID(id) {
		s.fail(w, r, http.StatusBadRequest, "id: not a stream id")
		return
	}
	v := eventView{Stream: st, ID: id, Now: time.Now()}
	ctx := r.Context()
	raw, found, err := s.streamEntry(ctx, st, id)
	if err != nil {
		s.failRedis(w, r, err)
		return
	}
	v.Found = found
	for k, val := range raw {
		if k == "event" {
			v.Event = prettyEvent(val)
			continue
		}
		v.Fields = append(v.Fields, fieldView{clean(k), clean(val)})
	}
	sort.Slice(v.Fields, func(i, j int) bool { return v.Fields[i].Name < v.Fields[j].Name })
	rc := s.redis(ctx)
	b := rc.B()
	res := rc.DoMulti(ctx,
		b.Xpending().Key(st).Group(s.cfg.Group).Start(id).End(id).Count(1).Build(),
		b.Hgetall().Key(keys.Invocation(st, s.cfg.Group, id)).Build())
	if pe, err := res[0].ToArray(); err == nil && len(pe) == 1 {
		if f, err := pe[0].ToArray(); err == nil && len(f) >= 4 {
			v.Pending = true
			v.Consumer, _ = f[1].ToString()
			v.Consumer = clean(v.Consumer)
			idle, _ := f[2].AsInt64()
			v.Idle = time.Duration(idle) * time.Millisecond
			v.Deliveries, _ = f[3].AsInt64()
		}
	}
	if m, err := res[1].AsStrMap(); err == nil {
		apps, _ := s.cfg.Apps.Load(ctx)
		for field, val := range m {
			if strings.HasPrefix(field, "__") {
				continue
			}
			iv := parseInvocation(field, val)
			iv.MaxAttempts = maxAttempts(apps, field)
			v.Invocations = append(v.Invocations, iv)
		}
		sort.Slice(v.Invocations, func(i, j int) bool { return v.Invocations[i].Field < v.Invocations[j].Field })
		linkDeadLetters(st, m, v.Invocations)
	}
	s.renderPage(w, r, "event", page{Title: "Event " + id, Active: "pending", Stream: st, Data: v})
}

// streamEntry reads one entry of a stream by id (XRANGE id id).
func (s *Server) streamEntry(ctx context.Context, st, id string) (map[string]string, bool, error) {
	rc := s.redis(ctx)
	res, err := rc.Do(ctx, rc.B().Xrange().Key(st).Start(id).End(id).Count(1).Build()).AsXRange()
	if err != nil {
		return nil, false, err
	}
	if len(res) == 0 {
		return nil, false, nil
	}
	return res[0].FieldValues, true, nil
}

// linkDeadLetters links each dead-lettered invocation to its DLQ entry,
// whose id the message's state m keeps beside it (invocation.DLQField).
func linkDeadLetters(st string, m map[string]string, invs []invocationView) {
	for i, iv := range invs {
		if iv.State != "dead-lettered" {
			continue
		}
		if entry := m[invocation.DLQField(iv.Key)]; stream.IsID(entry) {
			invs[i].DLQURL = query("/dlq/entry", "stream", st, "id", entry)
		}
	}
}
