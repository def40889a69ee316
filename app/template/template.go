package template

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/distribution/reference"
	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"
	"github.com/goccy/go-yaml/token"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
	"github.com/relaydev/relay/runtime"
)

// tpl walks one template's YAML AST, collecting positioned errors. Walking
// the AST rather than decoding into structs is what lets every error name
// file:line:col and reject unknown keys.
type tpl struct {
	file string
	opts options
	errs *matcher.ErrorList
	// declared counts event rules and schedules written, valid or not.
	declared int
	// unreadRules is set when some event rule could not be read.
	unreadRules bool
	// longEnv lists the env values and handler names that make a variable
	// longer than a process can be given; parseTemplate reports them once
	// it knows the app's handlers are not Go functions.
	longEnv []longVar
	// top holds the flow-control defaults written at the top level, rules
	// the flow-control keys of each event rule; resolveLimits combines
	// them once the whole template is read. reportedTop records the
	// top-level keys a combination error was already reported at.
	top         *limitKeys
	rules       []*limitKeys
	reportedTop map[string]bool
	// badConcurrency is set when the app's concurrency is invalid.
	badConcurrency bool
}

// longVar is a variable NAME=value of size bytes, from the node n at path.
type longVar struct {
	n          ast.Node
	path, name string
	size       int
}

// maxEnvVar is the most bytes of one NAME=value variable or one argument,
// its terminating NUL included, that Linux passes to a process
// (MAX_ARG_STRLEN): a longer one fails every start with E2BIG.
const maxEnvVar = 128 << 10

// checkEnvVar records name=value at n when it is too long for a process.
func (t *tpl) checkEnvVar(n ast.Node, path, name, value string) {
	if size := len(name) + 1 + len(value); size+1 > maxEnvVar {
		t.longEnv = append(t.longEnv, longVar{n: n, path: path, name: name, size: size})
	}
}

func (t *tpl) errorf(n ast.Node, path, format string, args ...any) {
	line, col := 0, 0
	if n != nil {
		line, col = yamlpattern.NodePos(n)
	}
	t.errs.Add(t.file, line, col, path, fmt.Sprintf(format, args...))
}

// field is one key of a mapping, with its position.
type field struct {
	key   string
	keyN  ast.Node
	value ast.Node
}

// mapping returns the key/value pairs of a mapping node, reporting
// duplicate keys and non-mapping nodes. ok is false when n is not a mapping.
func (t *tpl) mapping(n ast.Node, path, what string) (fields []field, ok bool) {
	n = unwrap(n)
	switch m := n.(type) {
	case *ast.MappingNode:
		seen := map[string]bool{}
		for _, v := range m.Values {
			if v.Key.IsMergeKey() {
				t.errorf(v.Key, path, "YAML merge keys (<<) are not supported in templates; write the keys out")
				continue
			}
			k, kok := scalarKey(v.Key)
			if !kok {
				t.errorf(v.Key, path, "the keys of %s must be plain strings", what)
				continue
			}
			if seen[k] {
				t.errorf(v.Key, join(path, k), "duplicate key %q", k)
				continue
			}
			seen[k] = true
			fields = append(fields, field{key: k, keyN: v.Key, value: v.Value})
		}
		return fields, true
	case *ast.MappingValueNode:
		return t.mapping(&ast.MappingNode{BaseNode: m.BaseNode, Values: []*ast.MappingValueNode{m}}, path, what)
	case *ast.AliasNode:
		t.errorf(n, path, "YAML aliases are not supported in templates; write the value out")
		return nil, false
	case nil:
		t.errorf(nil, path, "%s must be a mapping", what)
		return nil, false
	}
	t.errorf(n, path, "%s must be a mapping, not %s", what, describe(n))
	return nil, false
}

func unwrap(n ast.Node) ast.Node {
	for {
		switch v := n.(type) {
		case *ast.MappingKeyNode:
			n = v.Value
		case *ast.DocumentNode:
			n = v.Body
		case *ast.AnchorNode:
			n = v.Value
		default:
			return n
		}
	}
}

func scalarKey(k ast.MapKeyNode) (string, bool) {
	switch v := unwrap(k).(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.IntegerNode, *ast.FloatNode, *ast.BoolNode:
		return v.GetToken().Value, true
	}
	return "", false
}

