package relay

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode"

	"github.com/relaydev/relay/invocation"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
)

// Template defaults and limits (reference.md "Apps and template.yaml").
const (
	DefaultAppConcurrency = 2
	DefaultTimeout        = 30 * time.Second
	MaxTimeout            = 15 * time.Minute
	DefaultRetries        = invocation.DefaultRetries
	DefaultMemoryBytes    = 128 << 20
	DefaultCPUs           = 1.0
	DefaultPIDs           = 128
	// TemplateFile is the name of an app's template inside its directory.
	TemplateFile = "template.yaml"
	// maxTemplateBytes bounds what a hostile template can make us parse.
	maxTemplateBytes = 1 << 20
)

var appNameRE = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]*$`)

// ValidAppName reports whether name is a valid app or schedule name:
// [a-z0-9][a-z0-9._-]*, at most 63 characters.
func ValidAppName(name string) bool {
	return len(name) <= 63 && appNameRE.MatchString(name)
}

// App is one loaded app. An app whose template has errors is unavailable:
// its rules that did parse still take part in matching (so their messages
// stay pending instead of being acknowledged as unmatched), but none of its
// handlers run (events.md "Delivery, retry, and ACK").
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
	// Incomplete is set when some of the app's event rules could not be
	// read (the template is unreadable or not valid YAML, or a rule's
	// pattern is broken). Relay then cannot tell which events the app
	// would match, so no message may be acknowledged as unmatched or
	// finished: every message stays pending until the template is fixed.
	Incomplete bool
}

// Available reports whether the app's handlers may run.
func (a *App) Available() bool { return len(a.Errors) == 0 }

// Rule is one event rule of an app.
type Rule struct {
	// Handler is "module.function", unique within the app.
	Handler string
	Pattern *matcher.Pattern
	// Timeout bounds one attempt, in (0, MaxTimeout].
	Timeout time.Duration
	// Retries is how many times a failed invocation is retried (attempts =
	// Retries+1).
	Retries int
}

// Schedule is one cron schedule of an app (reference.md "Schedules").
type Schedule struct {
	Name     string
	Handler  string
	Cron     string
	Timezone *time.Location
	Timeout  time.Duration
	Retries  int
}

// Apps is an immutable set of apps in sorted name order. Safe for
// concurrent use.
type Apps struct {
	list   []*App
	byName map[string]*App
}

// NewApps builds a set from apps defined in Go (for example by an embedding
// service with runtime.Func handlers). Names must be valid and unique.
func NewApps(apps ...*App) (*Apps, error) {
	s := &Apps{byName: make(map[string]*App, len(apps))}
	for _, a := range apps {
		if !ValidAppName(a.Name) {
			return nil, fmt.Errorf("relay: app name %q: must match [a-z0-9][a-z0-9._-]* and be at most 63 characters", a.Name)
		}
		if _, dup := s.byName[a.Name]; dup {
			return nil, fmt.Errorf("relay: app %q defined twice", a.Name)
		}
		if a.Concurrency <= 0 {
			a.Concurrency = DefaultAppConcurrency
		}
		if a.Spec.Warm && a.Spec.Runtime == "" {
			return nil, fmt.Errorf("relay: app %q: Spec.Warm needs Spec.Runtime (python3 or node)", a.Name)
		}
		seen := map[string]bool{}
		for i, r := range a.Rules {
			if r.Pattern == nil {
				return nil, fmt.Errorf("relay: app %q rule %d (%s): nil pattern", a.Name, i, r.Handler)
			}
			if seen[r.Handler] {
				return nil, fmt.Errorf("relay: app %q: handler %q defined twice", a.Name, r.Handler)
			}
			seen[r.Handler] = true
			if r.Timeout <= 0 {
				a.Rules[i].Timeout = DefaultTimeout
			}
			if r.Retries < 0 {
				return nil, fmt.Errorf("relay: app %q handler %q: retries must be >= 0", a.Name, r.Handler)
			}
		}
		s.byName[a.Name] = a
		s.list = append(s.list, a)
	}
	sort.Slice(s.list, func(i, j int) bool { return s.list[i].Name < s.list[j].Name })
	return s, nil
}

// List returns the apps in sorted name order.
func (s *Apps) List() []*App { return s.list }

// Get returns the named app or nil.
func (s *Apps) Get(name string) *App { return s.byName[name] }

// ruleIndex returns the index of the rule of handler in a's events, or -1;
// -1 for a nil a.
func (a *App) ruleIndex(handler string) int {
	if a == nil {
		return -1
	}
	return slices.IndexFunc(a.Rules, func(r Rule) bool { return r.Handler == handler })
}

// Errors returns the template errors of every app, in app order.
func (s *Apps) Errors() matcher.ErrorList {
	var all matcher.ErrorList
	for _, a := range s.list {
		all = append(all, a.Errors...)
	}
	return all
}

// Rules returns every rule with a pattern, apps in sorted name order and
// rules in declaration order: the dispatch order of events.md.
func (s *Apps) Rules() []matcher.Rule {
	var rules []matcher.Rule
	for _, a := range s.list {
		for _, r := range a.Rules {
			rules = append(rules, matcher.Rule{App: a.Name, Handler: r.Handler, Pattern: r.Pattern})
		}
	}
	return rules
}

// Incomplete returns the names of the apps whose rules are not all known
// (see App.Incomplete); while there are any, the Engine acknowledges no
// matched or unmatched message.
func (s *Apps) Incomplete() []string {
	var names []string
	for _, a := range s.list {
		if a.Incomplete {
			names = append(names, a.Name)
		}
	}
	return names
}

// Matcher returns the default Matcher over every rule of the set.
func (s *Apps) Matcher() Matcher { return matcher.NewSet(s.Rules()) }

// LoadApps loads every app under root: each direct child directory holding
// template.yaml (reference.md "Apps and template.yaml"). A directory without
// a template is ignored. An invalid template does not fail the load: the app
// is returned unavailable with its errors, so the others keep running. The
// error is non-nil only when root itself cannot be read.
func LoadApps(root string) (*Apps, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("read apps root: %w", err)
	}
	var apps []*App
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		if !e.IsDir() {
			// Follow a symlink to a directory, as operators mount apps that way.
			st, err := os.Stat(dir)
			if err != nil || !st.IsDir() {
				continue
			}
		}
		app, ok := LoadApp(dir)
		if ok {
			apps = append(apps, app)
		}
	}
	s := &Apps{byName: make(map[string]*App, len(apps))}
	for _, a := range apps {
		s.byName[a.Name] = a
		s.list = append(s.list, a)
	}
	sort.Slice(s.list, func(i, j int) bool { return s.list[i].Name < s.list[j].Name })
	return s, nil
}

// LoadApp loads the app in dir; ok is false when dir has no template.yaml.
// Template errors are reported in app.Errors, never as a failure to load.
func LoadApp(dir string) (app *App, ok bool) {
	name := filepath.Base(dir)
	file := name + "/" + TemplateFile
	// Incomplete until the template has been parsed and every rule read.
	app = &App{Name: name, File: file, Incomplete: true}
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	app.Spec.Dir = abs
	path := filepath.Join(dir, TemplateFile)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false
	}
	if err == nil && !insideDir(dir, path) {
		// Its content would be echoed in error messages: whoever can write
		// the apps root must not read any file of the worker's user.
		app.Errors.Add(file, 0, 0, "", "template is a symbolic link to a file outside the app directory; copy the file in instead")
		return app, true
	}
	if err == nil && !fi.Mode().IsRegular() {
		// A FIFO or device would block or never end.
		kind := "a special file"
		switch m := fi.Mode(); {
		case m.IsDir():
			kind = "a directory"
		case m&fs.ModeNamedPipe != 0:
			kind = "a named pipe"
		case m&fs.ModeDevice != 0:
			kind = "a device"
		case m&fs.ModeSocket != 0:
			kind = "a socket"
		}
		app.Errors.Add(file, 0, 0, "", "template must be a regular file, not "+kind)
		return app, true
	}
	var f *os.File
	if err == nil {
		f, err = os.Open(path)
	}
	if err != nil {
		app.Errors.Add(file, 0, 0, "", fmt.Sprintf("cannot read template: %v", err))
		return app, true
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		app.Errors.Add(file, 0, 0, "", fmt.Sprintf("cannot read template: %v", err))
		return app, true
	}
	if len(src) > maxTemplateBytes {
		app.Errors.Add(file, 1, 1, "", fmt.Sprintf("template is larger than %d bytes", maxTemplateBytes))
		return app, true
	}
	if !ValidAppName(name) {
		app.Errors.Add(file, 1, 1, "", fmt.Sprintf("app name %q (the directory name) must match [a-z0-9][a-z0-9._-]* and be at most 63 characters; rename the directory", name))
	}
	if line, col, msg := checkNesting(src); msg != "" {
		app.Errors.Add(file, line, col, "", msg)
		return app, true
	}
	parseTemplate(app, src)
	app.Errors.Sort()
	return app, true
}

// Nesting limits checked before YAML parsing: the parser's memory grows
// quickly with depth, and no real template comes near these.
const (
	maxFlowDepth = 64
	maxIndent    = 256
)

// checkNesting finds the first place where src nests flow collections
// deeper than maxFlowDepth or indents past maxIndent columns, skipping
// quoted strings and comments. It returns an empty msg when src is fine.
func checkNesting(src []byte) (line, col int, msg string) {
	depth, line, col := 0, 1, 0
	var quote byte
	lineStart := true
	for i := 0; i < len(src); i++ {
		c := src[i]
		col++
		if c == '\n' {
			line, col, lineStart = line+1, 0, true
			if quote == '\'' {
				continue
			}
			quote = 0 // double-quoted strings may span lines too, but rarely; be lenient
			continue
		}
		if lineStart {
			if c == ' ' {
				if col > maxIndent {
					return line, col, fmt.Sprintf("template is indented more than %d columns; flatten it", maxIndent)
				}
				continue
			}
			lineStart = false
		}
		switch {
		case quote != 0:
			if c == '\\' && quote == '"' {
				i++
				col++
			} else if c == quote {
				quote = 0
			}
		case c == '"' || c == '\'':
			quote = c
		case c == '#' && (i == 0 || src[i-1] == ' ' || src[i-1] == '\t'):
			for i+1 < len(src) && src[i+1] != '\n' {
				i++
			}
		case c == '[' || c == '{':
			if depth++; depth > maxFlowDepth {
				return line, col, fmt.Sprintf("template nests [ and { more than %d deep; flatten it", maxFlowDepth)
			}
		case c == ']' || c == '}':
			depth = max(depth-1, 0)
		}
	}
	return 0, 0, ""
}

// validHandler checks "module.function": split at the last dot, both parts
// non-empty, no whitespace.
func validHandler(h string) string {
	if h == "" {
		return "handler must not be empty; write module.function"
	}
	if strings.IndexFunc(h, isSpace) >= 0 {
		return fmt.Sprintf("handler %q must not contain whitespace", h)
	}
	i := strings.LastIndexByte(h, '.')
	if i <= 0 || i == len(h)-1 {
		return fmt.Sprintf("handler %q must be module.function (split at the last dot, both parts non-empty)", h)
	}
	// The module names code under /app; a path that leaves it, or a
	// Python module path with empty parts, fails only at run time.
	if strings.HasPrefix(h, "/") || strings.HasPrefix(h, ".") || strings.Contains(h, "..") || strings.Contains(h, "/.") ||
		strings.IndexFunc(h, unicode.IsControl) >= 0 {
		return fmt.Sprintf("handler %q: the module must be a path inside the app (no leading / or ., no .. or empty parts, no control characters)", h)
	}
	return ""
}

// insideDir reports whether path, with every symbolic link resolved, lies
// in dir (also resolved). Links within the app directory are fine: a
// Kubernetes ConfigMap volume is made of them.
func insideDir(dir, path string) bool {
	d, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return false
	}
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return false
	}
	rel, err := filepath.Rel(d, p)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator))
}

func isSpace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || r == '\v' || r == '\f'
}

var envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

var runtimes = []string{"python3", "node"}

func validRuntime(r string) bool { return slices.Contains(runtimes, r) }
