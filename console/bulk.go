package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/stream"
)

// Bulk action settings (docs/console.md#pages).
const (
	// bulkMax is the most entries one "replay/remove all matching" takes:
	// its count must be exact, so it reads at most this many.
	bulkMax = searchWindow
	// bulkBatch is how many entries a bulk action reads at a time.
	bulkBatch = 100
	// maxJobs is how many bulk actions the console keeps, newest.
	maxJobs = 50
	// jobGroups is how many reasons a bulk action lists the entries it
	// kept by; the entries of further reasons count in one more row.
	jobGroups = 100
	// groupIDs is how many of the newest entries each reason links.
	groupIDs = 5
)

// keptGroup is the entries a bulk action kept for one reason: one
// app/handler, result and message (docs/console.md#pages).
type keptGroup struct {
	Target, Result, Message string
	Count                   int
	// Newest are the newest entries of the group, newest first.
	Newest []string
	// Other marks the row of every reason beyond jobGroups.
	Other bool
}

// job is one "replay/remove all matching", run in the background in
// batches; its page shows its progress and stops it.
type job struct {
	ID, Stream, Action, Filter, Back string
	Total                            int

	mu       sync.Mutex
	done     int // entries tried
	ok       int // replayed or removed
	groups   []keptGroup
	stop     bool
	stopped  string // why it ended early, "" when it did not
	finished bool
	started  time.Time
	ended    time.Time
}

// jobView is a snapshot of a job for its page.
type jobView struct {
	ID, Stream, Action, Filter, Back string
	Total, Done, OK                  int
	// Groups are the entries kept, by reason, the most first.
	Groups         []keptGroup
	Stopping       bool
	Stopped        string
	Finished       bool
	Started, Ended time.Time
}

// Heading is the job page's heading: "Replay all matching: 120 of 500
// done, 100 replayed, 20 kept".
func (v jobView) Heading() string {
	done := "replayed"
	if v.Action == "remove" {
		done = "removed"
	}
	out := fmt.Sprintf("%s all matching: %d of %d done, %d %s", strings.ToUpper(v.Action[:1])+v.Action[1:], v.Done, v.Total, v.OK, done)
	if kept := v.Done - v.OK; kept > 0 {
		out += fmt.Sprintf(", %d kept", kept)
	}
	return out
}

func (j *job) view() jobView {
	j.mu.Lock()
	defer j.mu.Unlock()
	groups := make([]keptGroup, len(j.groups))
	for i, g := range j.groups {
		g.Newest = slices.Clone(g.Newest)
		groups[i] = g
	}
	slices.SortStableFunc(groups, func(a, b keptGroup) int {
		if a.Other != b.Other { // the rest last
			if a.Other {
				return 1
			}
			return -1
		}
		return b.Count - a.Count
	})
	return jobView{ID: j.ID, Stream: j.Stream, Action: j.Action, Filter: j.Filter, Back: j.Back, Total: j.Total,
		Done: j.done, OK: j.ok, Groups: groups, Stopping: j.stop && !j.finished,
		Stopped: j.stopped, Finished: j.finished, Started: j.started, Ended: j.ended}
}

func (j *job) record(row resultRow, ok bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.done++
	if ok {
		j.ok++
		return
	}
	i := slices.IndexFunc(j.groups, func(g keptGroup) bool {
		return !g.Other && g.Target == row.Target && g.Result == row.Result && g.Message == row.Message
	})
	if i < 0 && len(j.groups) >= jobGroups {
		if i = slices.IndexFunc(j.groups, func(g keptGroup) bool { return g.Other }); i < 0 {
			j.groups = append(j.groups, keptGroup{Other: true, Message: "other reasons"})
			i = len(j.groups) - 1
		}
	}
	if i < 0 {
		j.groups = append(j.groups, keptGroup{Target: row.Target, Result: row.Result, Message: row.Message})
		i = len(j.groups) - 1
	}
	g := &j.groups[i]
	g.Count++
	// Entries come oldest first: the one just tried is the newest.
	g.Newest = slices.Insert(g.Newest, 0, row.ID)
	if len(g.Newest) > groupIDs {
		g.Newest = g.Newest[:groupIDs]
	}
}

// stopping reports whether someone asked the job to stop.
func (j *job) stopping() bool {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.stop
}

func (j *job) finish(why string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if why == "" && j.stop && j.done < j.Total {
		why = "stopped on request"
	}
	j.stopped, j.finished, j.ended = why, true, time.Now()
}

