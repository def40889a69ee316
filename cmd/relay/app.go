package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/textsafe"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
	ctrd "github.com/relaydev/relay/runtime/containerd"
	"github.com/relaydev/relay/schedule"
)

// AppCmd groups the app commands.
type AppCmd struct {
	Ls      AppLsCmd      `cmd:"" help:"List the apps under the apps root with their status."`
	Inspect AppInspectCmd `cmd:"" help:"Show an app's resolved template: runtime, limits, rules, schedules, env names."`
	Invoke  AppInvokeCmd  `cmd:"" help:"Run an app's matching handlers once with an event, outside the stream lifecycle."`
}

// appStatus is "ready" or "unavailable".
func appStatus(a *app.App) string {
	if a.Available() {
		return "ready"
	}
	return "unavailable"
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func errorStrings(l matcher.ErrorList) []string {
	out := make([]string, 0, len(l))
	for _, e := range l {
		out = append(out, e.Error())
	}
	return out
}

// AppLsCmd is `relay app ls`.
type AppLsCmd struct {
	JSON bool `name:"json" help:"Print JSON instead of a table."`
}

// Help shows examples under relay app ls --help.
func (c *AppLsCmd) Help() string {
	return `An app is unavailable when its template has errors: its handlers do not run and its messages stay pending. relay validate prints the errors.

Examples:

    relay app ls
    relay app ls --apps ./examples/apps --json`
}

type appSummaryJSON struct {
	Name           string   `json:"name"`
	Status         string   `json:"status"`
	Runtime        string   `json:"runtime,omitempty"`
	Image          string   `json:"image,omitempty"`
	ImageIsDefault bool     `json:"image_is_default,omitempty"`
	Rules          int      `json:"rules"`
	Schedules      int      `json:"schedules"`
	Errors         []string `json:"errors"`
}

// Run lists the apps as NAME STATUS RUNTIME IMAGE RULES SCHEDULES.
func (c *AppLsCmd) Run(ctx context.Context, g *Globals) error {
	apps, err := g.loadApps()
	if err != nil {
		return err
	}
	list := apps.List()
	if c.JSON {
		out := make([]appSummaryJSON, 0, len(list))
		for _, a := range list {
			image, isDefault := resolvedImage(a.Spec)
			out = append(out, appSummaryJSON{Name: a.Name, Status: appStatus(a), Runtime: a.Spec.Runtime, Image: image, ImageIsDefault: isDefault,
				Rules: len(a.Rules), Schedules: len(a.Schedules), Errors: errorStrings(a.Errors)})
		}
		return writeJSON(g.stdout, out)
	}
	if len(list) == 0 {
		fmt.Fprintf(g.stdout, "No apps in %s (each app is a directory holding %s)\n", g.Apps, app.TemplateFile)
		return nil
	}
	rows := make([][]string, 0, len(list))
	unavailable := 0
	for _, a := range list {
		if !a.Available() {
			unavailable++
		}
		image, _ := resolvedImage(a.Spec)
		rows = append(rows, []string{a.Name, appStatus(a), orDash(a.Spec.Runtime), orDash(image),
			strconv.Itoa(len(a.Rules)), strconv.Itoa(len(a.Schedules))})
	}
	if err := table(g.stdout, []string{"NAME", "STATUS", "RUNTIME", "IMAGE", "RULES", "SCHEDULES"}, rows); err != nil {
		return err
	}
	if unavailable > 0 {
		fmt.Fprintf(g.stderr, "relay: %s unavailable; relay validate shows why\n", plural.Of(unavailable, "app"))
	}
	return nil
}

// AppInspectCmd is `relay app inspect NAME`.
type AppInspectCmd struct {
	RunnerFlags `embed:""`
	Name        string `arg:"" help:"App name (its directory under the apps root)."`
	JSON        bool   `name:"json" help:"Print JSON instead of text."`
	Now         string `placeholder:"TIME" help:"List schedules' next fire times after this RFC 3339 time instead of the current time."`
}

// Help shows examples under relay app inspect --help.
func (c *AppInspectCmd) Help() string {
	return `Shows the template as Relay resolved it, defaults filled in. Environment variable and secret values are never shown, only their names. For an app with a dependency manifest it shows the dependency image, its size and build time, asking containerd.

Examples:

    relay app inspect billing
    relay app inspect billing --json | jq '.rules[].handler'`
}

type appJSON struct {
	Name     string `json:"name"`
	Status   string `json:"status"`
	Template string `json:"template"`
	Dir      string `json:"dir"`
	Runtime  string `json:"runtime,omitempty"`
	Image    string `json:"image,omitempty"`
	// ImageIsDefault: the template names no image; Image is the runtime's.
	ImageIsDefault bool           `json:"image_is_default,omitempty"`
	Command        []string       `json:"command"`
	Concurrency    int            `json:"concurrency"`
	MemoryBytes    int64          `json:"memory_bytes"`
	TmpBytes       int64          `json:"tmp_bytes"`
	CPUs           float64        `json:"cpus"`
	PIDs           int64          `json:"pids"`
	Network        string         `json:"network"`
	Warm           bool           `json:"warm"`
	Env            []string       `json:"env"`     // names only
	Secrets        []string       `json:"secrets"` // names only
	Deps           *depsJSON      `json:"dependencies,omitempty"`
	Rules          []ruleJSON     `json:"rules"`
	Schedules      []scheduleJSON `json:"schedules"`
	Errors         []string       `json:"errors"`
}

type ruleJSON struct {
	Handler        string  `json:"handler"`
	Pattern        string  `json:"pattern"`
	TimeoutSeconds float64 `json:"timeout_seconds"`
	Retries        int     `json:"retries"`
}

type scheduleJSON struct {
	Name           string     `json:"name"`
	Handler        string     `json:"handler"`
	Cron           string     `json:"cron"`
	Timezone       string     `json:"timezone"`
	TimeoutSeconds float64    `json:"timeout_seconds"`
	Retries        int        `json:"retries"`
	Next           []fireJSON `json:"next"`
}

type fireJSON struct {
	UTC   string `json:"utc"`
	Local string `json:"local"`
}

// nextFires is how many upcoming fire times app inspect lists per schedule.
const nextFires = 3

// fires returns the next n fire times of s after now, in UTC and in the
// schedule's zone (RFC 3339, the local one with its zone abbreviation).
func fires(appName string, s app.Schedule, now time.Time, n int) ([]fireJSON, error) {
	spec := schedule.Spec{App: appName, Name: s.Name, Handler: s.Handler, Cron: s.Cron}
	out := make([]fireJSON, 0, n)
	at := now
	for range n {
		next, err := spec.Next(at)
		if err != nil {
			return nil, fmt.Errorf("schedule %s: %w", s.Name, err)
		}
		local := next.In(s.Timezone())
		out = append(out, fireJSON{UTC: next.UTC().Format(time.RFC3339), Local: local.Format(time.RFC3339) + " " + local.Format("MST")})
		at = next
	}
	return out, nil
}

// findApp loads the apps root and returns the named app.
func (g *Globals) findApp(name string) (*app.App, error) {
	apps, err := g.loadApps()
	if err != nil {
		return nil, err
	}
	a := apps.Get(name)
	if a == nil {
		return nil, fmt.Errorf("no app %q in the apps root %s (relay app ls lists them)", name, g.Apps)
	}
	return a, nil
}

// Run prints the resolved template of one app, env values hidden.
func (c *AppInspectCmd) Run(ctx context.Context, g *Globals) error {
	a, err := g.findApp(c.Name)
	if err != nil {
		return err
	}
	now := time.Now()
	if c.Now != "" {
		if now, err = time.Parse(time.RFC3339Nano, c.Now); err != nil {
			return usagef("--now %q: want an RFC 3339 time such as 2026-09-12T10:00:00Z", c.Now)
		}
	}
	next := make([][]fireJSON, len(a.Schedules))
	for i, s := range a.Schedules {
		if next[i], err = fires(a.Name, s, now, nextFires); err != nil {
			return err
		}
	}
	env := slices.Sorted(maps.Keys(a.Spec.Env))
	deps := c.depsInfo(ctx, g, a)
	if c.JSON {
		image, isDefault := resolvedImage(a.Spec)
		out := appJSON{Name: a.Name, Status: appStatus(a), Template: a.File, Dir: a.Spec.Dir, Runtime: a.Spec.Runtime,
			Image: image, ImageIsDefault: isDefault, Command: append([]string{}, a.Spec.Command...), Concurrency: a.Concurrency,
			MemoryBytes: a.Spec.MemoryBytes, TmpBytes: ctrd.TmpBytes(a.Spec), CPUs: a.Spec.CPUs, PIDs: a.Spec.PIDs, Network: a.Spec.Network, Warm: a.Spec.Warm,
			Env: append([]string{}, env...), Secrets: append([]string{}, a.Spec.Secrets...), Deps: deps, Rules: []ruleJSON{}, Schedules: []scheduleJSON{}, Errors: errorStrings(a.Errors)}
		for _, r := range a.Rules {
			out.Rules = append(out.Rules, ruleJSON{r.Handler, r.Pattern.String(), r.Timeout.Seconds(), r.Retries})
		}
		for i, s := range a.Schedules {
			out.Schedules = append(out.Schedules, scheduleJSON{s.Name, s.Handler, s.Cron.String(), tzName(s.Timezone()), s.Timeout.Seconds(), s.Retries, next[i]})
		}
		return writeJSON(g.stdout, out)
	}
	if err := writeAppFacts(g.stdout, a, env, deps); err != nil {
		return err
	}
	return writeAppRules(g.stdout, a, now, next)
}

// writeAppFacts prints the table of an app's settings.
func writeAppFacts(w io.Writer, a *app.App, env []string, deps *depsJSON) error {
	envText := "-"
	if len(env) > 0 {
		envText = strings.Join(env, ", ") + " (values hidden)"
	}
	status := appStatus(a)
	if !a.Available() {
		status += " (" + plural.Of(len(a.Errors), "template error") + ")"
	}
	image, isDefault := resolvedImage(a.Spec)
	image = orDash(image)
	if isDefault {
		image += " (the " + a.Spec.Runtime + " default)"
	}
	return table(w, []string{"App:", a.Name}, [][]string{
		{"Status:", status},
		{"Template:", a.File},
		{"Directory:", a.Spec.Dir},
		{"Runtime:", orDash(a.Spec.Runtime)},
		{"Warm:", strconv.FormatBool(a.Spec.Warm)},
		{"Image:", image},
		{"Command:", orDash(a.Spec.CommandLine())},
		{"Concurrency:", strconv.Itoa(a.Concurrency)},
		{"Memory:", runtime.FormatSize(a.Spec.MemoryBytes)},
		{"Tmp:", runtime.FormatSize(ctrd.TmpBytes(a.Spec))},
		{"CPUs:", strconv.FormatFloat(a.Spec.CPUs, 'f', -1, 64)},
		{"PIDs:", strconv.FormatInt(a.Spec.PIDs, 10)},
		{"Network:", a.Spec.Network},
		{"Env:", envText},
		{"Secrets:", secretsText(a.Spec.Secrets)},
		{"Deps:", depsText(deps)},
		{"Deps image:", depsImageText(deps)},
	})
}

// writeAppRules prints an app's event rules, schedules with their next
// fire times, and template errors.
func writeAppRules(w io.Writer, a *app.App, now time.Time, next [][]fireJSON) error {
	fmt.Fprintf(w, "\nEvent rules, in dispatch order (%d):\n", len(a.Rules))
	if len(a.Rules) > 0 {
		rows := make([][]string, 0, len(a.Rules))
		for _, r := range a.Rules {
			rows = append(rows, []string{r.Handler, r.Timeout.String(), strconv.Itoa(r.Retries), r.Pattern.String()})
		}
		if err := table(w, []string{"HANDLER", "TIMEOUT", "RETRIES", "PATTERN"}, rows); err != nil {
			return err
		}
	}
	fmt.Fprintf(w, "\nSchedules (%d):\n", len(a.Schedules))
	if len(a.Schedules) > 0 {
		rows := make([][]string, 0, len(a.Schedules))
		for _, s := range a.Schedules {
			rows = append(rows, []string{s.Name, s.Handler, s.Cron.String(), tzName(s.Timezone()), s.Timeout.String(), strconv.Itoa(s.Retries)})
		}
		if err := table(w, []string{"NAME", "HANDLER", "CRON", "TIMEZONE", "TIMEOUT", "RETRIES"}, rows); err != nil {
			return err
		}
		fmt.Fprintf(w, "\nNext fire times after %s:\n", now.UTC().Format(time.RFC3339))
		rows = rows[:0]
		for i, s := range a.Schedules {
			for _, f := range next[i] {
				rows = append(rows, []string{s.Name, f.UTC, f.Local})
			}
		}
		if err := table(w, []string{"NAME", "UTC", "LOCAL"}, rows); err != nil {
			return err
		}
	}
	if len(a.Errors) > 0 {
		fmt.Fprintf(w, "\nTemplate errors (%d):\n", len(a.Errors))
		for _, e := range a.Errors {
			fmt.Fprintln(w, textsafe.Escape(e.Error(), false))
		}
	}
	return nil
}

// resolvedImage returns the image app spec runs in under relay's
// containerd runner: its template's image, or else its runtime's default
// image (isDefault), or "" when there is none (runtime: go).
func resolvedImage(spec runtime.Spec) (image string, isDefault bool) {
	if spec.Image != "" {
		return spec.Image, false
	}
	if d := ctrd.DefaultImage(spec.Runtime); d != "" {
		return d, true
	}
	return "", false
}

func tzName(l *time.Location) string {
	if l == nil {
		return "UTC"
	}
	return l.String()
}

// AppInvokeCmd is `relay app invoke NAME`.
type AppInvokeCmd struct {
	Name        string    `arg:"" help:"App name."`
	Event       rawString `placeholder:"JSON" xor:"input" help:"The event, a JSON object."`
	File        string    `short:"f" placeholder:"FILE" xor:"input" help:"Read the event from this file (- for stdin). Without --event or --file the event is read from stdin."`
	JSON        bool      `name:"json" help:"Print the results as JSON; handler output then goes to stderr."`
	MessageID   string    `name:"message-id" placeholder:"ID" help:"RELAY_MESSAGE_ID for the handlers (default: a new invoke-<16 hex digits>, which no stream entry id can be)."`
	RunnerFlags `embed:""`
}

// Help shows examples under relay app invoke --help.
func (c *AppInvokeCmd) Help() string {
	return `Runs every event rule of the app that matches the event, once each, in declaration order, through the same runtime as relay start. Nothing is written to Redis: no invocation state, no retry, no dead-letter entry. The handlers get RELAY_ATTEMPT=1 and RELAY_MESSAGE_ID=invoke- followed by 16 random hex digits, one id per command, so a handler can tell a manual run from a stream entry ("<ms>-<seq>"); --message-id sets another, a stream entry's id say, to see what a handler does with that message. Exits 1 if any handler failed, 0 when all succeeded or none matched.

Examples:

    relay app invoke users --event '{"event_name":"INSERT","table_name":"users","new_image":{"id":42}}'
    relay app invoke billing --file event.json
    relay app invoke billing --file event.json --message-id 1718000000000-0
    relay dlq inspect 1718000000000-0 --json | jq -r .event | relay app invoke billing`
}

type invokeJSON struct {
	App       string             `json:"app"`
	MessageID string             `json:"message_id"`
	Results   []invokeResultJSON `json:"results"`
}

type invokeResultJSON struct {
	Handler  string  `json:"handler"`
	Result   string  `json:"result"` // ok or failed
	Error    string  `json:"error,omitempty"`
	ExitCode *int    `json:"exit_code,omitempty"`
	TimedOut bool    `json:"timed_out,omitempty"`
	Duration float64 `json:"duration_seconds"`
}

// Run invokes the app's matching handlers and prints each result.
func (c *AppInvokeCmd) Run(ctx context.Context, g *Globals) error {
	// The event is read exactly as relay match reads it.
	src, from, err := (&MatchCmd{Event: c.Event, File: c.File}).readEvent()
	if err != nil {
		return err
	}
	id := c.MessageID
	if i := strings.IndexFunc(id, unicode.IsControl); i >= 0 {
		return usagef("--message-id %q: a control character at byte %d; an id is printable text, e.g. 1718000000000-0", id, i)
	}
	if id == "" {
		id = manual.NewMessageID()
	}
	a, err := g.findApp(c.Name)
	if err != nil {
		return err
	}
	// The invoke is an app.manual_invoke trace when OTEL_* names an endpoint.
	_, stopTracing, err := startTracing(ctx, g.logger())
	if err != nil {
		return err
	}
	defer stopTracing()
	runner := c.manualRunner(ctx, g, c.JSON)
	defer runner.Close()
	results, err := manual.Invoker{Runner: c.progress(g, runner), MessageID: id}.Invoke(ctx, a, src)
	switch {
	case errors.Is(err, matcher.ErrMalformed):
		msg := err.Error()
		if _, after, ok := strings.Cut(msg, matcher.ErrMalformed.Error()+": "); ok {
			msg = after
		}
		return usagef("malformed event from %s: %s; an event is one JSON object, e.g. {\"event_name\":\"INSERT\"}", from, msg)
	case errors.Is(err, manual.ErrAppUnavailable):
		return fmt.Errorf("app %s is unavailable: its template has %s (relay validate shows them); nothing ran",
			a.Name, plural.Of(len(a.Errors), "error"))
	}
	failed := 0
	for _, res := range results {
		if res.Failed() {
			failed++
		}
	}
	if c.JSON {
		if werr := writeInvokeJSON(g.stdout, a.Name, id, results); werr != nil {
			return werr
		}
	} else if len(results) == 0 && err == nil {
		fmt.Fprintln(g.stdout, "No matching handlers")
	}
	if err != nil {
		return err // interrupted
	}
	if failed > 0 {
		return fmt.Errorf("%d of %s failed", failed, plural.Of(len(results), "handler"))
	}
	return nil
}

// progress wraps runner to print each handler's run on stdout, unless
// the output is JSON.
func (c *AppInvokeCmd) progress(g *Globals, runner relay.Runner) relay.Runner {
	if c.JSON {
		return runner
	}
	return observed{Runner: runner,
		before: func(req runtime.Request) {
			fmt.Fprintf(g.stdout, "Running %s/%s (message %s)\n", req.App, req.Handler, req.MessageID)
		},
		after: func(req runtime.Request, took time.Duration, err error) {
			if err == nil {
				fmt.Fprintf(g.stdout, "%s/%s: ok in %s\n", req.App, req.Handler, duration(took))
			} else {
				fmt.Fprintf(g.stdout, "%s/%s: failed after %s: %v\n", req.App, req.Handler, duration(took), err)
			}
		},
	}
}

// writeInvokeJSON prints the results of an invoke as JSON.
func writeInvokeJSON(w io.Writer, appName, id string, results []manual.Result) error {
	out := invokeJSON{App: appName, MessageID: id, Results: []invokeResultJSON{}}
	for _, res := range results {
		j := invokeResultJSON{Handler: res.Handler, Result: "ok", Duration: res.Duration.Seconds()}
		if res.Err != nil {
			j.Result, j.Error = "failed", res.Err.Error()
			if exit, ok := errors.AsType[*runtime.ExitError](res.Err); ok {
				j.ExitCode, j.TimedOut = &exit.Code, exit.TimedOut
			}
		}
		out.Results = append(out.Results, j)
	}
	return writeJSON(w, out)
}
