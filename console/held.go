package console

import (
	"context"
	"strings"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/stats"
	"github.com/relaydev/relay/stats/redisstats"
)

// holdView is one reason the workers hold messages of a stream pending
// (docs/delivery.md#held-messages), as the console shows it.
type holdView struct {
	Stream string
	App    string
	Reason string
	// What says in plain words what is held and why.
	What string
	// Error is the worker's error: file:line:col and message for a
	// template, the preparation's error for an app not ready.
	Error string
	// Held is how many messages the workers saw held; AtLeast says the
	// count is a lower bound.
	Held    int
	AtLeast bool
	// AppURL is the app's section of the apps page, "" for no app.
	AppURL string
}

// readHolds reads why the live workers of stream hold messages, from the
// status they publish (redisstats.ReadHolds); nil when none do.
func (s *Server) readHolds(ctx context.Context, rc rueidis.Client, stream string) ([]holdView, error) {
	hs, err := redisstats.ReadHolds(ctx, rc, stream, s.cfg.Group)
	if err != nil {
		return nil, err
	}
	return holdViews(stream, hs), nil
}

// holdViews says each of hs, holds of stream, in plain words.
func holdViews(stream string, hs []stats.Hold) []holdView {
	out := make([]holdView, 0, len(hs))
	for _, h := range hs {
		v := holdView{Stream: clean(stream), App: clean(h.App), Reason: h.Reason, Error: clean(h.Error), Held: h.Held, AtLeast: h.AtLeast}
		if h.App != "" {
			v.AppURL = "/apps#app-" + v.App
		}
		switch h.Reason {
		case stats.ReasonRulesUnreadable:
			v.What = "its rules cannot all be read, so no message of stream " + clean(stream) +
				" can be acknowledged: every message stays pending until its template is fixed"
		case stats.ReasonAppUnavailable:
			v.What = "unavailable: its handlers do not run, and the messages that match its rules stay pending until it is fixed"
		default:
			v.What = "messages are left pending after an error; they are retried at their next delivery"
			if h.App != "" {
				v.What = "messages of app " + v.App + " are left pending after an error; they are retried at their next delivery"
			}
		}
		out = append(out, v)
	}
	return out
}

// Short is the reason a held invocation or message shows on the
// pending page: "held: ...".
func (h holdView) Short() string {
	switch h.Reason {
	case stats.ReasonRulesUnreadable:
		return "rules of app " + h.App + " cannot be read"
	case stats.ReasonAppUnavailable:
		return "app " + h.App + " unavailable: " + h.Error
	}
	return h.Error
}

// markHeld adds to the pending rows the holds that keep them pending: an
// app whose rules cannot be read holds every message; an unavailable app
// holds its invocations that are not finished.
func markHeld(rows []pendingRow, holds []holdView) {
	unavailable := map[string]*holdView{}
	var everything []holdView
	for i, h := range holds {
		switch h.Reason {
		case stats.ReasonRulesUnreadable:
			everything = append(everything, h)
		case stats.ReasonAppUnavailable:
			unavailable[h.App] = &holds[i]
		}
	}
	for i := range rows {
		row := &rows[i]
		row.Held = everything
		for j := range row.Invocations {
			iv := &row.Invocations[j]
			name, _, _ := strings.Cut(iv.Key, "/")
			if h := unavailable[name]; h != nil && !iv.finished() {
				iv.Held = h
			}
		}
	}
}

// finished reports a terminal invocation: it holds its message no more.
func (v invocationView) finished() bool {
	switch v.State {
	case "succeeded", "exhausted", "dead-lettered", "superseded":
		return true
	}
	return false
}

// appHolds reads the holds of every stream of the console, by app name.
// A stream whose status cannot be read is left out: the apps page still
// shows the templates.
func (s *Server) appHolds(ctx context.Context) map[string][]holdView {
	rc := s.redis(ctx)
	out := map[string][]holdView{}
	for _, st := range s.cfg.Streams {
		hs, _ := s.readHolds(ctx, rc, st)
		for _, h := range hs {
			out[h.App] = append(out[h.App], h)
		}
	}
	return out
}

// unreadableApp is an app some of whose rules cannot be read, with its
// template errors: the playground cannot try those rules.
type unreadableApp struct {
	Name   string
	Errors []string
}

// unreadableApps lists the apps of set whose rules cannot all be read
// (app.App.Incomplete), in name order.
func unreadableApps(set *app.Set) []unreadableApp {
	var out []unreadableApp
	for _, a := range set.List() {
		if !a.Incomplete {
			continue
		}
		u := unreadableApp{Name: clean(a.Name)}
		for _, e := range a.Errors {
			u.Errors = append(u.Errors, clean(e.Error()))
		}
		out = append(out, u)
	}
	return out
}
