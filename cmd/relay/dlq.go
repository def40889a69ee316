package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/internal/reltime"
	"github.com/relaydev/relay/internal/textsafe"

	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/redisdlq"
	"github.com/relaydev/relay/manual"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/stream"
)

// DLQCmd groups the dead-letter queue commands.
type DLQCmd struct {
	Ls      DLQLsCmd      `cmd:"" help:"List dead-letter entries, oldest first."`
	Inspect DLQInspectCmd `cmd:"" help:"Show every field of one entry and its event, pretty-printed."`
	Replay  DLQReplayCmd  `cmd:"" help:"Run an entry's handler once more with its event; delete the entry on success."`
	Rm      DLQRmCmd      `cmd:"" help:"Delete entries without running anything."`
}

// DLQFilter holds the entry filters shared by ls, replay --all and rm --all.
type DLQFilter struct {
	App     string `help:"Only entries of this app (- selects malformed messages)."`
	Handler string `help:"Only entries of this handler."`
	Since   string `placeholder:"AGE|TIME" help:"Only entries written in the last AGE (90s, 30m, 12h, 7d) or since an RFC 3339 TIME."`
}

// filter builds the dlq.Filter; limit is the command's --limit.
func (f *DLQFilter) filter(limit int) (dlq.Filter, error) {
	if limit < 0 {
		return dlq.Filter{}, usagef("--limit must be >= 0")
	}
	since, err := dlq.ParseAge(f.Since, time.Now())
	if err != nil {
		return dlq.Filter{}, usagef("--since %v", err)
	}
	return dlq.Filter{App: f.App, Handler: f.Handler, Since: since, Limit: limit}, nil
}

func (f *DLQFilter) set() bool { return f.App != "" || f.Handler != "" || f.Since != "" }