func describe(n ast.Node) string {
	switch n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		return "a mapping"
	case *ast.SequenceNode:
		return "a list"
	case *ast.NullNode:
		return "null"
	case *ast.StringNode, *ast.LiteralNode:
		return "a string"
	case *ast.IntegerNode, *ast.FloatNode:
		return "a number"
	case *ast.InfinityNode, *ast.NanNode:
		return "the non-finite number " + n.GetToken().Value
	case *ast.BoolNode:
		return "a boolean"
	case *ast.AliasNode:
		return "a YAML alias (aliases are not supported in templates; write the value out)"
	case *ast.TagNode:
		return "a tagged value"
	}
	return "an unsupported node"
}

// describeScalar is describe with a string's value, which tells an author
// who wrote 1e9 or 0x10 why YAML did not read a number there.
func describeScalar(n ast.Node) string {
	if v, ok := n.(*ast.StringNode); ok {
		return fmt.Sprintf("the string %q", v.Value)
	}
	return describe(n)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func (t *tpl) str(n ast.Node, path string) (string, bool) {
	switch v := unwrap(n).(type) {
	case *ast.StringNode:
		return v.Value, true
	case *ast.LiteralNode:
		return v.Value.Value, true
	}
	t.errorf(n, path, "must be a string, not %s", describe(unwrap(n)))
	return "", false
}

func (t *tpl) integer(n ast.Node, path string) (int64, bool) {
	if v, ok := unwrap(n).(*ast.IntegerNode); ok {
		switch x := v.Value.(type) {
		case int64:
			return x, true
		case uint64:
			if x <= math.MaxInt64 {
				return int64(x), true
			}
		}
		t.errorf(n, path, "integer out of range")
		return 0, false
	}
	what := describeScalar(unwrap(n))
	if _, isFloat := unwrap(n).(*ast.FloatNode); isFloat {
		what = "the fraction " + n.GetToken().Value
	}
	t.errorf(n, path, "must be a whole number, not %s", what)
	return 0, false
}

func (t *tpl) boolean(n ast.Node, path string) (bool, bool) {
	if v, ok := unwrap(n).(*ast.BoolNode); ok {
		return v.Value, true
	}
	t.errorf(n, path, "must be true or false, not %s", describe(unwrap(n)))
	return false, false
}

func (t *tpl) number(n ast.Node, path string) (float64, bool) {
	switch v := unwrap(n).(type) {
	case *ast.IntegerNode:
		// The value YAML read, as integer does: the text may be 0x10 or
		// 1_000, which ParseFloat refuses.
		switch x := v.Value.(type) {
		case int64:
			return float64(x), true
		case uint64:
			return float64(x), true
		}
		t.errorf(n, path, "must be a number, not %s", v.GetToken().Value)
		return 0, false
	case *ast.FloatNode:
		return v.Value, true
	case *ast.InfinityNode, *ast.NanNode:
		t.errorf(n, path, "must be a finite number, not %s", v.GetToken().Value)
		return 0, false
	}
	t.errorf(n, path, "must be a number, not %s", describeScalar(unwrap(n)))
	return 0, false
}

func (t *tpl) duration(n ast.Node, path string, def time.Duration) time.Duration {
	switch v := unwrap(n).(type) {
	case *ast.IntegerNode, *ast.FloatNode:
		t.errorf(n, path, "a duration needs a unit: write %ss for seconds (Go duration syntax, such as 30s, 2m or 1m30s)", v.GetToken().Value)
		return def
	}
	s, ok := t.str(n, path)
	if !ok {
		return def
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		t.errorf(n, path, "invalid duration %q: write a Go duration such as 30s, 2m or 1m30s", s)
	case d <= 0:
		t.errorf(n, path, "timeout must be > 0")
	case d > app.MaxTimeout:
		t.errorf(n, path, "timeout %s is longer than the maximum %s", d, app.MaxTimeout)
	default:
		return d
	}
	return def
}

func (t *tpl) retries(n ast.Node, path string) int {
	v, ok := t.integer(n, path)
	if !ok {
		return app.DefaultRetries
	}
	if v < 0 || v > app.MaxRetries {
		t.errorf(n, path, "retries must be between 0 and %d", app.MaxRetries)
		return app.DefaultRetries
	}
	return int(v)
}

// notRefChar reports a character outside every part of an OCI reference
// (name, tag, digest).
func notRefChar(r rune) bool {
	return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("._-/:@", r))
}

