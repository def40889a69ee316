package template

import (
	"fmt"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/relaydev/relay/app"
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
		path := fmt.Sprintf("schedules[%d]", i)
		fields, ok := t.mapping(item, path, "a schedule")
		if !ok {
			continue
		}
		s := app.Schedule{Timeout: app.DefaultTimeout, Retries: app.DefaultRetries}
		loc := time.UTC
		var expr string
		var exprN ast.Node
		valid := true
		have := map[string]bool{}
		for _, fl := range fields {
			p := path + "." + fl.key
			have[fl.key] = true
			switch fl.key {
			case "name":
				if v, ok := t.str(fl.value, p); ok {
					switch {
					case !app.ValidName(v):
						t.errorf(fl.value, p, "schedule name %q must match [a-z0-9][a-z0-9._-]* and be at most 63 characters", v)
						valid = false
					case seen[v]:
						t.errorf(fl.value, p, "schedule name %q is used twice", v)
						valid = false
					}
					seen[v] = true
					s.Name = v
				} else {
					valid = false
				}
			case "handler":
				if v, ok := t.str(fl.value, p); ok {
					if msg := validHandler(v); msg != "" {
						t.errorf(fl.value, p, "%s", msg)
						valid = false
					}
					s.Handler = v
				} else {
					valid = false
				}
			case "cron":
				// Parsed below, once the zone is known.
				if v, ok := t.str(fl.value, p); ok {
					expr, exprN = v, fl.value
				} else {
					valid = false
				}
			case "timezone":
				if v, ok := t.str(fl.value, p); ok {
					l, err := loadZone(v)
					if err != nil {
						t.errorf(fl.value, p, "%v", err)
						valid = false
					} else {
						loc = l
					}
				}
			case "timeout":
				s.Timeout = t.duration(fl.value, p, app.DefaultTimeout)
			case "retries":
				s.Retries = t.retries(fl.value, p)
			default:
				t.errorf(fl.keyN, p, "unknown key %q%s", fl.key, suggest(fl.key, []string{"name", "handler", "cron", "timezone", "timeout", "retries"}))
			}
		}
		if exprN != nil {
			c, err := cron.Parse(expr, loc)
			if err != nil {
				t.errorf(exprN, path+".cron", "%v", err)
				valid = false
			}
			s.Cron = c
		}
		for _, req := range []string{"name", "handler", "cron"} {
			if !have[req] {
				t.errorf(item, path, "missing %s", req)
				valid = false
			}
		}
		if valid {
			a.Schedules = append(a.Schedules, s)
		}
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
