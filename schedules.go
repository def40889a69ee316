package relay

import (
	"fmt"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/robfig/cron/v3"

	"github.com/relaydev/relay/schedule"
)

// ParseCron parses a schedule's cron expression: five fields (minute hour
// day-of-month month day-of-week) or one of @hourly @daily @midnight @weekly
// @monthly @yearly @annually (reference.md "Schedules"). Seconds fields,
// @every, embedded TZ=/CRON_TZ= and expressions that never fire are
// rejected: the zone is the schedule's timezone key. It is
// schedule.ParseCron, which owns the rules; evaluate the result with
// schedule.Spec, which applies Relay's DST rules.
func ParseCron(expr string) (cron.Schedule, error) { return schedule.ParseCron(expr) }

func (t *tpl) schedules(app *App, n ast.Node) {
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
		s := Schedule{Timezone: time.UTC, Timeout: DefaultTimeout, Retries: DefaultRetries}
		valid := true
		have := map[string]bool{}
		for _, fl := range fields {
			p := path + "." + fl.key
			have[fl.key] = true
			switch fl.key {
			case "name":
				if v, ok := t.str(fl.value, p); ok {
					switch {
					case !ValidAppName(v):
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
				if v, ok := t.str(fl.value, p); ok {
					if _, err := ParseCron(v); err != nil {
						t.errorf(fl.value, p, "%v", err)
						valid = false
					}
					s.Cron = v
				} else {
					valid = false
				}
			case "timezone":
				if v, ok := t.str(fl.value, p); ok {
					loc, err := loadZone(v)
					if err != nil {
						t.errorf(fl.value, p, "%v", err)
						valid = false
					} else {
						s.Timezone = loc
					}
				}
			case "timeout":
				s.Timeout = t.duration(fl.value, p, DefaultTimeout)
			case "retries":
				s.Retries = t.retries(fl.value, p)
			default:
				t.errorf(fl.keyN, p, "unknown key %q%s", fl.key, suggest(fl.key, []string{"name", "handler", "cron", "timezone", "timeout", "retries"}))
			}
		}
		for _, req := range []string{"name", "handler", "cron"} {
			if !have[req] {
				t.errorf(item, path, "missing %s", req)
				valid = false
			}
		}
		if valid {
			app.Schedules = append(app.Schedules, s)
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