// parseTemplate fills app from template source, adding every error found.
func parseTemplate(a *app.App, src []byte, opts options) {
	t := &tpl{file: a.File, opts: opts, errs: &a.Errors, top: newLimitKeys(""), reportedTop: map[string]bool{}}
	a.Concurrency = app.DefaultConcurrency
	a.Spec.MemoryBytes = app.DefaultMemoryBytes
	a.Spec.CPUs = app.DefaultCPUs
	a.Spec.PIDs = app.DefaultPIDs
	a.Spec.Network = "none"

	fields, ok := t.document(src)
	if !ok {
		return
	}
	var top topNodes
	for _, fl := range fields {
		t.topField(a, fl, &top)
	}
	t.resolveLimits(a)
	if top.runtime == nil && top.image == nil {
		t.errs.Add(t.file, 1, 1, "", "set image (an OCI reference) or runtime (python3, node, or go for Go functions)")
	}
	if a.Spec.Runtime == runtime.RuntimeGo {
		t.goOnly(top)
	} else {
		for _, v := range t.longEnv {
			if v.name == runtime.EnvHandler {
				t.errorf(v.n, v.path, "%s would be %d bytes (RELAY_HANDLER=name), more than the %d a process environment holds per variable; shorten the handler name", v.name, v.size, maxEnvVar-1)
			} else {
				t.errorf(v.n, v.path, "environment variable %s is %d bytes (NAME=value), more than the %d a process environment holds per variable; put the value in a file of the app", v.name, v.size, maxEnvVar-1)
			}
		}
	}
	if top.runtime != nil && top.command != nil {
		t.errorf(top.command, "command", "command is only allowed without runtime: the runtime's bootstrap runs the handler")
	}
	if top.runtime == nil && a.Spec.Warm {
		t.errorf(top.warm, "warm", "warm: true is only allowed with runtime (python3 or node): an image's own command runs once per invocation")
	}
	a.Incomplete = t.unreadRules
	if t.declared == 0 {
		t.errs.Add(t.file, 1, 1, "", "an app needs at least one event rule (events) or schedule (schedules)")
	}
}

// goOnly adds an error for every container setting of a `runtime: go`
// app, whose handlers are Go functions in the worker's process
// (docs/apps.md#go-handlers).
func (t *tpl) goOnly(top topNodes) {
	for _, f := range []struct {
		key string
		n   ast.Node
	}{{"image", top.image}, {"command", top.command}, {"warm", top.warm}, {"resources", top.resources},
		{"network", top.network}, {"secrets", top.secrets}} {
		if f.n != nil {
			t.errorf(f.n, f.key, "%s configures a container; runtime: go runs Go functions in the worker's process, which have none", f.key)
		}
	}
}

// document parses src as one YAML document holding a mapping and returns
// its fields; ok is false after adding the error that says why not.
func (t *tpl) document(src []byte) (fields []field, ok bool) {
	// Some editors on Windows start files with a UTF-8 byte order mark,
	// which YAML would take for part of the first key.
	src = bytes.TrimPrefix(src, []byte("\xef\xbb\xbf"))
	f, err := parser.ParseBytes(src, 0)
	if err != nil {
		var ye interface {
			GetToken() *token.Token
			GetMessage() string
		}
		if errors.As(err, &ye) && ye.GetToken() != nil {
			p := ye.GetToken().Position
			t.errs.Add(t.file, p.Line, p.Column, "", "YAML syntax error: "+ye.GetMessage())
		} else {
			t.errs.Add(t.file, 1, 1, "", "YAML syntax error: "+err.Error())
		}
		return nil, false
	}
	if len(f.Docs) != 1 || f.Docs[0] == nil || f.Docs[0].Body == nil {
		t.errs.Add(t.file, 1, 1, "", "template must be one YAML document holding a mapping")
		return nil, false
	}
	return t.mapping(f.Docs[0].Body, "", "template")
}

// topNodes are the top-level values whose combination parseTemplate checks
// once every key is read; nil when absent.
type topNodes struct {
	image, command, runtime, warm ast.Node
	// resources, network and secrets configure a container.
	resources, network, secrets ast.Node
}

