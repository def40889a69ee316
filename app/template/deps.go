package template

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode/utf8"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
)

// maxManifestBytes bounds a dependency manifest or lockfile.
const maxManifestBytes = 16 << 20

// loadDeps reads the dependency manifest of a's language runtime from dir
// into a.Spec.Deps, adding an error for a manifest that is unreadable or
// not well formed, or a node manifest without its lockfile
// (docs/runtimes.md "Dependencies"). Apps without a runtime have none.
func loadDeps(a *app.App, dir string) {
	prefix := a.Name + "/"
	switch a.Spec.Runtime {
	case runtime.RuntimePython3:
		data, ok := readManifest(a, dir, runtime.PythonManifest)
		if data == nil || !ok {
			return
		}
		if !checkRequirements(a, prefix+runtime.PythonManifest, data) {
			return
		}
		a.Spec.Deps = &runtime.Deps{Manifest: runtime.PythonManifest, ManifestData: data}
	case runtime.RuntimeNode:
		data, ok := readManifest(a, dir, runtime.NodeManifest)
		if data == nil || !ok {
			return
		}
		file := prefix + runtime.NodeManifest
		var pkg map[string]json.RawMessage
		if err := json.Unmarshal(data, &pkg); err != nil {
			line, col := jsonErrorPos(data, err)
			a.Errors.Add(file, line, col, "", fmt.Sprintf("package.json is not a JSON object: %v", err))
			return
		}
		lock, ok := readManifest(a, dir, runtime.NodeLockfile)
		if !ok {
			return
		}
		if lock == nil {
			a.Errors.Add(file, 1, 1, "", "package.json needs a package-lock.json beside it, so that every build installs the same packages: run npm install --package-lock-only in the app directory and add the file")
			return
		}
		var lk struct {
			LockfileVersion *int `json:"lockfileVersion"`
		}
		lockFile := prefix + runtime.NodeLockfile
		if err := json.Unmarshal(lock, &lk); err != nil {
			line, col := jsonErrorPos(lock, err)
			a.Errors.Add(lockFile, line, col, "", fmt.Sprintf("package-lock.json is not a JSON object: %v", err))
			return
		}
		if lk.LockfileVersion == nil {
			a.Errors.Add(lockFile, 1, 1, "", "package-lock.json has no lockfileVersion: regenerate it with npm install --package-lock-only")
			return
		}
		a.Spec.Deps = &runtime.Deps{Manifest: runtime.NodeManifest, ManifestData: data,
			Lockfile: runtime.NodeLockfile, LockfileData: lock}
	}
}

// readManifest reads name in dir: nil data when it does not exist; ok false
// (with an error added to a) when it cannot be read.
func readManifest(a *app.App, dir, name string) (data []byte, ok bool) {
	file := a.Name + "/" + name
	path := filepath.Join(dir, name)
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, true
	}
	switch {
	case err != nil:
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("cannot read %s: %v", name, err))
		return nil, false
	case !insideDir(dir, path):
		a.Errors.Add(file, 1, 1, "", name+" is a symbolic link to a file outside the app directory; copy the file in instead")
		return nil, false
	case !fi.Mode().IsRegular():
		a.Errors.Add(file, 1, 1, "", name+" must be a regular file")
		return nil, false
	case fi.Size() > maxManifestBytes:
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("%s is larger than %d bytes", name, maxManifestBytes))
		return nil, false
	}
	f, err := os.Open(path)
	if err == nil {
		defer f.Close()
		data, err = io.ReadAll(io.LimitReader(f, maxManifestBytes+1))
	}
	if err != nil {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("cannot read %s: %v", name, err))
		return nil, false
	}
	if len(data) > maxManifestBytes {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("%s is larger than %d bytes", name, maxManifestBytes))
		return nil, false
	}
	return data, true
}