// jobs are the bulk actions started, in memory.
type jobs struct {
	mu      sync.Mutex
	m       map[string]*job
	order   []string
	running sync.WaitGroup
}

// wait returns when no job runs any more.
func (js *jobs) wait() { js.running.Wait() }

func newJobs() *jobs { return &jobs{m: map[string]*job{}} }

func (js *jobs) add(j *job) {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	j.ID = hex.EncodeToString(b)
	js.mu.Lock()
	defer js.mu.Unlock()
	for len(js.order) >= maxJobs {
		if old := js.m[js.order[0]]; old != nil && !old.view().Finished {
			break // never forget a running job
		}
		delete(js.m, js.order[0])
		js.order = js.order[1:]
	}
	js.m[j.ID] = j
	js.order = append(js.order, j.ID)
}

func (js *jobs) get(id string) *job {
	js.mu.Lock()
	defer js.mu.Unlock()
	return js.m[id]
}

type bulkConfirmView struct {
	Stream, Action, Filter, Back, Upto string
	F                                  dlqFilter
	Count                              int
}

// dlqBulk replays or removes every entry the list's filter selects: the
// first POST counts them exactly and asks for confirmation, the confirmed
// one starts a job on those entries (none written since) and redirects to
// its page.
func (s *Server) dlqBulk(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	action := r.PostFormValue("action")
	switch {
	case s.cfg.ReadOnly:
		s.fail(w, r, http.StatusForbidden, "the console runs read-only (--read-only): replay and remove are off")
		return
	case action != "replay" && action != "remove":
		s.fail(w, r, http.StatusBadRequest, "action: want replay or remove")
		return
	case action == "replay" && s.cfg.Runner == nil:
		s.fail(w, r, http.StatusForbidden, "this console has no runner to replay with")
		return
	}
	f := s.parseFilter(r, st)
	q, err := f.pageQuery(time.Now())
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	store := redisdlq.NewStore(s.redis(r.Context()), st)
	if r.PostFormValue("confirm") != "yes" {
		s.bulkConfirm(w, r, store, f, q, action)
		return
	}
	total, err := strconv.Atoi(r.PostFormValue("count"))
	upto := r.PostFormValue("upto")
	if err != nil || total < 1 || total > bulkMax || !stream.IsID(upto) {
		s.fail(w, r, http.StatusBadRequest, "count, upto: the confirmation form is incomplete; start again from the list")
		return
	}
	j := &job{Stream: st, Action: action, Filter: describe(f), Back: f.URL(), Total: total, started: time.Now()}
	s.jobs.add(j)
	s.log.Info("console: bulk "+action+" started", "stream", store.Key(), "job", j.ID, "entries", total, "filter", j.Filter, "upto", upto)
	s.jobs.running.Go(func() { s.runJob(j, q, upto) })
	http.Redirect(w, r, query("/dlq/job", "stream", st, "id", j.ID), http.StatusSeeOther)
}

// bulkConfirm counts what the filter selects, exactly, and asks.
func (s *Server) bulkConfirm(w http.ResponseWriter, r *http.Request, store *redisdlq.Store, f dlqFilter, q dlq.PageQuery, action string) {
	ctx := r.Context()
	q.Newest, q.Count, q.Scan = true, 1, bulkMax
	n, complete, err := store.Count(ctx, q, bulkMax)
	if err != nil {
		s.failRedis(w, r, err)
		return
	}
	if !complete {
		cmd := "replay"
		if action == "remove" {
			cmd = "rm"
		}
		s.fail(w, r, http.StatusBadRequest, fmt.Sprintf("more than %s entries to read for this filter: narrow it (an age range, say), or use relay dlq %s --all",
			thousands(bulkMax), cmd))
		return
	}
	if n == 0 {
		s.fail(w, r, http.StatusNotFound, "no entry matches the filter any more")
		return
	}
	newest, err := store.Page(ctx, q)
	if err != nil || len(newest.Entries) == 0 {
		s.failRedis(w, r, errors.Join(err, errors.New("the newest matching entry is gone")))
		return
	}
	s.renderPage(w, r, "bulk_confirm", page{Title: "Confirm", Active: "dlq", Stream: f.Stream, Data: bulkConfirmView{
		Stream: f.Stream, Action: action, Filter: describe(f), Back: f.URL(), Upto: newest.Entries[0].ID, F: f.shown(), Count: n}})
}

