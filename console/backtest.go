package console

import (
	"cmp"
	"net/http"
	"strconv"
	"strings"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/backtest"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/producer"
)

// A backtest reads the newest defaultWindow entries unless the form asks
// for up to backtest.MaxWindow, and lists firstMatches of each rule's.
const (
	defaultWindow = 1000
	firstMatches  = 5
)

// patternFile names the edited pattern in its errors (file:line:col).
const patternFile = "pattern"

type backtestView struct {
	// What says which rules ran: the edited pattern, an app's, every app's.
	What   string
	Edited bool
	Window int
	Result backtest.Result
	Rules  []backtestRule
}

type backtestRule struct {
	Name        string
	Unavailable bool
	Matches     int
	First       []pick
	// Pattern links to the playground with this rule's pattern loaded.
	Pattern string
}

// backtest runs the edited pattern, or the rules of the chosen app (every
// app's without one) as RELAY_APPS holds them now, against the newest
// entries of the stream (docs/console.md#backtesting-patterns). It only
// reads, so a read-only console allows it.
func (s *Server) backtest(r *http.Request, v *playgroundView) {
	if !parseNow(v) {
		return
	}
	n, err := strconv.Atoi(cmp.Or(strings.TrimSpace(v.Window), strconv.Itoa(defaultWindow)))
	if err != nil || n < 1 || n > backtest.MaxWindow {
		v.Error = "window: want 1 to " + strconv.Itoa(backtest.MaxWindow) + " entries"
		return
	}
	var apps *app.Set
	bv := &backtestView{Window: n}
	if strings.TrimSpace(v.Pattern) != "" {
		p, err := yamlpattern.Parse(patternFile, []byte(v.Pattern))
		if err != nil {
			v.PatternErrors = patternErrors(err)
			return
		}
		apps, err = app.NewSet(&app.App{Name: "edited", Rules: []app.Rule{{Handler: "pattern", Pattern: p}}})
		if err != nil {
			v.Error = clean(err.Error())
			return
		}
		bv.What, bv.Edited = "the edited pattern", true
	} else {
		loaded, err := s.loadApps(r, v)
		if err != nil {
			v.AppsError = err.Error()
			return
		}
		apps, bv.What = loaded, "the rules of every app"
		if v.BacktestApp != "" {
			a := loaded.Get(v.BacktestApp)
			if a == nil {
				v.Error = "app: no app " + clean(v.BacktestApp) + " is loaded"
				return
			}
			if apps, err = app.Loaded([]*app.App{a}); err != nil {
				v.Error = clean(err.Error())
				return
			}
			bv.What = "the rules of app " + a.Name
		}
	}
	res, err := backtest.Run(r.Context(), s.redis(r.Context()), v.Stream, apps, n, firstMatches, s.maxEventBytes(), v.At)
	if err != nil {
		v.Error = clean(err.Error())
		return
	}
	bv.Result = res
	for _, rr := range res.Rules {
		a := apps.Get(rr.App)
		br := backtestRule{Name: clean(rr.App + "/" + rr.Handler), Unavailable: !a.Available(), Matches: rr.Matches}
		if bv.Edited {
			br.Name = "edited pattern"
		} else {
			br.Pattern = query("/playground", "stream", v.Stream, "app", rr.App, "handler", rr.Handler)
		}
		for _, m := range rr.First {
			br.First = append(br.First, pick{Label: m.ID + "  " + oneLine(clean(m.Event), 60),
				URL: query("/event", "stream", v.Stream, "id", m.ID)})
		}
		bv.Rules = append(bv.Rules, br)
	}
	v.Backtest = bv
}

// patternErrors lists every error of a pattern that did not parse, each
// as file:line:col: message.
func patternErrors(err error) []string {
	var out []string
	if l, ok := err.(matcher.ErrorList); ok {
		for _, e := range l {
			out = append(out, clean(e.Error()))
		}
		return out
	}
	return []string{clean(err.Error())}
}

// maxEventBytes is the workers' event size limit the backtest applies.
func (s *Server) maxEventBytes() int {
	if s.cfg.MaxEventBytes == 0 {
		return producer.DefaultMaxEventBytes
	}
	return s.cfg.MaxEventBytes
}
