package template

import (
	"fmt"
	"slices"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule/cron"
)

func (t *tpl) schedules(a *app.App, n ast.Node) {
	seq, ok := unwrap(n).(*ast.SequenceNode)
	if !ok {
		t.errorf(n, "schedules", "schedules must be a list, not %s", describe(unwrap(n)))
		return
	}
	seen := map[string]bool{}
	t.declared += len(seq.Values)
	for i, item := range seq.Values {
		if s, ok := t.schedule(item, fmt.Sprintf("schedules[%d]", i), seen); ok {
			a.Schedules = append(a.Schedules, s)
		}
	}
}

// scheduleReader gathers one schedule item's keys: the schedule, the cron
// expression to parse once the zone is known, and whether all was valid.
type scheduleReader struct {
	s     app.Schedule
	loc   *time.Location
	expr  string
	exprN ast.Node
	valid bool
	have  map[string]bool
}

// schedule reads the schedule item at path; seen holds the names of the
// app's schedules so far. ok is false when it has errors.
func (t *tpl) schedule(item ast.Node, path string, seen map[string]bool) (app.Schedule, bool) {
	fields, ok := t.mapping(item, path, "a schedule")
	if !ok {
		return app.Schedule{}, false
	}
	r := scheduleReader{
		s:   app.Schedule{Timeout: app.DefaultTimeout, Retries: app.DefaultRetries},
		loc: time.UTC, valid: true, have: map[string]bool{},
	}
	for _, fl := range fields {
		r.have[fl.key] = true
		t.scheduleField(&r, fl, path+"."+fl.key, seen)
	}
	if r.exprN != nil {
		c, err := cron.Parse(r.expr, r.loc)
		if err != nil {
			t.errorf(r.exprN, path+".cron", "%v", err)
			r.valid = false
		}
		r.s.Cron = c
	}
	for _, req := range []string{"name", "handler", "cron"} {
		if !r.have[req] {
			t.errorf(item, path, "missing %s", req)
			r.valid = false
		}
	}
	return r.s, r.valid
}

// scheduleField reads one key (at path p) of a schedule item into r.
func (t *tpl) scheduleField(r *scheduleReader, fl field, p string, seen map[string]bool) {
	switch fl.key {
	case "name":
		v, ok := t.str(fl.value, p)
		switch {
		case !ok:
			r.valid = false
			return
		case !app.ValidName(v):
			t.errorf(fl.value, p, "schedule name %q must match [a-z0-9][a-z0-9._-]* and be at most 63 characters", v)
			r.valid = false
		case seen[v]:
			t.errorf(fl.value, p, "schedule name %q is used twice", v)
			r.valid = false
		}
		seen[v] = true
		r.s.Name = v
	case "handler":
		v, ok := t.str(fl.value, p)
		if !ok {
			r.valid = false
			return
		}
		if err := app.ValidateHandler(v); err != nil {
			t.errorf(fl.value, p, "%s", err)
			r.valid = false
		} else {
			t.checkEnvVar(fl.value, p, runtime.EnvHandler, v)
		}
		r.s.Handler = v
	case "cron":
		// Parsed by schedule, once the zone is known.
		if v, ok := t.str(fl.value, p); ok {
			r.expr, r.exprN = v, fl.value
		} else {
			r.valid = false
		}
	case "timezone":
		if v, ok := t.str(fl.value, p); ok {
			l, err := loadZone(v)
			if err != nil {
				t.errorf(fl.value, p, "%v", err)
				r.valid = false
			} else {
				r.loc = l
			}
		}
	case "timeout":
		r.s.Timeout = t.duration(fl.value, p, app.DefaultTimeout)
	case "retries":
		r.s.Retries = t.retries(fl.value, p)
	default:
		if slices.Contains(flowKeys, fl.key) {
			t.errorf(fl.keyN, p, "%s applies to event rules only: a schedule takes no flow-control keys, and the app's defaults do not apply to its occurrences, each published once (docs/flow-control.md)", fl.key)
			return
		}
		t.errorf(fl.keyN, p, "unknown key %q%s", fl.key, suggest(fl.key, []string{"name", "handler", "cron", "timezone", "timeout", "retries"}))
	}
}

func loadZone(name string) (*time.Location, error) {
	if name == "" || name == "Local" {
		return nil, fmt.Errorf("timezone %q: name an IANA zone such as Europe/Berlin (Local is not allowed: it differs between hosts)", name)
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("timezone %q is not a known IANA zone name", name)
	}
	return loc, nil
}