// runJob acts on the entries of q up to id upto, oldest first, at most
// j.Total of them, bulkBatch at a time, until done or stopped.
func (s *Server) runJob(j *job, q dlq.PageQuery, upto string) {
	ctx := s.jobCtx
	store := redisdlq.NewStore(s.redis(ctx), j.Stream)
	var apps *app.Set
	if j.Action == "replay" {
		var err error
		if apps, err = s.cfg.Apps.Load(ctx); err != nil {
			j.finish("loading the apps failed: " + clean(err.Error()))
			return
		}
	}
	ms, _, _ := stream.ParseID(upto)
	q.Newest, q.After, q.Count, q.Scan = false, "", bulkBatch, 0
	q.Before = time.UnixMilli(int64(ms) + 1)
	var removed []string
	defer func() {
		if len(removed) > 0 {
			s.log.Info("console: bulk remove", "stream", store.Key(), "job", j.ID, "removed", len(removed), "ids", removed)
		}
	}()
	for tried := 0; ; {
		rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
		p, err := store.Page(rctx, q)
		cancel()
		if ctx.Err() != nil {
			j.finish("the console stopped")
			return
		}
		if err != nil {
			j.finish("reading the dead-letter queue failed: " + clean(err.Error()))
			return
		}
		for _, e := range p.Entries {
			if ctx.Err() != nil {
				j.finish("the console stopped")
				return
			}
			if j.stopping() || tried == j.Total || stream.CompareID(e.ID, upto) > 0 {
				j.finish("")
				return
			}
			tried++
			if stop := s.jobStep(ctx, j, apps, store, e, &removed); stop != "" {
				j.finish(stop)
				return
			}
		}
		if p.Next == "" {
			j.finish("")
			return
		}
		q.After = p.Next
	}
}

// jobStep acts on one entry; stop says why the rest would fail alike.
func (s *Server) jobStep(ctx context.Context, j *job, apps *app.Set, store *redisdlq.Store, e dlq.Entry, removed *[]string) (stop string) {
	if j.Action == "replay" {
		row, stop := s.replayOne(ctx, j.Stream, apps, store, e.ID)
		j.record(row, row.Result == "replayed")
		if ctx.Err() != nil {
			return "the console stopped"
		}
		return stop
	}
	row := resultRow{ID: e.ID, Target: clean(e.App + "/" + e.Handler), Result: "removed", Message: removedMsg}
	rctx, cancel := context.WithTimeout(ctx, s.cfg.RequestTimeout)
	err := store.Delete(rctx, e.ID)
	cancel()
	switch {
	case errors.Is(err, dlq.ErrNotFound):
		row.Message = "already gone (replayed or removed meanwhile)"
	case err != nil:
		row.Result, row.Message = "failed", clean(err.Error())
		j.record(row, false)
		return "Redis could not be written"
	default:
		*removed = append(*removed, e.ID)
	}
	j.record(row, true)
	return ""
}

// dlqJob shows a bulk action's progress; the page reloads itself while
// it runs.
func (s *Server) dlqJob(w http.ResponseWriter, r *http.Request) {
	j := s.jobs.get(r.FormValue("id"))
	if j == nil {
		s.fail(w, r, http.StatusNotFound, fmt.Sprintf("no such bulk action: the console keeps the last %d, in memory", maxJobs))
		return
	}
	v := j.view()
	p := page{Title: v.Heading(), Active: "dlq", Stream: v.Stream, Data: v}
	if !v.Finished {
		p.Refresh = 1
	}
	s.renderPage(w, r, "job", p)
}

// dlqJobStop asks a bulk action to stop after the entry it is on.
func (s *Server) dlqJobStop(w http.ResponseWriter, r *http.Request) {
	j := s.jobs.get(r.PostFormValue("id"))
	if j == nil {
		s.fail(w, r, http.StatusNotFound, "no such bulk action")
		return
	}
	j.mu.Lock()
	j.stop = true
	j.mu.Unlock()
	s.log.Info("console: bulk "+j.Action+" stop asked", "job", j.ID)
	http.Redirect(w, r, query("/dlq/job", "stream", j.Stream, "id", j.ID), http.StatusSeeOther)
}

// describe says what a filter selects, for a confirmation and a log line.
func describe(f dlqFilter) string {
	var parts []string
	add := func(name, v string) {
		if v != "" {
			parts = append(parts, name+" "+strconv.Quote(v))
		}
	}
	add("app", f.App)
	add("handler starting with", f.Handler)
	add("reason containing", f.Reason)
	add("event containing", f.Text)
	add("newer than", f.Newer)
	add("older than", f.Older)
	if len(parts) == 0 {
		return "every entry"
	}
	return "entries with " + strings.Join(parts, ", ")
}
