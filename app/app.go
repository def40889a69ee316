package app

import (
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
)

// Defaults and limits of an app (docs/apps.md#templateyaml).
const (
	// DefaultConcurrency bounds the app's concurrent invocations on one
	// worker; the effective bound is min(concurrency, MAX_CONCURRENCY).
	DefaultConcurrency = 2
	// DefaultTimeout bounds one attempt of a rule or schedule.
	DefaultTimeout = 30 * time.Second
	// MaxTimeout is the largest timeout a template may set.
	MaxTimeout = 15 * time.Minute
	// DefaultRetries allows DefaultRetries+1 attempts.
	DefaultRetries = invocation.DefaultRetries
	// NoRetries is the legacy Retries of a rule or schedule defined in
	// Go that must not be retried.
	//
	// Deprecated: set Retry to Retries(0) instead.
	NoRetries = -1
	// MaxRetries is the largest Retries a template or NewSet accepts.
	MaxRetries = 1000
	// DefaultMemoryBytes, DefaultCPUs and DefaultPIDs are the resource
	// limits of a handler's container.
	DefaultMemoryBytes = 128 << 20
	DefaultCPUs        = 1.0
	DefaultPIDs        = 128
	// TemplateFile is the name of an app's template inside its directory.
	TemplateFile = "template.yaml"
)

var nameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// ValidName reports whether name is a valid app or schedule name:
// [a-z0-9][a-z0-9._-]*, at most 63 characters.
func ValidName(name string) bool {
	return len(name) <= 63 && nameRE.MatchString(name)
}

// App is one loaded app. An app whose template has errors is unavailable:
// its rules that did parse still take part in matching (so their messages
// stay pending instead of being acknowledged as unmatched), but none of its
// handlers run (docs/delivery.md#attempts-retries-backoff).
type App struct {
	Name string
	// File names the template in messages: "<name>/template.yaml".
	File        string
	Spec        runtime.Spec
	Concurrency int
	Rules       []Rule
	Schedules   []Schedule
	// Errors lists every template error, position-sorted; empty when the
	// app is ready.
	Errors matcher.ErrorList
	// Digest identifies the template source the app was loaded from (hex
	// SHA-256); empty for an app defined in Go. An unchanged template loads
	// with the same digest, so a reload can tell what changed.
	Digest string
	// filled is set once NewSet checked the app and put in its defaults.
	filled bool
	// Incomplete is set when some of the app's event rules could not be
	// read (the template is unreadable or not valid YAML, or a rule's
	// pattern is broken). Relay then cannot tell which events the app
	// would match, so no message may be acknowledged as unmatched or
	// finished: every message stays pending until the template is fixed.
	Incomplete bool
}

// Available reports whether the app's handlers may run.
func (a *App) Available() bool { return len(a.Errors) == 0 }

// RuleIndex returns the index of handler's event rule in a.Rules, or -1
// (also for a nil a).
func (a *App) RuleIndex(handler string) int {
	if a == nil {
		return -1
	}
	return slices.IndexFunc(a.Rules, func(r Rule) bool { return r.Handler == handler })
}

// Schedule returns the schedule named name, or nil (also for a nil a).
func (a *App) Schedule(name string) *Schedule {
	if a == nil {
		return nil
	}
	for i := range a.Schedules {
		if a.Schedules[i].Name == name {
			return &a.Schedules[i]
		}
	}
	return nil
}

// Retry says how often a failed invocation of a rule or schedule defined
// in Go is retried (docs/embedding.md#apps-in-go). The zero value is the
// default, DefaultRetries retries, as an omitted `retries:` in a
// template; Retries(n) is n retries (n+1 attempts), Retries(0) none. A
// Retry cannot be written as a number, so a rule cannot say 0 and get 4.
type Retry struct {
	n   int
	set bool
}

// Retries returns the Retry of n retries, n+1 attempts in all; Retries(0)
// means a single attempt. NewSet refuses n outside [0, MaxRetries].
func Retries(n int) Retry { return Retry{n: n, set: true} }

