package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/alecthomas/kong"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/backtest"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/textsafe"
	"github.com/relaydev/relay/matcher"
)

// maxEventBytes bounds the event `relay match` reads.
const maxEventBytes = 64 << 20

// rawString is a flag or argument taken byte for byte: kong passes a string
// value through encoding/json, which turns bytes that are not UTF-8 into
// U+FFFD, so an event that a worker dead-letters would match here.
type rawString string

// Decode implements kong.MapperValue.
func (r *rawString) Decode(ctx *kong.DecodeContext) error {
	t, err := ctx.Scan.PopValue("value")
	if err != nil {
		return err
	}
	s, ok := t.Value.(string)
	if !ok {
		return fmt.Errorf("expected a string, got %v", t.Value)
	}
	*r = rawString(s)
	return nil
}

// MatchCmd is `relay match`: a dry run of event classification.
type MatchCmd struct {
	Event   rawString `placeholder:"JSON" xor:"input" help:"The event, a JSON object."`
	File    string    `short:"f" placeholder:"FILE" xor:"input" help:"Read the event from this file (- for stdin). Without --event or --file the event is read from stdin."`
	Explain bool      `help:"For every rule of every app, print whether it matched and why, condition by condition."`
	JSON    bool      `name:"json" help:"Print JSON instead of text."`
	Now     string    `placeholder:"TIME" help:"Evaluate now() cutoffs at this RFC 3339 time instead of the current time."`
	// Backtest is the window of entries, nil without --backtest.
	Backtest *int   `placeholder:"N" xor:"input" help:"Instead of one event, match the newest N entries of REDIS_STREAM (1 to 10000) and print, per rule, how many matched and the first matches. Needs REDIS_URI and REDIS_STREAM, no group; only reads the stream."`
	App      string `placeholder:"NAME" help:"With --backtest, only this app's rules."`
	First    int    `placeholder:"K" default:"3" help:"With --backtest, how many of each rule's matches to list, newest first (default ${default}; 0 to 100; --json lists them with their events)."`
	// MaxEventBytes is the workers' limit: larger events count as malformed.
	MaxEventBytes byteSize `name:"max-event-bytes" env:"MAX_EVENT_BYTES" default:"1MiB" help:"With --backtest, the workers' MAX_EVENT_BYTES: a larger event counts as malformed, as they dead-letter it undecoded."`
}

type matchTargetJSON struct {
	App       string `json:"app"`
	Handler   string `json:"handler"`
	Available bool   `json:"available"`
}

type matchRuleJSON struct {
	matchTargetJSON
	Matched    bool                 `json:"matched"`
	Conditions []matchConditionJSON `json:"conditions"`
}

type matchConditionJSON struct {
	Path    string `json:"path"`
	Matched bool   `json:"matched"`
	Reason  string `json:"reason"`
}

type matchJSON struct {
	Matches []matchTargetJSON `json:"matches"`
	Rules   []matchRuleJSON   `json:"rules,omitempty"`
}

// Run loads the apps root, matches one event against every rule as the worker
// would (docs/delivery.md#from-entry-to-acknowledgement) and prints the
// matching app/handler targets in dispatch order. It needs neither Redis nor
// containerd. Rules of unavailable apps that parsed still match, as in the
// worker, and are marked. With --backtest (or --app) it runs backtest
// instead.
func (c *MatchCmd) Run(ctx context.Context, g *Globals) error {
	if c.Backtest != nil || c.App != "" {
		return c.backtest(ctx, g)
	}
	now, event, err := c.parse()
	if err != nil {
		return err
	}
	apps, err := g.loadApps()
	if err != nil {
		return err
	}
	available := warnUnavailable(g.stderr, apps)
	set := matcher.NewSet(apps.Rules())
	var explained []matcher.Explanation
	var matches []matcher.Target
	if c.Explain {
		explained = set.Explain(event, now)
		for _, x := range explained {
			if x.Matched {
				matches = append(matches, x.Target)
			}
		}
	} else {
		matches = set.MatchValue(event, now)
	}
	if c.JSON {
		return writeMatchJSON(g.stdout, matches, explained, available)
	}
	c.writeMatches(g.stdout, matches, explained, available)
	return nil
}

// parseNow reads --now, the current time without it.
func (c *MatchCmd) parseNow() (time.Time, error) {
	if c.Now == "" {
		return time.Now(), nil
	}
	now, err := time.Parse(time.RFC3339Nano, c.Now)
	if err != nil {
		return now, usagef("--now %q: want an RFC 3339 time such as 2026-09-12T10:00:00Z", c.Now)
	}
	return now, nil
}