// topField reads one top-level key of the template into a.
func (t *tpl) topField(a *app.App, fl field, top *topNodes) {
	switch fl.key {
	case "runtime":
		top.runtime = fl.value
		if s, ok := t.str(fl.value, "runtime"); ok {
			if !validRuntime(s) {
				t.errorf(fl.value, "runtime", "unknown runtime %q: use python3, node or go, or omit runtime and set image", s)
			}
			a.Spec.Runtime = s
		}
	case "image":
		top.image = fl.value
		if s, ok := t.str(fl.value, "image"); ok {
			t.checkImage(fl.value, s)
			a.Spec.Image = s
		}
	case "command":
		top.command = fl.value
		a.Spec.Command = t.stringList(fl.value, "command")
		t.checkArgs(fl.value, a.Spec.Command)
	case "concurrency":
		if v, ok := t.integer(fl.value, "concurrency"); ok {
			if v <= 0 || v > app.MaxConcurrency {
				t.errorf(fl.value, "concurrency", "concurrency must be a positive integer (at most %d)", app.MaxConcurrency)
				t.badConcurrency = true
			} else {
				a.Concurrency = int(v)
			}
		} else {
			t.badConcurrency = true
		}
	case "warm":
		top.warm = fl.value
		if b, ok := t.boolean(fl.value, "warm"); ok {
			a.Spec.Warm = b
		}
	case "resources":
		top.resources = fl.value
		t.resources(a, fl.value)
	case "network":
		top.network = fl.value
		if s, ok := t.str(fl.value, "network"); ok {
			if s != "none" && s != "host" {
				t.errorf(fl.value, "network", "network must be none or host, not %q", s)
			}
			a.Spec.Network = s
		}
	case "env":
		t.env(a, fl.value)
	case "secrets":
		top.secrets = fl.value
		t.secrets(a, fl.value)
	case "events":
		t.events(a, fl.value)
	case "schedules":
		t.schedules(a, fl.value)
	default:
		if !t.topLimitField(fl) {
			t.errorf(fl.keyN, fl.key, "unknown key %q%s", fl.key, suggest(fl.key, templateKeys))
		}
	}
}

// checkImage adds an error when image s (at n) is not an OCI reference.
func (t *tpl) checkImage(n ast.Node, s string) {
	if s == "" || strings.IndexFunc(s, isSpace) >= 0 {
		t.errorf(n, "image", "image must be an OCI reference such as docker.io/library/busybox:1.36")
	} else if i := strings.IndexFunc(s, notRefChar); i >= 0 {
		r, _ := utf8.DecodeRuneInString(s[i:])
		t.errorf(n, "image", "%q contains %q, which no OCI reference can; use e.g. docker.io/library/busybox:1.36", s, r)
	} else if _, err := reference.ParseDockerRef(s); err != nil {
		// The runtime parses it the same way; caught here, the app is
		// refused at load instead of holding every message.
		t.errorf(n, "image", "%q is not a valid OCI reference (%v); use e.g. docker.io/library/busybox:1.36", s, err)
	}
}

// templateKeys are the keys of a template's top level, as an unknown
// key's error lists them: concurrency_scope and concurrency_key are rule
// keys, refused at the top with an error of their own.
var templateKeys = []string{"runtime", "image", "command", "concurrency", "warm", "resources", "network", "env", "secrets", "events", "schedules",
	"rate", "rate_burst", "rate_key", "debounce", "max_age"}

// ruleKeys are the keys of an event rule.
var ruleKeys = append([]string{"handler", "pattern", "timeout", "retries"}, flowKeys...)

// secrets reads the names of the app's secrets, files of the secrets
// directory mounted at /run/secrets (docs/apps.md "Secrets").
func (t *tpl) secrets(a *app.App, n ast.Node) {
	seq, ok := unwrap(n).(*ast.SequenceNode)
	if !ok {
		t.errorf(n, "secrets", "secrets must be a list of secret names, not %s", describe(unwrap(n)))
		return
	}
	seen := map[string]bool{}
	for i, v := range seq.Values {
		p := fmt.Sprintf("secrets[%d]", i)
		s, ok := t.str(v, p)
		if !ok {
			continue
		}
		if err := runtime.CheckSecretName(s); err != nil {
			t.errorf(v, p, "%v", err)
			continue
		}
		if seen[s] {
			t.errorf(v, p, "secret %q is listed twice", s)
			continue
		}
		seen[s] = true
		if t.opts.secretsDir != "" {
			if msg := secretFileProblem(t.opts.secretsDir, s); msg != "" {
				t.errorf(v, p, "%s", msg)
			}
		}
		a.Spec.Secrets = append(a.Spec.Secrets, s)
	}
}

