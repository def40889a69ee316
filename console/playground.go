package console

import (
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/internal/backtest"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/stream"
)

// maxEventBytes bounds an event pasted into the playground.
const maxEventBytes = 1 << 20

// recentPicks is how many recent stream and DLQ entries the playground
// offers to load.
const recentPicks = 8

type pick struct {
	Label, URL string
}

type ruleResult struct {
	App, Handler string
	Available    bool
	Matched      bool
	Conditions   []matcher.Condition
	Pattern      string
}

type playgroundView struct {
	Stream    string
	Event     string
	Now       string // the form's --now, "" for the current time
	From      string // where the event was loaded from
	Evaluated bool
	At        time.Time
	Error     string
	Rules     []ruleResult
	Matches   []string
	Recent    []pick
	RecentDLQ []pick
	// PicksError is why the newest entries could not be listed, "" when
	// they were: the lists then say so instead of "none".
	PicksError string
	AppsError  string
	// Unreadable are the apps some of whose rules cannot be read: the
	// playground cannot try those rules, and says so.
	Unreadable []unreadableApp

	// Pattern is the pattern being edited, BacktestApp the app whose
	// rules a backtest runs without one ("" for every app), Window how
	// many of the newest entries it reads.
	Pattern       string
	PatternFrom   string // the rule the pattern was loaded from
	BacktestApp   string
	Window        string
	AppNames      []string
	MaxWindow     int
	DefaultWindow int
	Backtest      *backtestView
	// PatternErrors lists why the edited pattern did not parse.
	PatternErrors []string

	// apps is the apps root as loaded once for this request.
	apps    *app.Set
	appsErr error
}

// playground matches an event against every rule of every app and says
// why each matched or not, condition by condition (matcher.Explain, as
// relay match --explain). GET loads an event from the stream (?id=) or
// the DLQ (?dlq=) into the form; POST evaluates the form.
func (s *Server) playground(w http.ResponseWriter, r *http.Request) {
	st, ok := s.stream(r)
	if !ok {
		s.fail(w, r, http.StatusNotFound, "no such stream in this console")
		return
	}
	ctx := r.Context()
	v := playgroundView{Stream: st, Window: r.FormValue("window"), BacktestApp: r.FormValue("app")}
	if r.Method == http.MethodGet {
		if h := r.FormValue("handler"); h != "" {
			s.loadPattern(r, &v, h)
		}
		switch id, dlqID := r.FormValue("id"), r.FormValue("dlq"); {
		case id != "":
			if !stream.IsID(id) {
				v.Error = "id: not a stream id"
				break
			}
			raw, found, err := s.streamEntry(ctx, st, id)
			switch {
			case err != nil:
				v.Error = err.Error()
			case !found:
				v.Error = "entry " + id + " is no longer in stream " + st
			default:
				v.Event, v.From = prettyEvent(raw["event"]), "stream entry "+id
			}
		case dlqID != "":
			e, err := redisdlq.NewStore(s.redis(ctx), st).Get(ctx, dlqID)
			if err != nil {
				v.Error = clean(err.Error())
				break
			}
			v.Event, v.From = prettyEvent(e.Event), "dead-letter entry "+dlqID
		}
		if v.Event != "" && v.Error == "" {
			s.evaluate(r, &v)
		}
	} else {
		r.Body = http.MaxBytesReader(w, r.Body, maxEventBytes+64<<10)
		v.Event, v.Now = textarea(r, "event"), strings.TrimSpace(r.PostFormValue("now"))
		v.Pattern = textarea(r, "pattern")
		if r.PostFormValue("action") == "backtest" {
			s.backtest(r, &v)
		} else {
			s.evaluate(r, &v)
		}
	}
	s.finish(r, &v)
	s.renderPage(w, r, "playground", page{Title: "Pattern playground", Stream: st, Data: v})
}

// finish cleans what the form shows again and lists what it offers.
func (s *Server) finish(r *http.Request, v *playgroundView) {
	v.Event, v.Pattern = clean(v.Event), clean(v.Pattern)
	v.BacktestApp, v.Window, v.MaxWindow, v.DefaultWindow = clean(v.BacktestApp), clean(v.Window), backtest.MaxWindow, defaultWindow
	if v.Window == "" {
		v.Window = strconv.Itoa(defaultWindow)
	}
	if apps, err := s.loadApps(r, v); err == nil {
		for _, a := range apps.List() {
			v.AppNames = append(v.AppNames, a.Name)
		}
	}
	s.recentPicks(r, v)
}

// loadPattern puts the pattern of the rule of app v.BacktestApp that
// handler runs into the form, to edit and backtest.
func (s *Server) loadPattern(r *http.Request, v *playgroundView, handler string) {
	apps, err := s.loadApps(r, v)
	if err != nil {
		v.AppsError = err.Error()
		return
	}
	a := apps.Get(v.BacktestApp)
	if i := a.RuleIndex(handler); i >= 0 {
		v.Pattern, v.PatternFrom = patternYAML(a.Rules[i].Pattern.String()), clean("rule "+v.BacktestApp+"/"+handler)
		return
	}
	v.Error = clean("no rule " + v.BacktestApp + "/" + handler + " is loaded")
}