// parse reads --now and the event.
func (c *MatchCmd) parse() (now time.Time, event map[string]any, err error) {
	if now, err = c.parseNow(); err != nil {
		return now, nil, err
	}
	src, from, err := c.readEvent()
	if err != nil {
		return now, nil, err
	}
	event, err = matcher.DecodeEvent(src)
	if err != nil && errors.Is(err, matcher.ErrMalformed) {
		msg := strings.TrimPrefix(err.Error(), matcher.ErrMalformed.Error()+": ")
		return now, nil, usagef("malformed event from %s: %s; an event is one JSON object, e.g. {\"event_name\":\"INSERT\"}", from, msg)
	}
	return now, event, err
}

// writeMatchJSON prints the matches (and explanations) as JSON.
func writeMatchJSON(w io.Writer, matches []matcher.Target, explained []matcher.Explanation, available map[string]bool) error {
	out := matchJSON{Matches: []matchTargetJSON{}}
	for _, t := range matches {
		out.Matches = append(out.Matches, matchTargetJSON{t.App, t.Handler, available[t.App]})
	}
	for _, x := range explained {
		r := matchRuleJSON{matchTargetJSON: matchTargetJSON{x.Target.App, x.Target.Handler, available[x.Target.App]},
			Matched: x.Matched, Conditions: []matchConditionJSON{}}
		for _, cond := range x.Conditions {
			r.Conditions = append(r.Conditions, matchConditionJSON{cond.Path, cond.Matched, cond.Reason})
		}
		out.Rules = append(out.Rules, r)
	}
	// Reasons quote comparisons such as "> 70": keep them readable.
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(out)
}

// writeMatches prints the explanations (with --explain) and the matches.
func (c *MatchCmd) writeMatches(w io.Writer, matches []matcher.Target, explained []matcher.Explanation, available map[string]bool) {
	// Names and conditions come from templates, valid or not: escaped,
	// they can neither send escape sequences nor forge an output line.
	name := func(t matcher.Target) string {
		s := textsafe.Escape(t.App+"/"+t.Handler, false)
		if !available[t.App] {
			s += " (app unavailable)"
		}
		return s
	}
	if c.Explain {
		for _, x := range explained {
			verdict := "not matched"
			if x.Matched {
				verdict = "matched"
			}
			fmt.Fprintf(w, "%s: %s\n", name(x.Target), verdict)
			for _, cond := range x.Conditions {
				mark := "✗"
				if cond.Matched {
					mark = "✓"
				}
				fmt.Fprintf(w, "  %s %s\n", mark, textsafe.Escape(cond.String(), false))
			}
		}
		if len(explained) == 0 {
			fmt.Fprintln(w, "No event rules loaded")
		}
		fmt.Fprintln(w)
	}
	if len(matches) == 0 {
		fmt.Fprintln(w, "No matching handlers")
		return
	}
	if c.Explain {
		fmt.Fprintf(w, "%s, in dispatch order:\n", plural.Of(len(matches), "matching handler"))
	}
	for _, t := range matches {
		fmt.Fprintln(w, name(t))
	}
}

// readEvent returns the event text and where it came from, for messages.
func (c *MatchCmd) readEvent() (src []byte, from string, err error) {
	switch {
	case c.Event != "":
		return []byte(c.Event), "--event", nil
	case c.File != "" && c.File != "-":
		f, err := os.Open(c.File)
		if err != nil {
			return nil, "", usagef("--file: %v", err)
		}
		defer f.Close()
		src, err := readLimited(f, c.File)
		return src, c.File, err
	}
	if c.File == "" {
		if st, err := os.Stdin.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			return nil, "", usagef("no event: give --event JSON or --file FILE, or pipe the event on stdin")
		}
	}
	src, err = readLimited(os.Stdin, "stdin")
	return src, "stdin", err
}

func readLimited(r io.Reader, name string) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxEventBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read event from %s: %w", name, err)
	}
	if len(b) > maxEventBytes {
		return nil, usagef("event in %s is larger than %d MiB", name, maxEventBytes>>20)
	}
	return b, nil
}

