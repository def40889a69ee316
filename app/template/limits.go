package template

import (
	"slices"
	"time"

	"github.com/goccy/go-yaml/ast"

	"github.com/relaydev/relay/app"
)

// flowKeys are the flow-control keys of an event rule
// (docs/flow-control.md). The top level of a template takes those of them
// in defaultKeys as defaults for every rule.
var (
	flowKeys    = []string{"concurrency", "concurrency_scope", "concurrency_key", "rate", "rate_burst", "rate_key", "debounce", "max_age"}
	defaultKeys = []string{"rate", "rate_burst", "rate_key", "debounce", "max_age"}
)

// limitKeys are the flow-control keys written at one level of a
// template: the top (the app's defaults) or one event rule.
type limitKeys struct {
	// path is "" at the top, else the rule's path, events[i].
	path string
	// l holds the values written; a key whose value is invalid or none
	// leaves its field zero.
	l app.Limits
	// nodes holds the value node of every key written, valid or not;
	// bad the keys whose value is invalid.
	nodes map[string]ast.Node
	bad   map[string]bool
	// index is the rule's index in App.Rules, or -1 when the rule was
	// not added (its pattern or handler is broken); unused at the top.
	index int
}

func newLimitKeys(path string) *limitKeys {
	return &limitKeys{path: path, nodes: map[string]ast.Node{}, bad: map[string]bool{}, index: -1}
}

// has reports whether key is written at this level; ok whether it is
// written with a valid value.
func (k *limitKeys) has(key string) bool { _, ok := k.nodes[key]; return ok }
func (k *limitKeys) ok(key string) bool  { return k.has(key) && !k.bad[key] }

// keyPath is the error path of key at this level.
func (k *limitKeys) keyPath(key string) string { return join(k.path, key) }

// limitField reads the flow-control key of fl (at path p) into k.
func (t *tpl) limitField(k *limitKeys, fl field, p string) {
	k.nodes[fl.key] = fl.value
	ok := false
	switch fl.key {
	case "concurrency":
		if v, isInt := t.integer(fl.value, p); isInt {
			if v < 1 || v > app.MaxConcurrency {
				t.errorf(fl.value, p, "concurrency must be a positive integer (at most %d)", app.MaxConcurrency)
			} else {
				k.l.Concurrency, ok = int(v), true
			}
		}
	case "concurrency_scope":
		if s, isStr := t.str(fl.value, p); isStr {
			if sc, err := app.ParseScope(s); err != nil {
				t.errorf(fl.value, p, "%v", err)
			} else {
				k.l.Scope, ok = sc, true
			}
		}
	case "concurrency_key":
		k.l.ConcurrencyKey, ok = t.fieldPath(fl.value, p, fl.key)
	case "rate_key":
		k.l.RateKey, ok = t.fieldPath(fl.value, p, fl.key)
	case "rate":
		k.l.Rate, ok = t.rate(fl.value, p)
	case "rate_burst":
		if v, isInt := t.integer(fl.value, p); isInt {
			if v < 1 || v > app.MaxRateBurst {
				t.errorf(fl.value, p, "rate_burst must be between 1 and %d: how many invocations may start at once (default %d)", app.MaxRateBurst, app.DefaultRateBurst)
			} else {
				k.l.RateBurst, ok = int(v), true
			}
		}
	case "debounce":
		k.l.Debounce, ok = t.debounce(fl.value, p)
	case "max_age":
		if isNone(fl.value) {
			ok = true
			break
		}
		if d, isDur := t.limitDuration(fl.value, p); isDur {
			if err := app.CheckMaxAge(d); err != nil {
				t.errorf(fl.value, p, "%v", err)
			} else {
				k.l.MaxAge, ok = d, true
			}
		}
	}
	if !ok {
		k.bad[fl.key] = true
	}
}

// isNone reports whether n is the word none, which turns off a default
// of the app in one rule.
func isNone(n ast.Node) bool {
	s, ok := unwrap(n).(*ast.StringNode)
	return ok && s.Value == "none"
}

func (t *tpl) fieldPath(n ast.Node, p, key string) (app.FieldPath, bool) {
	s, ok := t.str(n, p)
	if !ok {
		return "", false
	}
	fp, err := app.ParseFieldPath(s)
	if err != nil {
		t.errorf(n, p, "%s: %v", key, err)
		return "", false
	}
	return fp, true
}

