package template

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/runtime"
)

// maxTemplateBytes and maxTemplateLines bound what a hostile template can
// make us parse: the YAML parser's time grows with the square of a block
// mapping's keys (about a second for 5,000 on a busy 2-core machine, 75
// seconds for the 87,000 that fit in 1 MiB), and every worker parses every
// template at each rescan.
const (
	maxTemplateBytes = 1 << 20
	maxTemplateLines = 5000
)

// LoadDir loads every app under root: each direct child directory holding
// template.yaml (docs/apps.md). A directory without a
// template is ignored. An invalid template does not fail the load: the app
// is returned unavailable with its errors, so the others keep running. The
// error is non-nil only when root itself cannot be read.
func LoadDir(root string, opts ...Option) (*app.Set, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("read apps root: %w", err)
	}
	var apps []*app.App
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		if !e.IsDir() {
			// Follow a symlink to a directory, as operators mount apps that way.
			st, err := os.Stat(dir)
			if err != nil || !st.IsDir() {
				continue
			}
		}
		if a, ok := LoadApp(dir, opts...); ok {
			apps = append(apps, a)
		}
	}
	return app.Loaded(apps)
}

// Option changes what LoadDir and LoadApp check.
type Option func(*options)

type options struct {
	secretsDir string
}

// WithSecretsDir also checks that every secret an app names is a regular
// file (or a link to one) in dir, the worker's secrets directory, as
// `relay validate --secrets-dir` does (docs/apps.md "Secrets"). A secret
// that is not is an error at the position where the template names it.
// Without it secrets are checked only by name: the worker checks the
// files when it prepares the app.
func WithSecretsDir(dir string) Option { return func(o *options) { o.secretsDir = dir } }

// LoadApp loads the app in dir; ok is false when dir has no template.yaml.
// Template errors are reported in app.Errors, never as a failure to load.
func LoadApp(dir string, opts ...Option) (a *app.App, ok bool) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	name := filepath.Base(dir)
	file := name + "/" + app.TemplateFile
	// Incomplete until the template has been parsed and every rule read.
	a = &app.App{Name: name, File: file, Incomplete: true}
	abs, err := filepath.Abs(dir)
	if err != nil {
		abs = dir
	}
	a.Spec.Dir = abs
	path := filepath.Join(dir, app.TemplateFile)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		if li, lerr := os.Lstat(path); lerr == nil && li.Mode()&fs.ModeSymlink != 0 {
			// Not an app without a template: its events must wait, not
			// be acknowledged as unmatched.
			a.Errors.Add(file, 1, 1, "", "template is a symbolic link to a file that does not exist")
			return a, true
		}
		return nil, false
	}
	if err == nil && !insideDir(dir, path) {
		// Its content would be echoed in error messages: whoever can write
		// the apps root must not read any file of the worker's user.
		a.Errors.Add(file, 1, 1, "", "template is a symbolic link to a file outside the app directory; copy the file in instead")
		return a, true
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
		a.Errors.Add(file, 1, 1, "", "template must be a regular file, not "+kind)
		return a, true
	}
	var f *os.File
	if err == nil {
		f, err = os.Open(path)
	}
	if err != nil {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("cannot read template: %v", err))
		return a, true
	}
	defer f.Close()
	src, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("cannot read template: %v", err))
		return a, true
	}
	if parseSource(a, src, o) {
		loadDeps(a, dir)
	}
	a.Errors.Sort()
	return a, true
}

// parseSource checks the template source src of a within the bounds of
// hostile input and parses it into a; false when it was refused before
// parsing.
func parseSource(a *app.App, src []byte, o options) bool {
	file, name := a.File, a.Name
	sum := sha256.Sum256(src)
	a.Digest = hex.EncodeToString(sum[:])
	if len(src) > maxTemplateBytes {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("template is larger than %d bytes", maxTemplateBytes))
		return false
	}
	if n := bytes.Count(src, []byte("\n")); n > maxTemplateLines {
		a.Errors.Add(file, maxTemplateLines+1, 1, "", fmt.Sprintf("template has %d lines, more than %d: split the app, or write long lists and maps in flow style ([a, b], {k: v})", n, maxTemplateLines))
		return false
	}
	if line, col, c, bad := invalidUTF8(src); bad {
		// The YAML parser would read each invalid byte as U+FFFD, so a
		// pattern would match other text than the file holds.
		a.Errors.Add(file, line, col, "", fmt.Sprintf("template is not valid UTF-8 (byte %#x); save it as UTF-8", c))
		return false
	}
	if !app.ValidName(name) {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("app name %q (the directory name) must match [a-z0-9][a-z0-9._-]* and be at most 63 characters; rename the directory", name))
	}
	if line, col, msg := checkNesting(src); msg != "" {
		a.Errors.Add(file, line, col, "", msg)
		return false
	}
	if line, col, msg := yamlpattern.CheckBounds(src); msg != "" {
		hint := "flatten it"
		if strings.HasPrefix(msg, "has ") {
			hint = "split the app"
		}
		a.Errors.Add(file, line, col, "", "template "+msg+"; "+hint)
		return false
	}
	parseTemplate(a, src, o)
	return true
}

// invalidUTF8 returns the line and column (in characters, 1-based) of the
// first byte of src that is not valid UTF-8, and that byte.
func invalidUTF8(src []byte) (line, col int, c byte, bad bool) {
	line, col = 1, 1
	// The parser does not see a byte order mark; columns do not count it.
	src = bytes.TrimPrefix(src, []byte("\xef\xbb\xbf"))
	for i := 0; i < len(src); {
		r, n := utf8.DecodeRune(src[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			return line, col, src[i], true
		case r == '\n':
			line, col = line+1, 1
		default:
			col++
		}
		i += n
	}
	return 0, 0, 0, false
}

// Nesting limits checked before YAML parsing: the parser's memory grows
// quickly with depth, and no real template comes near these.
const (
	maxFlowDepth = yamlpattern.MaxFlowDepth
	maxIndent    = yamlpattern.MaxIndent
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

var runtimes = []string{runtime.RuntimePython3, runtime.RuntimeNode, runtime.RuntimeGo}

func validRuntime(r string) bool { return slices.Contains(runtimes, r) }

// Dir is an apps root read as a source of apps: it implements
// worker.AppSource, loading the root anew on each Load (LoadDir).
type Dir string

// Load loads every app under the root (LoadDir).
func (d Dir) Load(context.Context) (*app.Set, error) { return LoadDir(string(d)) }