// Help is shown by relay match --help.
func (c *MatchCmd) Help() string {
	return `A dry run of matching: prints the app/handler targets the event would run, in dispatch order (apps by name, rules by declaration), or "No matching handlers". With --explain every rule of every app is shown with each condition matched or not, and why. One event needs neither Redis nor containerd.

Examples:

    relay match --apps ./apps --event '{"event_name":"INSERT","table_name":"users"}'
    relay match --explain --file event.json
    redis-cli XRANGE events <id> <id> | tail -1 | relay match --explain    # an event from the stream, via stdin

With --backtest N it instead matches the newest N entries still in REDIS_STREAM (at most 10000, read with XREVRANGE; no consumer group is read or changed) and prints every rule in dispatch order with how many of them it matched and its newest matches, then how many entries matched some rule, none, or were malformed:

    relay match --backtest 1000 --apps ./apps
    relay match --backtest 10000 --app orders --first 10
    relay match --backtest 500 --json | jq '.rules[] | select(.matches == 0)'`
}

// warnUnavailable warns of every unavailable app of apps and returns
// which apps are available, by name.
func warnUnavailable(w io.Writer, apps *app.Set) map[string]bool {
	available := make(map[string]bool)
	for _, a := range apps.List() {
		available[a.Name] = a.Available()
		if !a.Available() {
			fmt.Fprintf(w, "relay: warning: app %q is unavailable (%s; see relay validate): its handlers do not run, and only its rules without errors are matched\n",
				a.Name, plural.Of(len(a.Errors), "template error"))
		}
	}
	return available
}

// maxFirst bounds --first.
const maxFirst = 100

type backtestJSON struct {
	Stream string `json:"stream"`
	Window int    `json:"window"`
	Now    string `json:"now"`
	backtest.Result
}

// backtest is relay match --backtest: every loaded rule (or --app's)
// against the newest entries of the stream (docs/console.md#backtesting-patterns).
func (c *MatchCmd) backtest(ctx context.Context, g *Globals) error {
	if c.Backtest == nil {
		return usagef("--app selects the rules of --backtest; give --backtest N too")
	}
	n := *c.Backtest
	switch {
	case n < 1 || n > backtest.MaxWindow:
		return usagef("--backtest %d: the window is 1 to %d entries", n, backtest.MaxWindow)
	case c.First < 0 || c.First > maxFirst:
		return usagef("--first %d: want 0 to %d", c.First, maxFirst)
	case c.Explain:
		return usagef("--explain explains one event; with --backtest, try the event with relay match --event")
	}
	now, err := c.parseNow()
	if err != nil {
		return err
	}
	if err := g.requireStream(false); err != nil {
		return err
	}
	apps, err := g.loadApps()
	if err != nil {
		return err
	}
	if len(apps.List()) == 0 {
		return errNoApps(g.Apps)
	}
	if c.App != "" {
		a := apps.Get(c.App)
		if a == nil {
			var names []string
			for _, a := range apps.List() {
				names = append(names, a.Name)
			}
			return usagef("--app %q: no such app in %s (apps: %s)", c.App, g.Apps, strings.Join(names, ", "))
		}
		if apps, err = app.Loaded([]*app.App{a}); err != nil {
			return err
		}
	}
	available := warnUnavailable(g.stderr, apps)
	rc, err := g.streamClient(ctx)
	if err != nil {
		return err
	}
	defer rc.Close()
	res, err := backtest.Run(ctx, rc, g.RedisStream, apps, n, c.First, int(c.MaxEventBytes), now)
	if err != nil {
		return fmt.Errorf("redis at %s: %w", redactURI(g.RedisURI), err)
	}
	if c.JSON {
		return writeJSON(g.stdout, backtestJSON{Stream: g.RedisStream, Window: n, Now: now.UTC().Format(time.RFC3339Nano), Result: res})
	}
	w := g.stdout
	fmt.Fprintf(w, "The newest %s of stream %s", plural.Of(res.Examined, "entry"), textsafe.Escape(g.RedisStream, false))
	if res.Examined > 0 {
		fmt.Fprintf(w, " (%s back to %s)", res.Newest, res.Oldest)
	}
	if res.Examined < n {
		fmt.Fprintf(w, ", all it holds")
	}
	fmt.Fprintf(w, ": %d matched a rule, %d matched none, %d malformed\n\n", res.Matched, res.Unmatched, res.Malformed)
	rows := make([][]string, 0, len(res.Rules))
	for _, r := range res.Rules {
		name := r.App + "/" + r.Handler
		if !available[r.App] {
			name += " (app unavailable)"
		}
		ids := "-"
		if len(r.First) > 0 {
			ids = r.First[0].ID
			for _, m := range r.First[1:] {
				ids += " " + m.ID
			}
		}
		rows = append(rows, []string{name, fmt.Sprint(r.Matches), ids})
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "No event rules loaded")
		return nil
	}
	return table(w, []string{"RULE", "MATCHED", "NEWEST MATCHES"}, rows)
}
