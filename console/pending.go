package console

import (
	"context"
	"errors"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/keys"
	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream"
	"github.com/relaydev/relay/stream/redisstream"
)

// feedScan is how many of the newest feed events the pending page reads
// for each invocation's last error (the feed keeps about stats.FeedLength).
const feedScan = stats.FeedLength

// pendingRow is one pending message.
type pendingRow struct {
	ID          string
	Consumer    string
	Idle        time.Duration
	Deliveries  int64
	Invocations []invocationView
	// NoState: the message has no invocation state: no invocation was
	// claimed yet (it waits for a slot, or its worker died first).
	NoState bool
	// Held are the holds of apps whose rules cannot be read: they keep
	// every message pending, whatever its invocations.
	Held []holdView
	// FullSlots are the apps whose slots are all taken on the message's
	// worker: for a message without state, what it may wait for.
	FullSlots []slotView
}

// invocationView is one invocation of a pending message, from its field
// in the invocation hash (docs/delivery.md#invocation-state).
type invocationView struct {
	Field string // app/handler, to show
	Key   string // the hash field as stored
	// State is running, waiting, succeeded, exhausted, dead-lettered or
	// unknown (a value this console does not know).
	State string
	// Until is the running lease's end or the next attempt's due time.
	Until       time.Time
	Attempt     int
	MaxAttempts int // 0 when the app or rule is gone
	// LastError is the newest failure of this invocation that the sampled
	// feed holds, "" when it holds none.
	LastError string
	LastAt    time.Time
	Raw       string
	// DLQURL is the page of the dead-letter entry of a dead-lettered
	// invocation, "" when unknown.
	DLQURL string
	// Held is set when the invocation's app is unavailable: it waits for
	// the app, not for a retry.
	Held *holdView
	// Run is the attempt a worker runs now for a running invocation, as
	// the workers published it; nil when none did.
	Run *runView
	// Slots is set when the invocation is not running and its app's
	// slots are all taken on the message's worker: it waits for a slot.
	Slots *slotView
}

type pendingView struct {
	Stream string
	// Counted says Count and Oldest were read: without them the page
	// shows no count, rather than "0 messages" (Redis down).
	Counted bool
	Count   int64
	Oldest  time.Duration
	Rows    []pendingRow
	// Holds say why the workers hold messages of the stream; Workers is
	// all they publish, LostRuns the attempts they run for messages no
	// longer pending (no row shows them).
	Holds    []holdView
	Workers  workersView
	LostRuns []runView
	After    string
	Next     string
	Problem  string
	Now      time.Time
}

func (s *Server) pending(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	after := r.FormValue("after")
	if after != "" && !stream.IsID(after) {
		s.fail(w, r, http.StatusBadRequest, "after: not a stream id")
		return
	}
	v, err := s.pendingPage(r.Context(), st, after)
	if err != nil {
		v.Problem = err.Error()
	}
	s.renderPage(w, r, "pending", page{Title: "Pending", Stream: st, Data: v})
}

// pendingPage reads one page of the PEL after the cursor (XPENDING with a
// range and COUNT), the invocation hash of each message in one pipeline,
// and the feed's newest events for the last errors.
func (s *Server) pendingPage(ctx context.Context, st, after string) (pendingView, error) {
	v := pendingView{Stream: st, After: after, Now: time.Now()}
	rc := s.redis(ctx)
	var err error
	v.Count, v.Oldest, err = redisstream.New(rc, st, s.cfg.Group, "relay-console").Pending(ctx)
	if errors.Is(err, stream.ErrNoGroup) {
		return v, errors.New("consumer group " + s.cfg.Group + " does not exist on stream " + st)
	}
	if err != nil {
		return v, err
	}
	v.Counted = true
	if v.Workers, err = s.readWorkers(ctx, rc, st, v.Count); err != nil {
		return v, err
	}
	v.Holds, v.LostRuns = v.Workers.Holds, v.Workers.lostRuns()
	if v.Rows, v.Next, err = s.pendingRows(ctx, rc, st, after); err != nil || len(v.Rows) == 0 {
		return v, err
	}
	if err := s.addInvocations(ctx, rc, st, v.Rows); err != nil {
		return v, err
	}
	markHeld(v.Rows, v.Holds)
	markRuns(v.Rows, v.Workers)
	return v, nil
}

// markRuns adds to the pending rows what the workers publish: the
// attempt each running invocation is, and the full slots that an
// invocation not running, or a message without state, waits for.
func markRuns(rows []pendingRow, w workersView) {
	for i := range rows {
		row := &rows[i]
		if row.NoState {
			row.FullSlots = w.fullOn(row.Consumer)
		}
		for j := range row.Invocations {
			iv := &row.Invocations[j]
			switch {
			case iv.State == "running":
				iv.Run = w.run(row.ID, iv.Key)
			case !iv.finished() && iv.Held == nil:
				name, _, _ := strings.Cut(iv.Key, "/")
				iv.Slots = w.full(row.Consumer, name)
			}
		}
	}
}