// IsDefault reports whether r is the zero Retry, which takes
// DefaultRetries.
func (r Retry) IsDefault() bool { return !r.set }

// Count returns the number of retries r stands for: DefaultRetries for
// the zero Retry.
func (r Retry) Count() int {
	if !r.set {
		return DefaultRetries
	}
	return r.n
}

// String is "default (4)" for the zero Retry, else the number of retries.
func (r Retry) String() string {
	if !r.set {
		return fmt.Sprintf("default (%d)", DefaultRetries)
	}
	return strconv.Itoa(r.n)
}

// Rule is one event rule of an app.
type Rule struct {
	// Handler is "module.function", unique within the app.
	Handler string
	Pattern *matcher.Pattern
	// Timeout bounds one attempt, in (0, MaxTimeout]; NewSet turns 0
	// into DefaultTimeout.
	Timeout time.Duration
	// Retry says how often a failed invocation is retried: the zero
	// value takes DefaultRetries, Retries(n) n. Set it, not Retries, in
	// a rule defined in Go.
	Retry Retry
	// Retries is the number of retries in effect (attempts = Retries+1),
	// which the Engine reads: NewSet sets it from Retry, a template
	// loader from `retries`. As an input it keeps its old meaning for
	// code written before Retry (0 takes DefaultRetries, NoRetries none),
	// and NewSet refuses a Retries and a Retry that disagree.
	Retries int
	// Limits is the rule's flow control (docs/flow-control.md): its
	// concurrency bound, rate limit, debounce and maximum event age,
	// the rule's own template keys over the app's defaults. The zero
	// value limits nothing beyond the app's concurrency. NewSet checks
	// it and fills its defaults (Limits documents each field).
	Limits Limits
}

// Schedule is one cron schedule of an app (docs/schedules.md).
type Schedule struct {
	Name    string
	Handler string
	// Cron says when it fires, in its zone: package schedule/cron parses
	// template expressions (cron.Parse).
	Cron    schedule.Cron
	Timeout time.Duration
	// Retry and Retries mean what they mean in a Rule.
	Retry   Retry
	Retries int
}

// Timezone returns the zone the schedule fires in (UTC without a Cron).
func (s *Schedule) Timezone() *time.Location {
	if s.Cron == nil {
		return time.UTC
	}
	return s.Cron.Location()
}

// Set is an immutable set of apps in sorted name order. Safe for
// concurrent use.
type Set struct {
	list   []*App
	byName map[string]*App
}

// NewSet builds a set from apps defined in Go (for example by a service
// that embeds Relay with runtime.Func handlers), validated as a template is
// (docs/embedding.md#apps-in-go): app and schedule names valid and unique,
// handlers unique per app and "module.function" when the Spec names a
// container (else any name without /, whitespace or control characters), patterns present,
// timeouts in (0, MaxTimeout], retries in [0, MaxRetries], each rule's
// Limits within the bounds and combinations a template allows
// (docs/flow-control.md). It fills the template's defaults in place: a
// zero Concurrency takes DefaultConcurrency, a zero Timeout
// DefaultTimeout, a zero Retries DefaultRetries (NoRetries means none), a
// Rate without a RateBurst DefaultRateBurst, a ConcurrencyKey
// ScopeCluster; an app already in a set is not filled again. The first problem found is the error.
func NewSet(apps ...*App) (*Set, error) {
	for _, a := range apps {
		if err := check(a); err != nil {
			return nil, err
		}
	}
	return collect(apps)
}

// Loaded returns the set of apps a loader read from templates. Unlike
// NewSet it accepts apps with errors (unavailable apps keep their place in
// matching); only duplicate or invalid names are refused.
// Their values are final: a NewSet of such an app later fills nothing in
// (a template's retries: 0 stays 0).
func Loaded(apps []*App) (*Set, error) {
	for _, a := range apps {
		if a != nil {
			a.filled = true
		}
	}
	return collect(apps)
}

