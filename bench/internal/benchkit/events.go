package benchkit

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/ctxtime"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/stream"
)

// AppName is the benchmark app; HandlerName is its one rule's handler.
const (
	AppName     = "bench"
	HandlerName = "users.insert"
)

// Event returns the i-th benchmark event: a change-data-capture record
// like the README's, about 100 bytes, that the benchmark rule matches.
func Event(i int) string {
	return fmt.Sprintf(`{"event_name":"INSERT","table_name":"users","new_image":{"id":%d,"email":"user%d@example.com","plan":"free"}}`, i, i)
}

// Unmatched returns the i-th event that the benchmark rule does not match:
// the same record from another table.
func Unmatched(i int) string {
	return fmt.Sprintf(`{"event_name":"INSERT","table_name":"orders","new_image":{"id":%d,"email":"user%d@example.com","plan":"free"}}`, i, i)
}

// Matches reports whether event i of a stream filled with unmatchedPct
// percent of unmatched events (FillMix) matches the benchmark rule.
func Matches(i, unmatchedPct int) bool { return i%100 >= unmatchedPct }

// AppSpec describes the one app the benchmarks load.
type AppSpec struct {
	// Concurrency is the app's concurrency key (1 to 10000).
	Concurrency int
	// Image and Command are the template's image and command; a runtime.Func
	// handler ignores them, but the template requires an image.
	Image   string
	Command []string
	// Runtime, when set ("python3" or "node"), makes the app a
	// language-runtime app whose handler is the function insert of
	// users.py or users.js, which does nothing; Warm adds warm: true.
	// Command is ignored then.
	Runtime string
	Warm    bool
	// Timeout is the rule's timeout, a Go duration ("30s").
	Timeout string
	// Retries, when set, is the rule's retries ("0": a failed attempt is
	// dead-lettered at once); "" keeps the default.
	Retries string
}

// pythonHandler is the handler module of a python3 bench app: HandlerName
// ("users.insert") names the function insert of users.py.
const pythonHandler = "def insert(event):\n    pass\n"

// nodeHandler is the handler module of a node bench app.
const nodeHandler = "exports.insert = function (event) {};\n"

// WriteApps writes an apps root under dir holding the benchmark app, whose
// single rule matches every Event, and returns the root.
func WriteApps(dir string, spec AppSpec) (string, error) {
	root := filepath.Join(dir, "apps")
	appDir := filepath.Join(root, AppName)
	if err := os.MkdirAll(appDir, 0o755); err != nil {
		return "", fmt.Errorf("write bench app: %w", err)
	}
	// The containerd runner mounts the app directory as uid 65534, which
	// must be able to read it: MkdirTemp makes dir 0700.
	for _, d := range []string{dir, root, appDir} {
		if err := os.Chmod(d, 0o755); err != nil {
			return "", fmt.Errorf("write bench app: %w", err)
		}
	}
	if spec.Timeout == "" {
		spec.Timeout = "30s"
	}
	var b strings.Builder
	switch {
	case spec.Runtime != "":
		fmt.Fprintf(&b, "runtime: %s\n", spec.Runtime)
		if spec.Image != "" {
			fmt.Fprintf(&b, "image: %s\n", spec.Image)
		}
		if spec.Warm {
			b.WriteString("warm: true\n")
		}
		file, src := "users.py", pythonHandler
		if spec.Runtime == "node" {
			file, src = "users.js", nodeHandler
		}
		if err := os.WriteFile(filepath.Join(appDir, file), []byte(src), 0o644); err != nil {
			return "", fmt.Errorf("write bench app: %w", err)
		}
	default:
		if spec.Image == "" {
			spec.Image = "relay.local/busybox:latest"
		}
		fmt.Fprintf(&b, "image: %s\n", spec.Image)
		if len(spec.Command) > 0 {
			fmt.Fprintf(&b, "command: [%s]\n", quoteList(spec.Command))
		}
	}
	fmt.Fprintf(&b, "concurrency: %d\n", max(spec.Concurrency, 1))
	fmt.Fprintf(&b, "events:\n  - handler: %s\n    timeout: %s\n    pattern: {event_name: [INSERT], table_name: [users]}\n", HandlerName, spec.Timeout)
	if spec.Retries != "" {
		fmt.Fprintf(&b, "    retries: %s\n", spec.Retries)
	}
	if err := os.WriteFile(filepath.Join(appDir, app.TemplateFile), []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("write bench app: %w", err)
	}
	return root, nil
}

func quoteList(args []string) string {
	q := make([]string, len(args))
	for i, a := range args {
		q[i] = fmt.Sprintf("%q", a)
	}
	return strings.Join(q, ", ")
}