// pendingRows reads a page of the PEL after the cursor; next is the
// cursor of the following page, "" at the end.
func (s *Server) pendingRows(ctx context.Context, rc rueidis.Client, st, after string) (rows []pendingRow, next string, err error) {
	start := "-"
	if after != "" {
		start = "(" + after
	}
	size := s.cfg.PageSize
	entries, err := rc.Do(ctx, rc.B().Xpending().Key(st).Group(s.cfg.Group).Start(start).End("+").Count(int64(size+1)).Build()).ToArray()
	if err != nil {
		return nil, "", err
	}
	more := len(entries) > size
	if more {
		entries = entries[:size]
	}
	for _, e := range entries {
		f, err := e.ToArray()
		if err != nil || len(f) < 4 {
			continue
		}
		var row pendingRow
		row.ID, _ = f[0].ToString()
		row.Consumer, _ = f[1].ToString()
		row.Consumer = clean(row.Consumer)
		idle, _ := f[2].AsInt64()
		row.Idle = time.Duration(idle) * time.Millisecond
		row.Deliveries, _ = f[3].AsInt64()
		rows = append(rows, row)
	}
	if more && len(rows) > 0 {
		next = rows[len(rows)-1].ID
	}
	return rows, next, nil
}

// addInvocations reads the invocation hash of each row in one pipeline
// and adds its invocations, with the last error the feed holds.
func (s *Server) addInvocations(ctx context.Context, rc rueidis.Client, st string, rows []pendingRow) error {
	cmds := make([]rueidis.Completed, 0, len(rows))
	for _, row := range rows {
		cmds = append(cmds, rc.B().Hgetall().Key(keys.Invocation(st, s.cfg.Group, row.ID)).Build())
	}
	hashes := rc.DoMulti(ctx, cmds...)
	apps, _ := s.cfg.Apps.Load(ctx) // without apps, attempts show no maximum
	lastErr := s.lastErrors(ctx, rc, st)
	for i := range rows {
		row := &rows[i]
		m, err := hashes[i].AsStrMap()
		if err != nil {
			return err
		}
		for field, val := range m {
			if strings.HasPrefix(field, "__") {
				continue
			}
			iv := parseInvocation(field, val)
			iv.MaxAttempts = maxAttempts(apps, field)
			if ev, ok := lastErr[row.ID+" "+field]; ok {
				iv.LastError, iv.LastAt = clean(ev.Reason), ev.Time
			}
			row.Invocations = append(row.Invocations, iv)
		}
		sort.Slice(row.Invocations, func(a, b int) bool { return row.Invocations[a].Field < row.Invocations[b].Field })
		row.NoState = len(row.Invocations) == 0
	}
	return nil
}

// lastErrors is the newest failure in the sampled feed of each message
// and handler, keyed "<message-id> <app>/<handler>".
func (s *Server) lastErrors(ctx context.Context, rc rueidis.Client, st string) map[string]stats.Event {
	feed, _ := redisstats.LatestFeed(ctx, rc, st, s.cfg.Group, feedScan)
	lastErr := map[string]stats.Event{}
	for _, ev := range feed { // newest first: keep the first seen
		if ev.Outcome == "succeeded" {
			continue
		}
		k := ev.MessageID + " " + ev.App + "/" + ev.Handler
		if _, ok := lastErr[k]; !ok {
			lastErr[k] = ev
		}
	}
	return lastErr
}

// parseInvocation reads one field of the invocation hash
// (docs/delivery.md#invocation-state), through invocation.ParseValue.
func parseInvocation(field, val string) invocationView {
	v := invocationView{Field: clean(field), Key: field, State: "unknown", Raw: clean(val)}
	p, err := invocation.ParseValue(val)
	if err != nil {
		return v
	}
	v.State, v.Attempt = p.State.String(), p.Attempt
	if p.State == invocation.StateRunning || p.State == invocation.StateWaiting {
		v.Until = p.Until
	}
	return v
}

// maxAttempts is the attempts the invocation's rule (or, for a schedule
// occurrence, its schedule) allows now; 0 when unknown.
func maxAttempts(apps *app.Set, field string) int {
	if apps == nil {
		return 0
	}
	appName, handler, ok := strings.Cut(field, "/")
	if !ok {
		return 0
	}
	a := apps.Get(appName)
	if a == nil {
		return 0
	}
	if i := a.RuleIndex(handler); i >= 0 {
		return a.Rules[i].Retries + 1
	}
	for _, sc := range a.Schedules {
		if sc.Handler == handler {
			return sc.Retries + 1
		}
	}
	return 0
}