// requirementRE matches one requirement of requirements.txt: a project
// name, optional extras, then nothing or a version specifier, an
// environment marker or a direct reference (@ URL).
var requirementRE = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?\s*(\[[A-Za-z0-9._,\s-]*\])?\s*(([=!<>~]=?=?|@|;).*)?$`)

// pipLongOptions are the long options pip accepts in a requirements file
// (pip's requirements file format: its global options, and the
// per-requirement --hash and --config-settings), and pipShortOptions the
// short ones, by the long option each stands for.
var (
	pipLongOptions = []string{
		"index-url", "pypi-url", "extra-index-url", "no-index", "constraint", "requirement", "editable",
		"find-links", "no-binary", "only-binary", "prefer-binary", "require-hashes", "no-require-hashes",
		"pre", "all-releases", "only-final", "trusted-host", "use-feature", "hash", "config-settings",
		"install-option", "global-option", // per requirement in older pips (Debian 12 has 23.0)
	}
	pipShortOptions = map[byte]string{
		'i': "index-url", 'c': "constraint", 'r': "requirement", 'e': "editable", 'f': "find-links", 'C': "config-settings",
	}
)

const pipOptionsHint = "; a requirements file takes --index-url, --extra-index-url, --no-index, --find-links (-f), --trusted-host, --pre, --prefer-binary, --only-binary, --no-binary, --require-hashes, --use-feature, -r URL and -c URL, and after a requirement --hash and --config-settings"

// pipOption reads the option that starts line, a requirements file line
// or word starting with '-', as pip does: its long name (an unambiguous
// prefix of a long option is that option) and the value written in the
// same word (--name=value, -Xvalue), or what is wrong with its name.
func pipOption(line string) (name, value, problem string) {
	word, _, _ := strings.Cut(strings.ReplaceAll(line, "\t", " "), " ")
	long, isLong := strings.CutPrefix(word, "--")
	if !isLong {
		if len(word) >= 2 {
			if name, ok := pipShortOptions[word[1]]; ok {
				return name, word[2:], ""
			}
		}
		return "", "", fmt.Sprintf("unknown pip option %q%s", word[:min(len(word), 2)], pipOptionsHint)
	}
	long, value, _ = strings.Cut(long, "=")
	var matches []string
	for _, o := range pipLongOptions {
		if o == long {
			return o, value, ""
		}
		if long != "" && strings.HasPrefix(o, long) {
			matches = append(matches, "--"+o)
		}
	}
	switch len(matches) {
	case 1:
		return matches[0][2:], value, ""
	case 0:
		return "", "", fmt.Sprintf("unknown pip option %q%s", "--"+long, pipOptionsHint)
	}
	return "", "", fmt.Sprintf("pip option %q is ambiguous: %s", "--"+long, strings.Join(matches, ", "))
}

// includedFile says what is wrong with line, a pip option line pipOption
// knows, when it is -r or -c naming a file of the app, or returns "": the
// dependency build gets requirements.txt alone, so pip would not find the
// file (docs/runtimes.md#dependencies), and the dependency image's key
// would not change with it. A URL is fetched by pip and passes.
func includedFile(line string) string {
	name, value, _ := pipOption(line)
	if name != "requirement" && name != "constraint" {
		return ""
	}
	written := "--" + name
	if !strings.HasPrefix(line, "--") {
		written = line[:2]
	}
	if value == "" {
		_, value, _ = strings.Cut(strings.ReplaceAll(line, "\t", " "), " ")
	}
	value = strings.TrimSpace(value)
	if strings.Contains(value, "://") {
		return ""
	}
	return fmt.Sprintf("%s %s: the dependency build gets requirements.txt alone, not the files it names; list those requirements in requirements.txt", written, value)
}

// checkRequirements checks every line of a requirements.txt: blank,
// comment, pip option (starting with '-') or requirement. It adds one
// error per bad line and reports whether there was none.
func checkRequirements(a *app.App, file string, data []byte) bool {
	if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 {
		a.Errors.Add(file, 1, 1, "", "requirements.txt must be UTF-8 text")
		return false
	}
	ok := true
	lines := strings.Split(string(data), "\n")
	for i := 0; i < len(lines); i++ {
		lineNo := i + 1
		line := strings.TrimRight(lines[i], "\r")
		// starts[k] is where line k of a continued line begins in line.
		starts := []int{0}
		for strings.HasSuffix(line, "\\") && i+1 < len(lines) {
			i++
			line = strings.TrimSuffix(line, "\\")
			starts = append(starts, len(line))
			line += strings.TrimRight(lines[i], "\r")
		}
		// pos is the file position of offset off of line.
		pos := func(off int) (int, int) {
			k := 0
			for k+1 < len(starts) && starts[k+1] <= off {
				k++
			}
			return lineNo + k, off - starts[k] + 1
		}
		if j := strings.Index(line, "#"); j == 0 || j > 0 && (line[j-1] == ' ' || line[j-1] == '\t') {
			line = line[:j]
		}
		trimmed := strings.TrimSpace(line)
		col := strings.Index(line, trimmed) + 1
		switch {
		case trimmed == "":
		case strings.HasPrefix(trimmed, "-e ") || strings.HasPrefix(trimmed, "--editable"):
			a.Errors.Add(file, lineNo, col, "", "editable requirements (-e) cannot be installed into a dependency layer; name the package or a wheel instead")
			ok = false
		case strings.HasPrefix(trimmed, "-"):
			// A pip option (--find-links wheels, --no-index, -r other.txt):
			// pip checks its value at build time; a name pip would refuse
			// is caught here, before any build.
			if _, _, msg := pipOption(trimmed); msg != "" {
				a.Errors.Add(file, lineNo, col, "", msg)
				ok = false
			} else if msg := includedFile(trimmed); msg != "" {
				a.Errors.Add(file, lineNo, col, "", msg)
				ok = false
			}
		default:
			// A requirement, then its options (--hash=...): like pip, the
			// options start at the first word that starts with '-'.
			req, opts := trimmed, ""
			if j := strings.Index(trimmed, " -"); j >= 0 {
				req, opts = strings.TrimSpace(trimmed[:j]), trimmed[j+1:]
			}
			isPath := strings.HasPrefix(req, "./") || strings.HasPrefix(req, "/") || strings.Contains(req, "://")
			if !isPath && !requirementRE.MatchString(req) {
				a.Errors.Add(file, lineNo, col, "", fmt.Sprintf("%q is not a requirement: write name==version (for example requests==2.32.3), a pip option or a comment", trimmed))
				ok = false
				continue
			}
			for off := len(line) - len(strings.TrimLeft(line, " \t")) + len(trimmed) - len(opts); opts != ""; {
				word, rest, _ := strings.Cut(opts, " ")
				if strings.HasPrefix(word, "-") {
					if _, _, msg := pipOption(word); msg != "" {
						l, c := pos(off)
						a.Errors.Add(file, l, c, "", msg)
						ok = false
					}
				}
				skip := len(opts) - len(strings.TrimLeft(rest, " \t"))
				off, opts = off+skip, strings.TrimLeft(rest, " \t")
			}
		}
	}
	return ok
}

// jsonErrorPos returns the line and column of a JSON syntax error in data
// (1:1 for other errors).
func jsonErrorPos(data []byte, err error) (line, col int) {
	var se *json.SyntaxError
	if !errors.As(err, &se) {
		return 1, 1
	}
	// Offset counts the bytes read, one past the offending one.
	off := int(min(max(se.Offset-1, 0), int64(len(data))))
	line = 1 + bytes.Count(data[:off], []byte("\n"))
	col = off - bytes.LastIndexByte(data[:off], '\n')
	return line, col
}

// secretFileProblem says what is wrong with secret name as a file of dir,
// the secrets directory, or returns "" when it is a regular file there
// (docs/apps.md "Secrets").
func secretFileProblem(dir, name string) string {
	fi, err := os.Stat(filepath.Join(dir, name))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return fmt.Sprintf("secret %q: no file %s in the secrets directory %s", name, name, dir)
	case err != nil:
		return fmt.Sprintf("secret %q in the secrets directory %s: %v", name, dir, err)
	case fi.IsDir():
		return fmt.Sprintf("secret %q: %s in the secrets directory %s is a directory, not a file", name, name, dir)
	case !fi.Mode().IsRegular():
		// The worker reads only regular files (docs/apps.md#secrets).
		return fmt.Sprintf("secret %q: %s in the secrets directory %s is not a regular file (%s)", name, name, dir, fi.Mode().Type())
	}
	return ""
}
