package console

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
	"github.com/relaydev/relay/stream"
)

// maxSelection bounds how many entries one replay or remove takes.
const maxSelection = 500

func (s *Server) dlqRow(e dlq.Entry, now time.Time) dlqRow {
	e = cleanEntry(e)
	row := dlqRow{Entry: e, Age: now.Sub(e.Timestamp), Expires: "never"}
	if e.Timestamp.IsZero() {
		row.Age = 0
	}
	if s.cfg.DLQRetention > 0 {
		at := e.Expires(s.cfg.DLQRetention)
		switch {
		case at.IsZero():
			row.Expires = "-"
		case !at.After(now):
			row.Expires = "due"
		default:
			row.Expires = "in " + age(at.Sub(now))
		}
	}
	return row
}

// cleanEntry makes every text field valid UTF-8 for display.
func cleanEntry(e dlq.Entry) dlq.Entry {
	for _, p := range []*string{&e.OriginalStream, &e.OriginalID, &e.Group, &e.Consumer, &e.Reason, &e.App, &e.Handler, &e.Trace} {
		*p = clean(*p)
	}
	return e
}

type dlqEntryView struct {
	Stream    string
	Entry     dlq.Entry
	Row       dlqRow
	Event     string // pretty-printed
	Malformed bool
	Expires   time.Time
	// Replays is the entry's replay history; ReplaysProblem why it could
	// not be read.
	Replays        dlq.Replays
	ReplaysProblem string
	Back           string // the list page it came from, filter and all
}

func (s *Server) dlqEntry(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	id := r.FormValue("id")
	store := redisdlq.NewStore(s.redis(r.Context()), st)
	e, err := store.Get(r.Context(), id)
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("no dead-letter entry %s in %s: it was replayed or removed, or retention expired it", id, store.Key()))
		return
	case err != nil:
		if bad, ok := dlq.IsUndecodable(err); ok {
			s.fail(w, r, http.StatusUnprocessableEntity, fmt.Sprintf("entry %s cannot be decoded (%v); remove it from the list", bad, err))
			return
		}
		s.failRedis(w, r, err)
		return
	}
	row := s.dlqRow(e, time.Now())
	v := dlqEntryView{Stream: st, Entry: row.Entry, Row: row, Event: prettyEvent(e.Event), Back: backTo(r, st),
		Malformed: e.App == dlq.MalformedName || e.Handler == dlq.MalformedName}
	if s.cfg.DLQRetention > 0 {
		v.Expires = e.Expires(s.cfg.DLQRetention)
	}
	if h, err := store.Replays(r.Context(), id); err != nil {
		v.ReplaysProblem = clean(err.Error())
	} else {
		h.LastError = clean(h.LastError)
		v.Replays = h
	}
	s.renderPage(w, r, "dlq_entry", page{Title: "Dead letter " + id, Active: "dlq", Stream: st, Data: v})
}

// selection reads the entry ids of a replay or remove form.
func selection(r *http.Request) ([]string, error) {
	if err := r.ParseForm(); err != nil {
		return nil, err
	}
	ids := r.PostForm["id"]
	if len(ids) == 0 {
		return nil, errors.New("no entry selected: tick the entries to act on")
	}
	if len(ids) > maxSelection {
		return nil, fmt.Errorf("%d entries selected; at most %d at a time", len(ids), maxSelection)
	}
	seen := map[string]bool{}
	out := ids[:0:0]
	for _, id := range ids {
		if !stream.IsID(id) {
			return nil, fmt.Errorf("%q is not an entry id", clean(id))
		}
		if !seen[id] {
			seen[id] = true
			out = append(out, id)
		}
	}
	return out, nil
}

// resultRow is the outcome of replaying or removing one entry.
type resultRow struct {
	ID, Target string
	// Result is replayed, removed, failed or refused.
	Result   string
	Message  string
	Duration time.Duration
	// Replays is the entry's replay history after this replay, when it
	// was kept.
	Replays int64
}

type resultView struct {
	Stream  string
	Back    string // the list page it came from, filter and all
	Action  string // "Replay" or "Remove"
	At      time.Time
	Rows    []resultRow
	Done    int
	Stopped string // why the rest of a selection was not tried
}

// Summary is the result page's heading: "Replay of 3 entries: 1
// replayed, 2 kept".
func (v resultView) Summary() string {
	done := "replayed"
	if v.Action == "Remove" {
		done = "removed"
	}
	out := fmt.Sprintf("%s of %s: %d %s", v.Action, plural.Of(len(v.Rows), "entry"), v.Done, done)
	if kept := len(v.Rows) - v.Done; kept > 0 {
		out += fmt.Sprintf(", %d kept", kept)
	}
	return out
}