// describe says which entries the filter selects, for messages.
func (f *DLQFilter) describe() string {
	var parts []string
	if f.App != "" {
		parts = append(parts, "app "+f.App)
	}
	if f.Handler != "" {
		parts = append(parts, "handler "+f.Handler)
	}
	if f.Since != "" {
		parts = append(parts, "since "+f.Since)
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// DLQRetention is the dead-letter retention the workers apply, which ls
// and inspect use to show when each entry expires.
type DLQRetention struct {
	Retention time.Duration `name:"dlq-retention" env:"REDIS_DLQ_RETENTION" default:"336h" help:"Dead-letter retention: relay start removes entries older than this; dlq ls and the console show when each expires (0: kept forever)."`
}

// expires returns when retention removes e, for a table: "in 13d", "due"
// (the next trim removes it) or "never".
func (r DLQRetention) expires(e dlq.Entry, now time.Time) string {
	at := e.Expires(r.Retention)
	switch {
	case r.Retention == 0:
		return "never"
	case at.IsZero():
		return "-"
	case !at.After(now):
		return "due"
	}
	return "in " + reltime.Age(at.Sub(now))
}

// expiresJSON is expires as an RFC 3339 time; "" when kept forever.
func (r DLQRetention) expiresJSON(e dlq.Entry) string {
	if at := e.Expires(r.Retention); !at.IsZero() {
		return at.UTC().Format(time.RFC3339Nano)
	}
	return ""
}

func (r DLQRetention) check() error {
	if r.Retention < 0 {
		return usagef("--dlq-retention must be >= 0 (0 keeps entries forever), got %s", r.Retention)
	}
	return nil
}

// dlqStore connects to Redis and returns the store of REDIS_STREAM's DLQ,
// and a function that closes the connection.
func (g *Globals) dlqStore(ctx context.Context) (*redisdlq.Store, func(), error) {
	if err := g.requireStream(false); err != nil {
		return nil, nil, err
	}
	rc, err := g.streamClient(ctx)
	if err != nil {
		return nil, nil, err
	}
	return redisdlq.NewStore(rc, g.RedisStream), rc.Close, nil
}

// notFound rewrites dlq.ErrNotFound for an operator, and says how to get
// rid of an entry that cannot be decoded (see unreadable).
func notFound(store *redisdlq.Store, err error, id string) error {
	if errors.Is(err, dlq.ErrNotFound) {
		return fmt.Errorf("no dead-letter entry %s in %s (relay dlq ls lists them)", id, store.Key())
	}
	return unreadable(err)
}

// unreadable adds to an error of redisdlq.Store.Get or List that names an entry
// dlq.Decode rejected (one written by hand or by another program) what the
// operator can do: relay dlq rm deletes it by id (docs/operations.md).
func unreadable(err error) error {
	if id, ok := dlq.IsUndecodable(err); ok {
		return fmt.Errorf("%w; relay cannot read this entry: relay dlq rm %s deletes it", err, id)
	}
	return err
}

// checkIDs rejects an argument that cannot be an entry id before Redis is
// asked: a typo is the caller's mistake (exit 2), not a missing entry.
func checkIDs(ids ...string) error {
	for _, id := range ids {
		if !stream.IsID(id) {
			return usagef("%q is not a dead-letter entry id: an id is <ms>-<seq>, e.g. 1718000000000-0 (the ID column of relay dlq ls)", id)
		}
	}
	return nil
}

// nEntries returns "1 entry" or "2 entries".
func nEntries(n int) string {
	if n == 1 {
		return "1 entry"
	}
	return strconv.Itoa(n) + " entries"
}

// DLQLsCmd is `relay dlq ls`.
type DLQLsCmd struct {
	DLQFilter    `embed:""`
	DLQRetention `embed:""`
	Limit        int  `default:"100" help:"At most this many entries (0: all)."`
	JSON         bool `name:"json" help:"Print JSON instead of a table."`
}

// Help shows examples under relay dlq ls --help.
func (c *DLQLsCmd) Help() string {
	return `The table shows ID ORIGINAL APP HANDLER ATTEMPTS AGE EXPIRES REASON; AGE is the time since the entry was written, EXPIRES when the workers' retention (REDIS_DLQ_RETENTION, default 336h) removes it ("due": at their next trim). Malformed messages have app and handler "-".

Examples:

    relay dlq ls
    relay dlq ls --app billing --since 1h
    relay dlq ls --limit 0 --json | jq -r '.[].id'`
}

type dlqJSON struct {
	ID              string `json:"id"`
	OriginalStream  string `json:"original_stream"`
	OriginalID      string `json:"original_id"`
	Group           string `json:"group"`
	Consumer        string `json:"consumer"`
	App             string `json:"app"`
	Handler         string `json:"handler"`
	HandlerAttempts int    `json:"handler_attempts"`
	Deliveries      int64  `json:"deliveries"`
	Reason          string `json:"reason"`
	Timestamp       string `json:"timestamp"`
	Event           string `json:"event"`
	Trace           string `json:"trace,omitempty"`
	Expires         string `json:"expires,omitempty"` // absent when kept forever
	// Replays is the entry's replay history (inspect only), absent when
	// it was never replayed without success.
	Replays *replaysJSON `json:"replays,omitempty"`
}

type replaysJSON struct {
	Count      int64  `json:"count"`
	LastAt     string `json:"last_at"`
	LastResult string `json:"last_result"`
	LastError  string `json:"last_error"`
}

// replaysText is an entry's replay history on one line.
func replaysText(h dlq.Replays, now time.Time) string {
	if h.Count == 0 {
		return "none"
	}
	return fmt.Sprintf("%d without success; the last %s ago (%s): %s: %s", h.Count, reltime.Age(now.Sub(h.LastAt)),
		h.LastAt.UTC().Format(time.RFC3339), h.LastResult, h.LastError)
}

func entryJSON(e dlq.Entry, r DLQRetention) dlqJSON {
	return dlqJSON{ID: e.ID, OriginalStream: e.OriginalStream, OriginalID: e.OriginalID, Group: e.Group,
		Consumer: e.Consumer, App: e.App, Handler: e.Handler, HandlerAttempts: e.HandlerAttempts,
		Deliveries: e.Deliveries, Reason: e.Reason, Timestamp: e.Timestamp.UTC().Format(time.RFC3339Nano),
		Event: e.Event, Trace: e.Trace, Expires: r.expiresJSON(e)}
}

// Run lists entries as ID ORIGINAL APP HANDLER ATTEMPTS AGE EXPIRES REASON.
func (c *DLQLsCmd) Run(ctx context.Context, g *Globals) error {
	f, err := c.filter(c.Limit)
	if err != nil {
		return err
	}
	if err := c.check(); err != nil {
		return err
	}
	store, closeStore, err := g.dlqStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	entries, err := store.List(ctx, f)
	if err != nil {
		return unreadable(err)
	}
	switch {
	case c.JSON:
		out := make([]dlqJSON, 0, len(entries))
		for _, e := range entries {
			out = append(out, entryJSON(e, c.DLQRetention))
		}
		err = writeJSON(g.stdout, out)
	case len(entries) == 0:
		fmt.Fprintf(g.stdout, "No dead-letter entries%s\n", c.describe())
	default:
		err = entryTable(g.stdout, entries, &c.DLQRetention)
	}
	if err == nil && c.Limit > 0 && len(entries) == c.Limit {
		// A note, not an error: the listing itself succeeded.
		fmt.Fprintf(g.stderr, "relay: showing the oldest %s; --limit 0 lists all\n", nEntries(c.Limit))
	}
	return err
}

// entryTable lists entries; with a retention, an EXPIRES column too.
func entryTable(w io.Writer, entries []dlq.Entry, r *DLQRetention) error {
	header := []string{"ID", "ORIGINAL", "APP", "HANDLER", "ATTEMPTS", "AGE"}
	if r != nil {
		header = append(header, "EXPIRES")
	}
	header = append(header, "REASON")
	now := time.Now()
	rows := make([][]string, 0, len(entries))
	for _, e := range entries {
		row := []string{e.ID, e.OriginalID, e.App, e.Handler, strconv.Itoa(e.HandlerAttempts), reltime.Age(now.Sub(e.Timestamp))}
		if r != nil {
			row = append(row, r.expires(e, now))
		}
		rows = append(rows, append(row, oneLine(e.Reason, 60)))
	}
	return table(w, header, rows)
}

// DLQInspectCmd is `relay dlq inspect ID`.
type DLQInspectCmd struct {
	ID           string `arg:"" help:"Entry ID (the ID column of relay dlq ls)."`
	JSON         bool   `name:"json" help:"Print JSON instead of text."`
	DLQRetention `embed:""`
}

// Help shows examples under relay dlq inspect --help.
func (c *DLQInspectCmd) Help() string {
	return `Examples:

    relay dlq inspect 1718000000000-0
    relay dlq inspect 1718000000000-0 --json | jq -r .event`
}

// Run prints every field of the entry and its event, pretty-printed.
func (c *DLQInspectCmd) Run(ctx context.Context, g *Globals) error {
	if err := c.check(); err != nil {
		return err
	}
	if err := checkIDs(c.ID); err != nil {
		return err
	}
	store, closeStore, err := g.dlqStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	e, err := store.Get(ctx, c.ID)
	if err != nil {
		return notFound(store, err, c.ID)
	}
	h, err := store.Replays(ctx, e.ID)
	if err != nil {
		return err
	}
	if c.JSON {
		out := entryJSON(e, c.DLQRetention)
		if h.Count > 0 {
			out.Replays = &replaysJSON{h.Count, h.LastAt.Format(time.RFC3339Nano), h.LastResult, h.LastError}
		}
		return writeJSON(g.stdout, out)
	}
	written := "-"
	if !e.Timestamp.IsZero() {
		written = fmt.Sprintf("%s ago (%s)", reltime.Age(time.Since(e.Timestamp)), e.Timestamp.UTC().Format(time.RFC3339))
	}
	expires := c.expires(e, time.Now())
	if at := e.Expires(c.Retention); !at.IsZero() {
		expires += " (" + at.UTC().Format(time.RFC3339) + ")"
	}
	trace := e.Trace
	if trace == "" {
		trace = "-"
	}
	rows := [][]string{
		{"Written:", written},
		{"Expires:", expires},
		{"Original stream:", e.OriginalStream},
		{"Original ID:", e.OriginalID},
		{"Group:", e.Group},
		{"Consumer:", e.Consumer},
		{"App:", e.App},
		{"Handler:", e.Handler},
		{"Handler attempts:", strconv.Itoa(e.HandlerAttempts)},
		{"Replays:", replaysText(h, time.Now())},
		{"Deliveries:", strconv.FormatInt(e.Deliveries, 10)},
		{"Reason:", e.Reason},
		{"Trace:", trace},
	}
	if err := table(g.stdout, []string{"ID:", e.ID}, rows); err != nil {
		return err
	}
	fmt.Fprintln(g.stdout, "Event:")
	fmt.Fprintln(g.stdout, prettyEvent(e.Event))
	if e.App == dlq.MalformedName {
		fmt.Fprintf(g.stdout, "\nThis entry records a malformed message: it has no handler and cannot be replayed. Remove it with relay dlq rm %s.\n", e.ID)
	}
	return nil
}

// prettyEvent indents a JSON event, keeping its key order and numbers;
// anything else is shown verbatim with a note, since malformed messages keep
// their original bytes, except what textsafe.Escape escapes.
func prettyEvent(event string) string {
	if strings.TrimSpace(event) == "" {
		return "(empty)"
	}
	var buf bytes.Buffer
	if json.Indent(&buf, []byte(event), "", "  ") == nil {
		// Valid JSON may still hold bytes that are not UTF-8 and C1
		// control characters inside its strings.
		return textsafe.Escape(strings.TrimSpace(buf.String()), true)
	}
	return textsafe.Escape(event, true) + "\n(not valid JSON; shown as stored, control characters and bytes that are not UTF-8 escaped)"
}

// DLQReplayCmd is `relay dlq replay`.
type DLQReplayCmd struct {
	ID          string `arg:"" optional:"" help:"Entry ID (the ID column of relay dlq ls)."`
	All         bool   `help:"Replay every entry that passes --app, --handler and --since, oldest first."`
	DLQFilter   `embed:""`
	Limit       int  `default:"0" help:"With --all, at most this many entries (0: all)."`
	JSON        bool `name:"json" help:"Print the outcome of each entry as JSON; handler output then goes to stderr."`
	RunnerFlags `embed:""`
	// The retention bounds how long a kept entry's replay history lives.
	DLQRetention `embed:""`
}

// Help shows examples under relay dlq replay --help.
func (c *DLQReplayCmd) Help() string {
	return `Runs the entry's app/handler once, outside the stream lifecycle (no retry, no new DLQ entry), through the same runtime as relay start, with the stored event on stdin and RELAY_MESSAGE_ID set to the original message ID. On success the entry is deleted; on failure it is kept and the command exits 1. Entries of malformed messages (app "-") and of handlers no longer in the apps root are refused. Replays take no lock: two replays of one entry at the same time both run it, so run one replay at a time (handlers must be idempotent anyway).

Examples:

    relay dlq replay 1718000000000-0
    relay dlq replay --all --app billing --since 1h
    relay dlq replay --all --handler invoices.charge --runner process`
}

type replayJSON struct {
	ID       string  `json:"id"`
	App      string  `json:"app"`
	Handler  string  `json:"handler"`
	Result   string  `json:"result"` // replayed, failed or refused
	Error    string  `json:"error,omitempty"`
	Duration float64 `json:"duration_seconds"`
}

// Run replays one entry, or every selected one with --all.
func (c *DLQReplayCmd) Run(ctx context.Context, g *Globals) error {
	switch {
	case c.ID == "" && !c.All:
		return usagef("give an entry ID, or --all to replay every entry that passes --app, --handler and --since")
	case c.ID != "" && c.All:
		return usagef("give an entry ID or --all, not both")
	case c.ID != "" && (c.set() || c.Limit != 0):
		return usagef("--app, --handler, --since and --limit select entries for --all; leave them out with an ID")
	case c.ID != "":
		if err := checkIDs(c.ID); err != nil {
			return err
		}
	}
	f, err := c.filter(c.Limit)
	if err != nil {
		return err
	}
	if err := c.DLQRetention.check(); err != nil {
		return err
	}
	// Each replay is a dlq.replay trace when OTEL_* names an endpoint.
	_, stopTracing, err := startTracing(ctx, g.logger())
	if err != nil {
		return err
	}
	defer stopTracing()
	store, closeStore, err := g.dlqStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	apps, err := g.loadApps()
	if err != nil {
		return err
	}
	entries, err := c.selected(ctx, store, f)
	if err != nil {
		return err
	}
	if len(entries) == 0 {
		if c.JSON {
			return writeJSON(g.stdout, []replayJSON{})
		}
		fmt.Fprintf(g.stdout, "No dead-letter entries%s\n", c.describe())
		return nil
	}

	runner := c.manualRunner(ctx, g, c.JSON)
	defer runner.Close()
	results := make([]replayJSON, 0, len(entries))
	replayed := 0
	for _, e := range entries {
		if ctx.Err() != nil {
			break
		}
		r := c.replay(ctx, g, apps, runner, store, e)
		results = append(results, r)
		if r.Result == "replayed" {
			replayed++
		}
		if runner.err != nil {
			break // the runtime is unreachable: nothing else can run either
		}
	}
	if c.JSON {
		if err := writeJSON(g.stdout, results); err != nil {
			return err
		}
	}
	return c.summary(g, entries, results, replayed)
}

// selected returns the entry given by ID, or with --all those f selects.
func (c *DLQReplayCmd) selected(ctx context.Context, store *redisdlq.Store, f dlq.Filter) ([]dlq.Entry, error) {
	if c.All {
		entries, err := store.List(ctx, f)
		if err != nil {
			return nil, unreadable(err)
		}
		return entries, nil
	}
	e, err := store.Get(ctx, c.ID)
	if err != nil {
		return nil, notFound(store, err, c.ID)
	}
	return []dlq.Entry{e}, nil
}

// summary prints the count of a replay --all and returns the command's
// error: nil when every entry was replayed.
func (c *DLQReplayCmd) summary(g *Globals, entries []dlq.Entry, results []replayJSON, replayed int) error {
	kept := len(entries) - replayed
	switch {
	case kept == 0:
		return nil
	case !c.All && len(results) == 1:
		return errors.New(results[0].Error)
	case !c.All:
		return fmt.Errorf("interrupted; %s is kept", c.ID)
	}
	if !c.JSON {
		fmt.Fprintf(g.stdout, "Replayed %d of %s; %d kept.\n", replayed, nEntries(len(entries)), kept)
	}
	if len(results) < len(entries) {
		return fmt.Errorf("%d of %s not replayed (%d not tried)", kept, nEntries(len(entries)), len(entries)-len(results))
	}
	return fmt.Errorf("%d of %s not replayed", kept, nEntries(len(entries)))
}

// replay replays one entry and returns its outcome. In text mode it prints
// the progress on stdout and, with --all, each failure; a single entry's
// failure is left to the command's error.
func (c *DLQReplayCmd) replay(ctx context.Context, g *Globals, apps *app.Set, runner relay.Runner, store *redisdlq.Store, e dlq.Entry) replayJSON {
	r := replayJSON{ID: e.ID, App: e.App, Handler: e.Handler}
	target := e.App + "/" + e.Handler
	if !c.JSON {
		// Announce the run only once Replay has accepted the entry.
		runner = observed{Runner: runner, before: func(runtime.Request) {
			fmt.Fprintf(g.stdout, "Replaying %s (%s, attempt %d)\n", e.ID, target, e.HandlerAttempts+1)
		}}
	}
	start := time.Now()
	err := manual.Invoker{Runner: runner}.Replay(ctx, apps, store, e.ID)
	took := time.Since(start)
	r.Duration = took.Seconds()
	switch {
	case err == nil:
		r.Result = "replayed"
		if !c.JSON {
			fmt.Fprintf(g.stdout, "Replayed %s (%s) in %s; entry deleted\n", e.ID, target, duration(took))
		}
		return r
	case errors.Is(err, manual.ErrReplayMalformed):
		r.Result = "refused"
		r.Error = fmt.Sprintf("%s records a malformed message (%s): there is no handler to replay; remove it with relay dlq rm %s",
			e.ID, e.Reason, e.ID)
	case errors.Is(err, manual.ErrHandlerGone):
		r.Result = "refused"
		r.Error = fmt.Sprintf("%s: handler %s is not in the apps root %s any more (relay app inspect %s lists its handlers); remove the entry with relay dlq rm %s",
			e.ID, target, g.Apps, e.App, e.ID)
	case errors.Is(err, manual.ErrAppUnavailable):
		r.Result = "refused"
		r.Error = fmt.Sprintf("%s: app %s is unavailable, its template has errors (relay validate shows them); the entry is kept", e.ID, e.App)
	case errors.Is(err, dlq.ErrNotFound):
		r.Result = "failed"
		r.Error = fmt.Sprintf("%s was removed meanwhile by someone else", e.ID)
	default:
		r.Result = "failed"
		cause := errors.Unwrap(err)
		if cause == nil {
			cause = err
		}
		r.Error = fmt.Sprintf("replay of %s (%s) failed: %v; the entry is kept", e.ID, target, cause)
	}
	if !errors.Is(err, dlq.ErrNotFound) {
		// The entry keeps the reason it was dead-lettered with; its replay
		// history, which the console shows, says what this replay met.
		if _, herr := store.RecordReplay(ctx, e.ID, time.Now(), r.Result, r.Error, c.Retention); herr != nil {
			g.logger().Warn("relay dlq replay: recording the replay failed", "id", e.ID, "error", herr)
		}
	}
	if c.All && !c.JSON {
		fmt.Fprintf(g.stdout, "%s: %s\n", strings.ToUpper(r.Result[:1])+r.Result[1:], r.Error)
	}
	return r
}

// duration rounds d for people: 12ms, 1.25s.
func duration(d time.Duration) string {
	if d >= time.Second {
		return d.Round(10 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// DLQRmCmd is `relay dlq rm`.
type DLQRmCmd struct {
	IDs       []string `arg:"" optional:"" name:"id" help:"Entry IDs (the ID column of relay dlq ls)."`
	All       bool     `help:"Delete every entry that passes --app, --handler and --since."`
	DLQFilter `embed:""`
	Limit     int  `default:"0" help:"With --all, at most this many entries, oldest first (0: all)."`
	Yes       bool `short:"y" help:"With --all, do not ask for confirmation."`
}

// Help shows examples under relay dlq rm --help.
func (c *DLQRmCmd) Help() string {
	return `Deletes entries without running their handlers. With --all the selected entries are listed and you are asked to confirm on stdin, unless --yes is given. An unknown ID is an error.

Examples:

    relay dlq rm 1718000000000-0
    relay dlq rm --all --app=- --yes          # every malformed-message entry
    relay dlq rm --all --app billing --since 7d`
}

// Run deletes the given entries, or the selected ones with --all.
func (c *DLQRmCmd) Run(ctx context.Context, g *Globals) error {
	switch {
	case len(c.IDs) == 0 && !c.All:
		return usagef("give entry IDs, or --all to delete every entry that passes --app, --handler and --since")
	case len(c.IDs) > 0 && c.All:
		return usagef("give entry IDs or --all, not both")
	case len(c.IDs) > 0 && (c.set() || c.Limit != 0 || c.Yes):
		return usagef("--app, --handler, --since, --limit and --yes go with --all; leave them out with IDs")
	}
	if err := checkIDs(c.IDs...); err != nil {
		return err
	}
	f, err := c.filter(c.Limit)
	if err != nil {
		return err
	}
	store, closeStore, err := g.dlqStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore()
	if !c.All {
		return c.removeIDs(ctx, g, store)
	}
	entries, err := store.List(ctx, f)
	if err != nil {
		return unreadable(err)
	}
	if len(entries) == 0 {
		fmt.Fprintf(g.stdout, "No dead-letter entries%s\n", c.describe())
		return nil
	}
	if !c.Yes {
		if err := c.confirm(g, entries); err != nil {
			return err
		}
	}
	deleted := 0
	var errs []error
	for _, e := range entries {
		err := store.Delete(ctx, e.ID)
		switch {
		case err == nil:
			deleted++
		case errors.Is(err, dlq.ErrNotFound):
			// Replayed or removed meanwhile: gone, as asked.
		default:
			errs = append(errs, err)
		}
	}
	fmt.Fprintf(g.stdout, "Deleted %s%s\n", nEntries(deleted), c.describe())
	return errors.Join(errs...)
}

// removeIDs deletes the entries given by id, all or nothing: a typo in
// one ID must not leave a half-done deletion behind. An entry that cannot
// be decoded exists all the same, and deleting it by id is the way to get
// rid of it. An ID given twice is one entry.
func (c *DLQRmCmd) removeIDs(ctx context.Context, g *Globals, store *redisdlq.Store) error {
	ids := make([]string, 0, len(c.IDs))
	for _, id := range c.IDs {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	var unknown []string
	for _, id := range ids {
		_, err := store.Get(ctx, id)
		if _, bad := dlq.IsUndecodable(err); bad {
			continue
		}
		if errors.Is(err, dlq.ErrNotFound) {
			unknown = append(unknown, id)
		} else if err != nil {
			return err
		}
	}
	if len(unknown) > 0 {
		return fmt.Errorf("no dead-letter entry %s in %s; nothing deleted (relay dlq ls lists them)", strings.Join(unknown, ", "), store.Key())
	}
	for _, id := range ids {
		if err := store.Delete(ctx, id); err != nil && !errors.Is(err, dlq.ErrNotFound) {
			return err
		}
		fmt.Fprintf(g.stdout, "Deleted %s\n", id)
	}
	return nil
}

// confirm lists the entries --all would delete and asks on stdin.
func (c *DLQRmCmd) confirm(g *Globals, entries []dlq.Entry) error {
	if err := entryTable(g.stdout, entries, nil); err != nil {
		return err
	}
	fmt.Fprintf(g.stdout, "Delete these %s? [y/N] ", nEntries(len(entries)))
	ok := confirmed(os.Stdin)
	if st, err := os.Stdin.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		fmt.Fprintln(g.stdout) // the answer was not typed, so no newline was echoed
	}
	if !ok {
		return errors.New("not confirmed; nothing deleted (--yes skips the question)")
	}
	return nil
}

// confirmed reads one line and reports whether it is y or yes.
func confirmed(r io.Reader) bool {
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil && line == "" {
		return false
	}
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return true
	}
	return false
}