// LoadApps loads the apps root written by WriteApps and fails unless the
// benchmark app is available.
func LoadApps(root string) (*app.Set, error) {
	apps, err := template.LoadDir(root)
	if err != nil {
		return nil, fmt.Errorf("load bench apps %s: %w", root, err)
	}
	a := apps.Get(AppName)
	if a == nil {
		return nil, fmt.Errorf("load bench apps %s: no app %q", root, AppName)
	}
	if !a.Available() {
		return nil, fmt.Errorf("load bench apps %s: %w", root, a.Errors.Err())
	}
	return apps, nil
}

// Fill appends n events (Event(from) to Event(from+n-1)) to name in
// pipelined batches of 500 and returns the id of the last one.
func Fill(ctx context.Context, c rueidis.Client, name string, from, n int) (string, error) {
	return FillMix(ctx, c, name, from, n, 0)
}

// FillMix is Fill with unmatchedPct percent of the events (those for which
// Matches is false) replaced by Unmatched ones.
func FillMix(ctx context.Context, c rueidis.Client, name string, from, n, unmatchedPct int) (string, error) {
	var last string
	for done := 0; done < n; {
		batch := min(500, n-done)
		cmds := make(rueidis.Commands, 0, batch)
		for i := range batch {
			ev := Event(from + done + i)
			if !Matches(from+done+i, unmatchedPct) {
				ev = Unmatched(from + done + i)
			}
			cmds = append(cmds, c.B().Xadd().Key(name).Id("*").FieldValue().FieldValue("event", ev).Build())
		}
		for _, res := range c.DoMulti(ctx, cmds...) {
			id, err := res.ToString()
			if err != nil {
				return "", fmt.Errorf("fill stream %s: %w", name, err)
			}
			last = id
		}
		done += batch
	}
	return last, nil
}

// Settled reports whether group has delivered every entry of name up to
// last and none is pending: the stream is drained.
func Settled(ctx context.Context, c rueidis.Client, name, group, last string) (bool, error) {
	b := c.B()
	res := c.DoMulti(ctx, b.Xpending().Key(name).Group(group).Build(), b.XinfoGroups().Key(name).Build())
	summary, err := res[0].ToArray()
	if err != nil {
		return false, fmt.Errorf("xpending %s %s: %w", name, group, err)
	}
	if len(summary) == 0 {
		return false, fmt.Errorf("xpending %s %s: empty reply", name, group)
	}
	if n, err := summary[0].AsInt64(); err != nil || n != 0 {
		return false, err
	}
	groups, err := res[1].ToArray()
	if err != nil {
		return false, fmt.Errorf("xinfo groups %s: %w", name, err)
	}
	for _, g := range groups {
		m, err := g.AsMap()
		if err != nil {
			return false, fmt.Errorf("xinfo groups %s: %w", name, err)
		}
		gname, delivered := m["name"], m["last-delivered-id"]
		if s, _ := gname.ToString(); s != group {
			continue
		}
		l, _ := delivered.ToString()
		return stream.CompareID(l, last) >= 0, nil
	}
	return false, fmt.Errorf("xinfo groups %s: no group %q", name, group)
}

// SettledCommands is the number of Redis commands one Settled call sends,
// to subtract from command counts taken while polling it.
var SettledCommands = map[string]int{"xpending": 1, "xinfo|groups": 1}

// PendingOf returns how many entries of group's PEL consumer owns
// (XPENDING summary, per consumer).
func PendingOf(ctx context.Context, c rueidis.Client, name, group, consumer string) (int64, error) {
	summary, err := c.Do(ctx, c.B().Xpending().Key(name).Group(group).Build()).ToArray()
	if err != nil {
		return 0, fmt.Errorf("xpending %s %s: %w", name, group, err)
	}
	if len(summary) < 4 {
		return 0, nil
	}
	rows, err := summary[3].ToArray()
	if err != nil {
		if rueidis.IsRedisNil(err) {
			return 0, nil
		}
		return 0, fmt.Errorf("xpending %s %s: consumers: %w", name, group, err)
	}
	for _, row := range rows {
		f, err := row.AsStrSlice()
		if err != nil || len(f) != 2 {
			return 0, fmt.Errorf("xpending %s %s: malformed consumer row", name, group)
		}
		if f[0] == consumer {
			var n int64
			_, err := fmt.Sscan(f[1], &n)
			return n, err
		}
	}
	return 0, nil
}

// Feed publishes the i-th benchmark event (Event) to stream at start +
// i/rate, from the calling goroutine, until ctx ends; published, when not
// nil, counts the events added. It returns nil once ctx ends, or the
// first XADD error.
func Feed(ctx context.Context, c rueidis.Client, stream string, rate int, start time.Time, published *atomic.Int64) error {
	for i := 0; ; i++ {
		at := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
		if !ctxtime.Sleep(ctx, time.Until(at)) {
			return nil
		}
		cmd := c.B().Xadd().Key(stream).Id("*").FieldValue().FieldValue("event", Event(i)).Build()
		if err := c.Do(ctx, cmd).Error(); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		if published != nil {
			published.Store(int64(i + 1))
		}
	}
}