func (t *tpl) rate(n ast.Node, p string) (app.Rate, bool) {
	switch v := unwrap(n).(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		t.errorf(n, p, "rate %s: want <count>/<s|m|h>, like %s/s", v.GetToken().Value, v.GetToken().Value)
		return app.Rate{}, false
	}
	if isNone(n) {
		return app.Rate{}, true
	}
	s, ok := t.str(n, p)
	if !ok {
		return app.Rate{}, false
	}
	r, err := app.ParseRate(s)
	if err != nil {
		t.errorf(n, p, "%v", err)
		return app.Rate{}, false
	}
	return r, true
}

// limitDuration reads a Go duration with a unit, > 0.
func (t *tpl) limitDuration(n ast.Node, p string) (time.Duration, bool) {
	switch v := unwrap(n).(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		t.errorf(n, p, "a duration needs a unit: write %ss for seconds (Go duration syntax, such as 10s, 5m or 1h)", v.GetToken().Value)
		return 0, false
	}
	s, ok := t.str(n, p)
	if !ok {
		return 0, false
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		t.errorf(n, p, "invalid duration %q: write a Go duration such as 10s, 5m or 1h", s)
	case d <= 0:
		t.errorf(n, p, "must be > 0 (omit the key, or write none, for no limit)")
	default:
		return d, true
	}
	return 0, false
}

// debounce reads debounce: {key: <field path>, period: <duration>}, or
// none.
func (t *tpl) debounce(n ast.Node, p string) (app.Debounce, bool) {
	if isNone(n) {
		return app.Debounce{}, true
	}
	switch unwrap(n).(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
	default:
		t.errorf(n, p, "debounce must be {key: <field path>, period: <duration>}, like {key: new_image.id, period: 10s}, or none, not %s", describeScalar(unwrap(n)))
		return app.Debounce{}, false
	}
	fields, ok := t.mapping(n, p, "debounce")
	if !ok {
		return app.Debounce{}, false
	}
	var d app.Debounce
	valid, haveKey, havePeriod := true, false, false
	for _, fl := range fields {
		fp := p + "." + fl.key
		switch fl.key {
		case "key":
			haveKey = true
			k, ok := t.fieldPath(fl.value, fp, "debounce key")
			d.Key, valid = k, valid && ok
		case "period":
			havePeriod = true
			v, ok := t.limitDuration(fl.value, fp)
			if ok {
				if err := app.CheckDebouncePeriod(v); err != nil {
					t.errorf(fl.value, fp, "%v", err)
					ok = false
				}
			}
			d.Period, valid = v, valid && ok
		default:
			t.errorf(fl.keyN, fp, "unknown key %q%s", fl.key, suggest(fl.key, []string{"key", "period"}))
			valid = false
		}
	}
	if !haveKey {
		t.errorf(n, p, "debounce needs key: the field path whose value groups the events, like key: new_image.id (events without the field share one group)")
		valid = false
	}
	if !havePeriod {
		t.errorf(n, p, "debounce needs period: how long an event waits for a successor with its key, like period: 10s")
		valid = false
	}
	if !valid {
		return app.Debounce{}, false
	}
	return d, true
}

// topLimitField reads a flow-control key written at the top of the
// template, a default or one refused there; false when fl's key is not a
// flow-control key.
func (t *tpl) topLimitField(fl field) bool {
	switch {
	case slices.Contains(defaultKeys, fl.key):
		t.limitField(t.top, fl, fl.key)
	case fl.key == "concurrency_scope" || fl.key == "concurrency_key":
		t.errorf(fl.keyN, fl.key, "%s belongs in an event rule, beside that rule's concurrency: the top-level concurrency bounds the app's invocations on each worker, all rules together (docs/flow-control.md)", fl.key)
	default:
		return false
	}
	return true
}

// resolveLimits gives every event rule its Limits, its own keys over the
// app's defaults, and reports the combinations that make no sense, once
// every key of the template is read.
func (t *tpl) resolveLimits(a *app.App) {
	anyRate, rateUnknown := false, t.top.bad["rate"]
	for _, rk := range t.rules {
		l := t.ruleLimits(a, rk)
		anyRate = anyRate || !l.Rate.IsZero()
		rateUnknown = rateUnknown || rk.bad["rate"]
		if rk.index >= 0 {
			a.Rules[rk.index].Limits = l
		}
	}
	if anyRate || rateUnknown {
		return
	}
	for _, key := range []string{"rate_burst", "rate_key"} {
		if t.top.ok(key) {
			t.errorf(t.top.nodes[key], key, "%s is a default for the rules' rate, and no rule has a rate: set rate too, at the top or in a rule", key)
		}
	}
}