func collect(apps []*App) (*Set, error) {
	s := &Set{byName: make(map[string]*App, len(apps))}
	for _, a := range apps {
		if a == nil {
			return nil, fmt.Errorf("app: nil app")
		}
		if _, dup := s.byName[a.Name]; dup {
			return nil, fmt.Errorf("app: app %q defined twice", a.Name)
		}
		s.byName[a.Name] = a
		s.list = append(s.list, a)
	}
	sort.Slice(s.list, func(i, j int) bool { return s.list[i].Name < s.list[j].Name })
	return s, nil
}

// check validates and completes an app defined in Go, once.
func check(a *App) error {
	if a == nil {
		return fmt.Errorf("app: nil app")
	}
	if a.filled {
		return nil
	}
	if !ValidName(a.Name) {
		return fmt.Errorf("app: app name %q: must match [a-z0-9][a-z0-9._-]* and be at most 63 characters", a.Name)
	}
	if a.Concurrency <= 0 {
		a.Concurrency = DefaultConcurrency
	}
	if a.Spec.Warm && a.Spec.Runtime == "" {
		return fmt.Errorf("app: app %q: Spec.Warm needs Spec.Runtime (python3 or node)", a.Name)
	}
	validate := ValidateHandler
	if a.Spec.GoFunctions() {
		validate = validateGoHandler
	}
	seen := map[string]bool{}
	for i := range a.Rules {
		r := &a.Rules[i]
		what := fmt.Sprintf("app %q handler %q", a.Name, r.Handler)
		if err := validate(r.Handler); err != nil {
			return fmt.Errorf("app: app %q rule %d: %w", a.Name, i, err)
		}
		if r.Pattern == nil {
			return fmt.Errorf("app: %s: nil pattern", what)
		}
		if seen[r.Handler] {
			return fmt.Errorf("app: app %q: handler %q defined twice", a.Name, r.Handler)
		}
		seen[r.Handler] = true
		if err := fill(&r.Timeout, r.Retry, &r.Retries); err != nil {
			return fmt.Errorf("app: %s: %w", what, err)
		}
		if err := r.Limits.fill(a.Concurrency); err != nil {
			return fmt.Errorf("app: %s: %w", what, err)
		}
	}
	names := map[string]bool{}
	for i := range a.Schedules {
		s := &a.Schedules[i]
		if !ValidName(s.Name) || s.Cron == nil || names[s.Name] {
			return fmt.Errorf("app: app %q schedule %d (%s): needs a valid name unique in the app and a Cron", a.Name, i, s.Name)
		}
		names[s.Name] = true
		if err := validate(s.Handler); err != nil {
			return fmt.Errorf("app: app %q schedule %q: %w", a.Name, s.Name, err)
		}
		if err := fill(&s.Timeout, s.Retry, &s.Retries); err != nil {
			return fmt.Errorf("app: app %q schedule %q: %w", a.Name, s.Name, err)
		}
	}
	a.filled = true
	return nil
}

// fill checks a rule's or schedule's timeout and retries and puts in the
// template's defaults: retries is set from retry, or from its own legacy
// value when retry is the default.
func fill(timeout *time.Duration, retry Retry, retries *int) error {
	switch {
	case *timeout < 0:
		return fmt.Errorf("timeout %s must be > 0 (0 takes the default %s)", *timeout, DefaultTimeout)
	case *timeout > MaxTimeout:
		return fmt.Errorf("timeout %s is longer than the maximum %s", *timeout, MaxTimeout)
	case *timeout == 0:
		*timeout = DefaultTimeout
	}
	if !retry.IsDefault() {
		switch {
		case retry.n < 0 || retry.n > MaxRetries:
			return fmt.Errorf("Retry: app.Retries(%d): must be between 0 and %d", retry.n, MaxRetries)
		case *retries != 0:
			return fmt.Errorf("Retry is app.Retries(%d) and Retries %d: set Retry only", retry.n, *retries)
		}
		*retries = retry.n
		return nil
	}
	switch {
	case *retries == NoRetries:
		*retries = 0
	case *retries == 0:
		*retries = DefaultRetries
	case *retries < 0 || *retries > MaxRetries:
		return fmt.Errorf("retries %d must be between 0 and %d (set Retry: app.Retries(n); the zero Retry takes the default %d)", *retries, MaxRetries, DefaultRetries)
	}
	return nil
}