// showResult keeps v and redirects to its page (POST-redirect-GET).
func (s *Server) showResult(w http.ResponseWriter, r *http.Request, v resultView) {
	v.At = time.Now()
	id := s.results.put(v, v.At)
	http.Redirect(w, r, query("/dlq/result", "stream", v.Stream, "id", id), http.StatusSeeOther)
}

// dlqResult shows a replay's or remove's outcome; it never acts.
func (s *Server) dlqResult(w http.ResponseWriter, r *http.Request) {
	v, ok := s.results.get(r.FormValue("id"), time.Now())
	if !ok {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("this result is no longer kept (the console keeps the last %d for %s, in memory); "+
			"the dead letters show what is left", maxResults, resultTTL))
		return
	}
	s.renderPage(w, r, "result", page{Title: v.Action, Active: "dlq", Stream: v.Stream, Data: v})
}

// dlqReplay replays the selected entries one after another, as relay dlq
// replay does: Manual.Replay with the apps loaded now and the Runner the
// command wired; success deletes the entry, failure keeps it and adds to
// its replay history. It redirects to the result's page.
func (s *Server) dlqReplay(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	switch {
	case s.cfg.ReadOnly:
		s.fail(w, r, http.StatusForbidden, "the console runs read-only (--read-only): replay is off")
		return
	case s.cfg.Runner == nil:
		s.fail(w, r, http.StatusForbidden, "this console has no runner to replay with")
		return
	}
	ids, err := selection(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	// A closed browser tab must not abandon a handler half way.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), DefaultReplayTimeout)
	defer cancel()
	apps, err := s.cfg.Apps.Load(ctx)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "loading the apps failed: "+err.Error())
		return
	}
	store := redisdlq.NewStore(s.redis(ctx), st)
	v := resultView{Stream: st, Action: "Replay", Back: backTo(r, st)}
	for i, id := range ids {
		row, stop := s.replayOne(ctx, st, apps, store, id)
		v.Rows = append(v.Rows, row)
		if row.Result == "replayed" {
			v.Done++
		}
		if stop != "" {
			if rest := len(ids) - i - 1; rest > 0 {
				verb := "were"
				if rest == 1 {
					verb = "was"
				}
				v.Stopped = fmt.Sprintf("%s, so the other %s %s not tried", stop, plural.Of(rest, "entry"), verb)
			}
			break
		}
	}
	s.showResult(w, r, v)
}

// replayOne replays one entry; stop says why the rest of a selection
// would fail the same way (Redis or the runtime unreachable), "" when it
// would not.
func (s *Server) replayOne(ctx context.Context, stream string, apps *app.Set, store *redisdlq.Store, id string) (row resultRow, stop string) {
	row = resultRow{ID: id}
	// The replay itself may run for minutes, but reading the entry must
	// not wait that long for a Redis that is down: the client retries
	// reads until its context ends.
	gctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	e, err := store.Get(gctx, id)
	cancel()
	switch {
	case err == nil:
		row.Target = clean(e.App + "/" + e.Handler)
	case !errors.Is(err, dlq.ErrNotFound) && !errors.Is(err, dlq.ErrInvalidEntry):
		row.Result, row.Message = "failed", "reading the entry failed: "+clean(err.Error())+"; the entry is kept"
		return row, "Redis could not be read"
	}
	start := time.Now()
	err = manual.Invoker{Runner: s.cfg.Runner}.Replay(ctx, apps, store, id)
	row.Duration = time.Since(start).Round(time.Millisecond)
	switch {
	case err == nil:
		row.Result, row.Message = "replayed", "the handler succeeded; the entry is deleted"
	case errors.Is(err, manual.ErrReplayMalformed):
		row.Result, row.Message = "refused", "the entry records a malformed message: there is no handler to replay; remove it instead"
	case errors.Is(err, manual.ErrHandlerGone):
		row.Result, row.Message = "refused", "handler "+row.Target+" is not in the apps root any more; remove the entry instead"
	case errors.Is(err, manual.ErrAppUnavailable):
		row.Result, row.Message = "refused", "the app is unavailable, its template has errors (see Apps); the entry is kept"
	case errors.Is(err, dlq.ErrNotFound):
		row.Result, row.Message = "failed", "no such entry: it was replayed or removed meanwhile"
	case errors.Is(err, dlq.ErrInvalidEntry):
		// The entry, not the runtime, is at fault: the rest of a selection
		// is still tried.
		row.Result, row.Message = "refused", clean(err.Error())+": it cannot be replayed; remove it instead"
	default:
		row.Result = "failed"
		cause := errors.Unwrap(err) // the replay's own prefix repeats the id and target
		if cause == nil {
			cause = err
		}
		row.Message = clean(cause.Error()) + "; the entry is kept"
		if exit := (*runtime.ExitError)(nil); !errors.As(err, &exit) {
			stop = "the runtime could not run the handler"
		}
	}
	if (row.Result == "failed" || row.Result == "refused") && !errors.Is(err, dlq.ErrNotFound) {
		// The entry keeps the reason it was dead-lettered with; its history
		// says what the replays since met.
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		h, herr := store.RecordReplay(rctx, id, time.Now(), row.Result, row.Message, s.cfg.DLQRetention)
		cancel()
		if herr != nil {
			s.log.Warn("console: recording a replay failed", "stream", store.Key(), "id", id, "error", herr)
		}
		row.Replays = h.Count
	}
	if e.ID != "" && !errors.Is(err, dlq.ErrNotFound) {
		s.countReplay(ctx, stream, e, row)
	}
	s.log.Info("console: replay", "stream", store.Key(), "id", id, "target", row.Target, "result", row.Result, "replays", row.Replays)
	return row, stop
}