// ruleLimits resolves the Limits of the rule whose keys are rk.
func (t *tpl) ruleLimits(a *app.App, rk *limitKeys) app.Limits {
	top := t.top
	pick := func(key string) *limitKeys {
		switch {
		case rk.has(key):
			return rk
		case top.has(key):
			return top
		}
		return nil
	}
	errAt := func(k *limitKeys, key, format string, args ...any) {
		t.errorf(k.nodes[key], k.keyPath(key), format, args...)
	}

	// Concurrency is the rule's own: the top-level concurrency is the
	// app's bound on each worker.
	l := app.Limits{Concurrency: rk.l.Concurrency, Scope: rk.l.Scope, ConcurrencyKey: rk.l.ConcurrencyKey}
	if rk.has("concurrency_key") && !rk.has("concurrency") {
		errAt(rk, "concurrency_key", "concurrency_key needs concurrency in the same rule: the bound on runs per key, like concurrency: 2")
	}
	if rk.has("concurrency_scope") && !rk.has("concurrency") {
		errAt(rk, "concurrency_scope", "concurrency_scope needs concurrency in the same rule: the bound it scopes, like concurrency: 5")
	}
	if rk.has("concurrency_key") {
		if rk.ok("concurrency_scope") && rk.l.Scope == app.ScopeWorker {
			errAt(rk, "concurrency_scope", "concurrency_scope: worker does not go with concurrency_key: a bound per key holds across all workers, since which worker receives a key's events is arbitrary; remove concurrency_scope")
		}
		l.Scope = app.ScopeCluster
	}
	if rk.ok("concurrency") && l.Scope == app.ScopeWorker && !t.badConcurrency && l.Concurrency > a.Concurrency {
		errAt(rk, "concurrency", "concurrency %d on each worker is more than the app's concurrency %d, which bounds this rule too, so it would never apply: lower it, raise the app's concurrency, or set concurrency_scope: cluster",
			l.Concurrency, a.Concurrency)
	}

	// The other keys default to the top level's, key by key.
	rateSrc := pick("rate")
	if rateSrc != nil {
		l.Rate = rateSrc.l.Rate
	}
	if !l.Rate.IsZero() {
		l.RateBurst = app.DefaultRateBurst
		if k := pick("rate_burst"); k != nil && k.ok("rate_burst") {
			l.RateBurst = k.l.RateBurst
		}
		if k := pick("rate_key"); k != nil {
			l.RateKey = k.l.RateKey
		}
	} else if rateSrc == nil || !rateSrc.bad["rate"] {
		for _, key := range []string{"rate_burst", "rate_key"} {
			if !rk.has(key) {
				continue
			}
			if rateSrc == rk {
				errAt(rk, key, "%s needs a rate, and this rule's rate is none: remove %s", key, key)
			} else {
				errAt(rk, key, "%s needs a rate: write rate: <count>/<s|m|h>, like rate: 100/s, in this rule or at the top of the template", key)
			}
		}
	}
	debSrc, ageSrc := pick("debounce"), pick("max_age")
	if debSrc != nil {
		l.Debounce = debSrc.l.Debounce
	}
	if ageSrc != nil {
		l.MaxAge = ageSrc.l.MaxAge
	}
	if !l.Debounce.IsZero() && l.MaxAge > 0 && l.MaxAge <= l.Debounce.Period {
		// Said where the rule wrote one of them, else once at the top.
		at, key := ageSrc, "max_age"
		if ageSrc != rk && debSrc == rk {
			at, key = debSrc, "debounce"
		}
		if at == rk || !t.reportedTop[key] {
			if at != rk {
				t.reportedTop[key] = true
			}
			errAt(at, key, "max_age %s is not longer than debounce.period %s: every debounced event waits the period before it runs, so each would be dead-lettered; make max_age longer than the period",
				app.FormatDuration(l.MaxAge), app.FormatDuration(l.Debounce.Period))
		}
	}
	return l
}