// validateGoHandler checks the handler name of an app whose handlers are
// Go functions: no container splits it into module and function, but a
// Func key "app/handler" must be unambiguous.
func validateGoHandler(h string) error {
	if h == "" || strings.ContainsRune(h, '/') || strings.IndexFunc(h, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }) >= 0 {
		return fmt.Errorf("handler %q must be non-empty, without /, whitespace or control characters", h)
	}
	return nil
}

// ValidateHandler checks a handler name as a template does: "module.function",
// split at the last dot, both parts non-empty, no whitespace, the module a
// path inside the app. The error says what is wrong.
func ValidateHandler(h string) error {
	if h == "" {
		return errors.New("handler must not be empty; write module.function")
	}
	if strings.IndexFunc(h, unicode.IsSpace) >= 0 {
		return fmt.Errorf("handler %q must not contain whitespace", h)
	}
	i := strings.LastIndexByte(h, '.')
	if i <= 0 || i == len(h)-1 {
		return fmt.Errorf("handler %q must be module.function (split at the last dot, both parts non-empty)", h)
	}
	// The module names code under /app; a path that leaves it, or a
	// Python module path with empty parts, fails only at run time.
	if strings.HasPrefix(h, "/") || strings.HasPrefix(h, ".") || strings.Contains(h, "..") || strings.Contains(h, "/.") ||
		strings.IndexFunc(h, unicode.IsControl) >= 0 {
		return fmt.Errorf("handler %q: the module must be a path inside the app (no leading / or ., no .. or empty parts, no control characters)", h)
	}
	return nil
}

// List returns the apps in sorted name order.
func (s *Set) List() []*App { return s.list }

// Get returns the named app or nil.
func (s *Set) Get(name string) *App { return s.byName[name] }

// Errors returns the template errors of every app, in app order.
func (s *Set) Errors() matcher.ErrorList {
	var all matcher.ErrorList
	for _, a := range s.list {
		all = append(all, a.Errors...)
	}
	return all
}

// Rules returns every rule with a pattern, apps in sorted name order and
// rules in declaration order: the dispatch order of
// docs/delivery.md#from-entry-to-acknowledgement.
func (s *Set) Rules() []matcher.Rule {
	var rules []matcher.Rule
	for _, a := range s.list {
		for _, r := range a.Rules {
			rules = append(rules, matcher.Rule{App: a.Name, Handler: r.Handler, Pattern: r.Pattern})
		}
	}
	return rules
}

// Targets returns every (app, handler) the set runs, from its rules and
// schedules, with the app's Spec: what runtime.HandlerChecker checks.
func (s *Set) Targets() []runtime.Target {
	var ts []runtime.Target
	for _, a := range s.list {
		for _, r := range a.Rules {
			ts = append(ts, runtime.Target{App: a.Name, Handler: r.Handler, Spec: a.Spec})
		}
		for _, sc := range a.Schedules {
			ts = append(ts, runtime.Target{App: a.Name, Handler: sc.Handler, Spec: a.Spec})
		}
	}
	return ts
}

// Incomplete returns the names of the apps whose rules are not all known
// (see App.Incomplete); while there are any, no matched or unmatched
// message is acknowledged.
func (s *Set) Incomplete() []string {
	var names []string
	for _, a := range s.list {
		if a.Incomplete {
			names = append(names, a.Name)
		}
	}
	return names
}

// Matcher returns the compiled matcher over every rule of the set.
func (s *Set) Matcher() *matcher.Set { return matcher.NewSet(s.Rules()) }

// ScheduleSpecs returns the schedules of every app in the shape package
// schedule publishes them.
func (s *Set) ScheduleSpecs() []schedule.Spec {
	var specs []schedule.Spec
	for _, a := range s.list {
		for _, sc := range a.Schedules {
			specs = append(specs, schedule.Spec{App: a.Name, Name: sc.Name, Handler: sc.Handler, Cron: sc.Cron})
		}
	}
	return specs
}