// loadApps loads the apps root once for the request: matching,
// backtesting and the form's list of apps see the same templates.
func (s *Server) loadApps(r *http.Request, v *playgroundView) (*app.Set, error) {
	if v.apps == nil && v.appsErr == nil {
		v.apps, v.appsErr = s.cfg.Apps.Load(r.Context())
	}
	return v.apps, v.appsErr
}

// parseNow sets v.At from the form's now, false (with v.Error) when it
// is not a time.
func parseNow(v *playgroundView) bool {
	v.At = time.Now()
	if v.Now != "" {
		t, err := time.Parse(time.RFC3339Nano, v.Now)
		if err != nil {
			v.Error = "now: want an RFC 3339 time such as 2026-09-12T10:00:00Z"
			return false
		}
		v.At = t
	}
	return true
}

func (s *Server) evaluate(r *http.Request, v *playgroundView) {
	if !parseNow(v) {
		return
	}
	if len(v.Event) > maxEventBytes {
		v.Error = "the event is larger than 1 MiB"
		return
	}
	event, err := matcher.DecodeEvent([]byte(v.Event))
	if err != nil {
		msg := err.Error()
		if errors.Is(err, matcher.ErrMalformed) {
			msg = strings.TrimPrefix(msg, matcher.ErrMalformed.Error()+": ")
			msg = "malformed event: " + msg + `; an event is one JSON object, e.g. {"event_name":"INSERT"}`
		}
		v.Error = clean(msg)
		return
	}
	apps, err := s.loadApps(r, v)
	if err != nil {
		v.AppsError = err.Error()
		return
	}
	v.Evaluated = true
	v.Unreadable = unreadableApps(apps)
	available := map[string]bool{}
	patterns := map[matcher.Target]string{}
	for _, a := range apps.List() {
		available[a.Name] = a.Available()
		for _, rule := range a.Rules {
			patterns[matcher.Target{App: a.Name, Handler: rule.Handler}] = patternYAML(rule.Pattern.String())
		}
	}
	for _, x := range matcher.NewSet(apps.Rules()).Explain(event, v.At) {
		rr := ruleResult{App: x.Target.App, Handler: x.Target.Handler, Available: available[x.Target.App],
			Matched: x.Matched, Pattern: patterns[x.Target]}
		for _, c := range x.Conditions {
			c.Path, c.Reason = clean(c.Path), clean(c.Reason)
			rr.Conditions = append(rr.Conditions, c)
		}
		v.Rules = append(v.Rules, rr)
		if x.Matched {
			v.Matches = append(v.Matches, x.Target.App+"/"+x.Target.Handler)
		}
	}
}

// recentPicks lists the newest entries of the stream and its DLQ to load.
func (s *Server) recentPicks(r *http.Request, v *playgroundView) {
	rc := s.redis(r.Context())
	b := rc.B()
	res := rc.DoMulti(r.Context(),
		b.Xrevrange().Key(v.Stream).End("+").Start("-").Count(recentPicks).Build(),
		b.Xrevrange().Key(redisdlq.NewStore(rc, v.Stream).Key()).End("+").Start("-").Count(recentPicks).Build())
	if es, err := res[0].AsXRange(); err == nil {
		for _, e := range es {
			v.Recent = append(v.Recent, pick{Label: e.ID + "  " + oneLine(clean(e.FieldValues["event"]), 60),
				URL: query("/playground", "stream", v.Stream, "id", e.ID)})
		}
	} else if !rueidis.IsRedisNil(err) {
		v.PicksError = clean(err.Error())
	}
	if es, err := res[1].AsXRange(); err == nil {
		for _, e := range es {
			label := e.ID + "  " + clean(e.FieldValues["app"]+"/"+e.FieldValues["handler"]) + "  " + oneLine(clean(e.FieldValues["event"]), 40)
			v.RecentDLQ = append(v.RecentDLQ, pick{Label: label, URL: query("/playground", "stream", v.Stream, "dlq", e.ID)})
		}
	} else if !rueidis.IsRedisNil(err) && v.PicksError == "" {
		v.PicksError = clean(err.Error())
	}
}

// playgroundForm shows the playground with the posted event and time
// kept, and msg as the error: a POST refused before evaluating (a stale
// CSRF token) must not lose what was pasted.
func (s *Server) playgroundForm(w http.ResponseWriter, r *http.Request, msg string) {
	st, ok := s.stream(r)
	if !ok {
		st = s.cfg.Streams[0]
	}
	v := playgroundView{Stream: st, Event: textarea(r, "event"), Now: clean(strings.TrimSpace(r.PostFormValue("now"))), Error: msg,
		Pattern: textarea(r, "pattern"), BacktestApp: r.PostFormValue("app"), Window: r.PostFormValue("window")}
	s.finish(r, &v)
	s.renderPage(w, r, "playground", page{Title: "Pattern playground", Stream: st, Data: v})
}

// textarea returns the posted text of a textarea with its line breaks
// as the user typed them: browsers send every one as CRLF, and a CR
// shown again would read \x0d.
func textarea(r *http.Request, name string) string {
	return strings.ReplaceAll(r.PostFormValue(name), "\r\n", "\n")
}