// checkArgs adds an error for each argument of command (at n) that no
// process can be given: every run would fail to start.
func (t *tpl) checkArgs(n ast.Node, command []string) {
	seq, ok := unwrap(n).(*ast.SequenceNode)
	if !ok || len(seq.Values) != len(command) {
		return // stringList reported it
	}
	for i, arg := range command {
		p := fmt.Sprintf("command[%d]", i)
		switch {
		case strings.IndexByte(arg, 0) >= 0:
			t.errorf(seq.Values[i], p, "command argument contains a NUL byte, which no process can be given")
		case len(arg)+1 > maxEnvVar:
			t.errorf(seq.Values[i], p, "command argument is %d bytes, more than the %d a process can be given per argument", len(arg), maxEnvVar-1)
		}
	}
}

func (t *tpl) stringList(n ast.Node, path string) []string {
	seq, ok := unwrap(n).(*ast.SequenceNode)
	if !ok {
		t.errorf(n, path, "must be a list of strings, not %s", describe(unwrap(n)))
		return nil
	}
	if len(seq.Values) == 0 {
		t.errorf(n, path, "must not be empty")
	}
	out := make([]string, 0, len(seq.Values))
	for i, v := range seq.Values {
		if s, ok := t.str(v, fmt.Sprintf("%s[%d]", path, i)); ok {
			out = append(out, s)
		}
	}
	return out
}

func (t *tpl) resources(a *app.App, n ast.Node) {
	fields, ok := t.mapping(n, "resources", "resources")
	if !ok {
		return
	}
	var tmpNode ast.Node
	for _, fl := range fields {
		p := "resources." + fl.key
		switch fl.key {
		case "memory", "tmp":
			if s, ok := t.str(fl.value, p); ok {
				if b, err := app.ParseSize(fl.key, s); err != nil {
					t.errorf(fl.value, p, "%v", err)
				} else if fl.key == "memory" {
					a.Spec.MemoryBytes = b
				} else {
					a.Spec.TmpBytes, tmpNode = b, fl.value
				}
			}
		case "cpus":
			if v, ok := t.number(fl.value, p); ok {
				if !(v > 0) || v > 1024 {
					t.errorf(fl.value, p, "cpus must be a number > 0 and at most 1024, not %s", fl.value.GetToken().Value)
				} else {
					a.Spec.CPUs = v
				}
			}
		case "pids":
			if v, ok := t.integer(fl.value, p); ok {
				if v <= 0 {
					t.errorf(fl.value, p, "pids must be a positive integer")
				} else {
					a.Spec.PIDs = v
				}
			}
		default:
			t.errorf(fl.keyN, p, "unknown key %q%s", fl.key, suggest(fl.key, []string{"memory", "tmp", "cpus", "pids"}))
		}
	}
	// /tmp is a tmpfs whose files count against the memory limit
	// (docs/apps.md): larger, it could never fill before the limit kills.
	if a.Spec.TmpBytes > a.Spec.MemoryBytes {
		t.errorf(tmpNode, "resources.tmp", "tmp %s is larger than memory %s; files in /tmp count against the memory limit, so tmp must be at most memory",
			runtime.FormatSize(a.Spec.TmpBytes), runtime.FormatSize(a.Spec.MemoryBytes))
	}
}