// Outcomes of the console's replays in the feed, beside a worker's
// (docs/console.md#pages): the Live page shows them.
const (
	outcomeReplayed     = "replayed"
	outcomeReplayFailed = "replay-failed"
)

// countReplay adds the replay of entry e, whose result is row, to the
// stream's counters (stats.Replays, stats.ReplayFailures) and to its
// feed, as consumer "console". The caller leaves out a replay that found
// the entry gone: it ran nothing.
func (s *Server) countReplay(ctx context.Context, stream string, e dlq.Entry, row resultRow) {
	ev := stats.Event{Time: time.Now(), Consumer: "console", MessageID: e.OriginalID, App: e.App, Handler: e.Handler,
		Attempt: e.HandlerAttempts + 1, Duration: row.Duration, Reason: row.Message, Result: row.Result}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.RequestTimeout)
	defer cancel()
	rec := redisstats.NewRecorder(s.redis(rctx), stream, s.cfg.Group)
	if row.Result == "replayed" {
		rec.Add(stats.Replays)
		ev.Outcome = outcomeReplayed
	} else {
		rec.Add(stats.ReplayFailures)
		ev.Outcome, ev.DLQID = outcomeReplayFailed, e.ID
	}
	rec.Record(ev)
	if err := rec.Flush(rctx); err != nil {
		s.log.Warn("console: counting a replay failed", "stream", stream, "id", e.ID, "error", err)
	}
}

const removedMsg = "deleted without running"

type confirmView struct {
	Stream string
	Back   string
	Rows   []dlqRow
	IDs    []string
}

// dlqRemove deletes the selected entries after a confirmation page, as
// relay dlq rm ID... does: all or nothing, an unknown id deletes none.
func (s *Server) dlqRemove(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	if s.cfg.ReadOnly {
		s.fail(w, r, http.StatusForbidden, "the console runs read-only (--read-only): remove is off")
		return
	}
	ids, err := selection(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	ctx := r.Context()
	store := redisdlq.NewStore(s.redis(ctx), st)
	now := time.Now()
	var rows []dlqRow
	var unknown []string
	for _, id := range ids {
		e, err := store.Get(ctx, id)
		switch {
		case errors.Is(err, dlq.ErrNotFound):
			unknown = append(unknown, id)
		case err != nil:
			if _, bad := dlq.IsUndecodable(err); !bad {
				s.failRedis(w, r, err)
				return
			}
			rows = append(rows, dlqRow{Entry: dlq.Entry{ID: id}, Problem: err.Error()})
		default:
			rows = append(rows, s.dlqRow(e, now))
		}
	}
	if len(unknown) > 0 {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("no dead-letter entry %s in %s; nothing deleted (replayed or removed meanwhile?)",
			strings.Join(unknown, ", "), store.Key()))
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		s.renderPage(w, r, "confirm", page{Title: "Remove dead letters?", Active: "dlq", Stream: st,
			Data: confirmView{Stream: st, Rows: rows, IDs: ids, Back: backTo(r, st)}})
		return
	}
	v := resultView{Stream: st, Action: "Remove", Back: backTo(r, st)}
	for _, row := range rows {
		res := resultRow{ID: row.ID, Target: row.App + "/" + row.Handler, Result: "removed", Message: removedMsg}
		if err := store.Delete(ctx, row.ID); errors.Is(err, dlq.ErrNotFound) {
			res.Message = "already gone (replayed or removed meanwhile)"
		} else if err != nil {
			res.Result, res.Message = "failed", err.Error()
		} else {
			v.Done++
		}
		v.Rows = append(v.Rows, res)
	}
	s.log.Info("console: remove", "stream", store.Key(), "removed", v.Done, "ids", removedIDs(v.Rows))
	s.showResult(w, r, v)
}

// removedIDs lists the ids a remove deleted, for its log line.
func removedIDs(rows []resultRow) []string {
	var ids []string
	for _, r := range rows {
		if r.Result == "removed" && r.Message == removedMsg {
			ids = append(ids, r.ID)
		}
	}
	return ids
}