func (t *tpl) env(a *app.App, n ast.Node) {
	fields, ok := t.mapping(n, "env", "env")
	if !ok {
		return
	}
	a.Spec.Env = make(map[string]string, len(fields))
	for _, fl := range fields {
		p := "env." + fl.key
		switch {
		case !envNameRE.MatchString(fl.key):
			t.errorf(fl.keyN, p, "environment variable name %q must match [A-Za-z_][A-Za-z0-9_]*", fl.key)
			continue
		case strings.HasPrefix(fl.key, "RELAY_"):
			t.errorf(fl.keyN, p, "environment variable names starting with RELAY_ are reserved for Relay")
			continue
		}
		var v string
		switch n := unwrap(fl.value).(type) {
		case *ast.StringNode:
			v = n.Value
		case *ast.LiteralNode:
			v = n.Value.Value
		case *ast.MappingNode, *ast.MappingValueNode, *ast.SequenceNode, *ast.AliasNode:
			t.errorf(fl.value, p, "environment values must be strings, not %s", describe(n))
			continue
		default:
			t.errorf(fl.value, p, "environment values must be strings; quote it: %s: %q", fl.key, n.GetToken().Value)
			continue
		}
		if strings.IndexByte(v, 0) >= 0 {
			// The kernel cannot pass it: every run would fail to start.
			t.errorf(fl.value, p, "environment value of %s contains a NUL byte, which no process environment can hold", fl.key)
			continue
		}
		t.checkEnvVar(fl.value, p, fl.key, v)
		a.Spec.Env[fl.key] = v
	}
}

func (t *tpl) events(a *app.App, n ast.Node) {
	seq, ok := unwrap(n).(*ast.SequenceNode)
	if !ok {
		t.errorf(n, "events", "events must be a list of rules, not %s", describe(unwrap(n)))
		t.unreadRules = true
		return
	}
	defer func() {
		if len(a.Rules) < len(seq.Values) {
			t.unreadRules = true
		}
	}()
	seen := map[string]string{}
	t.declared += len(seq.Values)
	for i, item := range seq.Values {
		path := fmt.Sprintf("events[%d]", i)
		fields, ok := t.mapping(item, path, "an event rule")
		if !ok {
			continue
		}
		r := app.Rule{Timeout: app.DefaultTimeout, Retries: app.DefaultRetries}
		rk := newLimitKeys(path)
		t.rules = append(t.rules, rk)
		var handlerN, patternN ast.Node
		for _, fl := range fields {
			p := path + "." + fl.key
			switch fl.key {
			case "handler":
				handlerN = fl.value
				if s, ok := t.str(fl.value, p); ok {
					if err := app.ValidateHandler(s); err != nil {
						t.errorf(fl.value, p, "%s", err)
					} else if prev, dup := seen[s]; dup {
						t.errorf(fl.value, p, "handler %q is already used by %s; event handler names are unique within an app", s, prev)
					} else {
						seen[s] = path
						t.checkEnvVar(fl.value, p, runtime.EnvHandler, s)
					}
					r.Handler = s
				}
			case "pattern":
				patternN = fl.value
			case "timeout":
				r.Timeout = t.duration(fl.value, p, app.DefaultTimeout)
			case "retries":
				r.Retries = t.retries(fl.value, p)
			default:
				if slices.Contains(flowKeys, fl.key) {
					t.limitField(rk, fl, p)
				} else {
					t.errorf(fl.keyN, p, "unknown key %q%s", fl.key, suggest(fl.key, ruleKeys))
				}
			}
		}
		if handlerN == nil {
			t.errorf(item, path, "missing handler: write handler: module.function")
		}
		if patternN == nil {
			t.errorf(item, path, "missing pattern: every rule needs a pattern")
			continue
		}
		pat, errs := yamlpattern.ParseNode(t.file, path+".pattern", patternN)
		*t.errs = append(*t.errs, errs...)
		// A rule whose pattern parsed takes part in matching even when
		// other keys are wrong: its app is unavailable, so its messages
		// stay pending instead of being acknowledged as unmatched.
		if pat != nil && len(errs) == 0 {
			r.Pattern = pat
			rk.index = len(a.Rules)
			a.Rules = append(a.Rules, r)
		}
	}
}

// suggest returns ` (did you mean "x"?)` for a key close to a known one.
func suggest(key string, known []string) string {
	best, bestD := "", 3
	lower := strings.ToLower(key)
	for _, k := range known {
		d := editDistance(lower, k)
		if commonPrefix(lower, k) >= 4 {
			d = min(d, 2) // "retry" for "retries", "resource" for "resources"
		}
		if d < bestD {
			best, bestD = k, d
		}
	}
	if best == "" {
		return "; allowed keys: " + strings.Join(known, ", ")
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func commonPrefix(a, b string) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
