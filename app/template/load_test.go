package template_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/apptest"
)

func TestLoadAppDefaults(t *testing.T) {
	a := apptest.One(t, "users", `
image: relay.local/busybox:latest
events:
  - handler: events.created
    pattern: {event_name: [INSERT]}
`)
	if !a.Available() {
		t.Fatalf("errors: %v", a.Errors)
	}
	r := a.Rules[0]
	if r.Timeout != 30*time.Second || r.Retries != 4 || a.Concurrency != 2 {
		t.Errorf("defaults: timeout %s retries %d concurrency %d", r.Timeout, r.Retries, a.Concurrency)
	}
	if a.Spec.MemoryBytes != 128<<20 || a.Spec.CPUs != 1 || a.Spec.PIDs != 128 || a.Spec.TmpBytes != 0 || a.Spec.Network != "none" || a.Spec.Warm {
		t.Errorf("resource defaults: %+v", a.Spec)
	}
	if !filepath.IsAbs(a.Spec.Dir) || filepath.Base(a.Spec.Dir) != "users" {
		t.Errorf("Dir = %q", a.Spec.Dir)
	}
}

func TestLoadAppFull(t *testing.T) {
	a := apptest.One(t, "billing.v2", `
runtime: python3
concurrency: 5
warm: true
resources: {memory: 1GiB, cpus: 0.5, pids: 64, tmp: 200MiB}
network: host
env: {API_URL: "https://x", EMPTY: ""}
events:
  - handler: pkg.mod.fn
    pattern: {k: [v]}
    timeout: 15m
    retries: 0
schedules:
  - name: nightly
    handler: jobs.nightly
    cron: "0 3 * * *"
    timezone: Europe/Berlin
  - {name: hourly, handler: jobs.hourly, cron: "@hourly"}
`)
	if !a.Available() {
		t.Fatalf("errors: %v", a.Errors)
	}
	if a.Spec.Runtime != "python3" || a.Concurrency != 5 || a.Spec.MemoryBytes != 1<<30 || a.Spec.CPUs != 0.5 ||
		a.Spec.PIDs != 64 || a.Spec.TmpBytes != 200<<20 || a.Spec.Network != "host" || a.Spec.Env["API_URL"] != "https://x" || !a.Spec.Warm {
		t.Errorf("spec = %+v", a.Spec)
	}
	if r := a.Rules[0]; r.Handler != "pkg.mod.fn" || r.Timeout != 15*time.Minute || r.Retries != 0 {
		t.Errorf("rule = %+v", r)
	}
	if len(a.Schedules) != 2 || a.Schedules[0].Timezone().String() != "Europe/Berlin" || a.Schedules[0].Cron.String() == "" {
		t.Errorf("schedules = %+v", a.Schedules)
	}
}

// Each case is one invalid template and the errors it must produce, as
// "line:col: fragment".
func TestLoadAppErrors(t *testing.T) {
	cases := []struct {
		name, src string
		want      []string
	}{
		{"unknown top-level key", "image: x\nimgae: y\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:1: imgae: unknown key "imgae" (did you mean "image"?)`}},
		{"unknown rule key", "image: x\nevents:\n  - handler: a.b\n    pattern: {k: [v]}\n    retry: 2\n",
			[]string{`5:5: events[0].retry: unknown key "retry" (did you mean "retries"?)`}},
		{"scalar condition", "image: x\nevents:\n  - handler: a.b\n    pattern:\n      status: COMPLETED\n",
			[]string{`5:15: events[0].pattern.status`, `status: [COMPLETED]`}},
		{"unknown operator", "image: x\nevents:\n  - handler: a.b\n    pattern:\n      id: [{prefx: user_}]\n",
			[]string{`5:13: events[0].pattern.id[0].prefx`, `did you mean "prefix"`}},
		{"duplicate handler", "image: x\nevents:\n  - {handler: a.b, pattern: {k: [v]}}\n  - {handler: a.b, pattern: {k: [w]}}\n",
			[]string{`4:15: events[1].handler: handler "a.b" is already used by events[0]`}},
		{"bad handler", "image: x\nevents:\n  - {handler: nodot, pattern: {k: [v]}}\n  - {handler: 'a. b', pattern: {k: [v]}}\n  - {handler: a., pattern: {k: [v]}}\n",
			[]string{`3:15: events[0].handler: handler "nodot" must be module.function`, `4:15: events[1].handler: handler "a. b" must not contain whitespace`, `5:15: events[2].handler: handler "a." must be module.function`}},
		{"handler escaping the app", "image: x\nevents:\n  - {handler: ../../x.y, pattern: {k: [v]}}\n  - {handler: ..os.getcwd, pattern: {k: [v]}}\n  - {handler: /abs.run, pattern: {k: [v]}}\n  - {handler: sub/mod.run, pattern: {k: [v]}}\n",
			[]string{`3:15: events[0].handler: handler "../../x.y": the module must be a path inside the app`, `4:15: events[1].handler: handler "..os.getcwd": the module`, `5:15: events[2].handler: handler "/abs.run": the module`}},
		{"NUL in an env value", "image: x\nenv:\n  OK: fine\n  BAD: \"a\\0b\"\nevents:\n  - {handler: a.b, pattern: {k: [v]}}\n",
			[]string{`4:8: env.BAD: environment value of BAD contains a NUL byte`}},
		{"NUL in a command argument", "image: x\ncommand: [\"/bin/sh\", \"-c\", \"echo a\\0b\"]\nevents:\n  - {handler: a.b, pattern: {k: [v]}}\n",
			[]string{`2:28: command[2]: command argument contains a NUL byte, which no process can be given`}},
		{"command argument too long", "image: x\ncommand: [\"/bin/sh\", \"-c\", " + strings.Repeat("x", 128<<10) + "]\nevents:\n  - {handler: a.b, pattern: {k: [v]}}\n",
			[]string{`2:28: command[2]: command argument is 131072 bytes, more than the 131071 a process can be given per argument`}},
		{"bad durations", "image: x\nevents:\n  - {handler: a.b, pattern: {k: [v]}, timeout: 20}\n  - {handler: a.c, pattern: {k: [v]}, timeout: 16m}\n  - {handler: a.d, pattern: {k: [v]}, timeout: 0s}\n  - {handler: a.e, pattern: {k: [v]}, timeout: soon}\n",
			[]string{`3:48: events[0].timeout: a duration needs a unit: write 20s for seconds`, `4:48: events[1].timeout: timeout 16m0s is longer than the maximum 15m0s`, `5:48: events[2].timeout: timeout must be > 0`, `6:48: events[3].timeout: invalid duration "soon"`}},
		{"bad retries", "image: x\nevents:\n  - {handler: a.b, pattern: {k: [v]}, retries: -1}\n",
			[]string{`3:48: events[0].retries: retries must be between 0 and 1000`}},
		{"missing pattern and handler", "image: x\nevents:\n  - {timeout: 5s}\n",
			[]string{`3:5: events[0]: missing handler`, `3:5: events[0]: missing pattern`}},
		{"no rules", "image: x\n", []string{`1:1: an app needs at least one event rule`}},
		{"no image or runtime", "events: [{handler: a.b, pattern: {k: [v]}}]\n", []string{`1:1: set image`}},
		{"command with runtime", "runtime: python3\ncommand: [x]\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:10: command: command is only allowed without runtime`}},
		{"warm without runtime", "image: x\nwarm: true\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:7: warm: warm: true is only allowed with runtime (python3 or node)`}},
		{"warm not a boolean", "runtime: node\nwarm: yes please\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:7: warm: must be true or false, not a string`}},
		{"bad runtime", "runtime: ruby\nevents: [{handler: a.b, pattern: {k: [v]}}]\n", []string{`1:10: runtime: unknown runtime "ruby"`}},
		{"bad resources", "image: x\nresources: {memory: 128MB, cpus: 0, pids: 0, disk: 1}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`resources.memory: memory "128MB" must be a positive whole number with a unit KiB, MiB or GiB`, `resources.cpus: cpus must be a number > 0`, `resources.pids: pids must be a positive integer`, `resources.disk: unknown key "disk"`}},
		{"bad tmp", "image: x\nresources: {tmp: 1GB}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:18: resources.tmp: tmp "1GB" must be a positive whole number with a unit KiB, MiB or GiB`}},
		{"tmp larger than memory", "image: x\nresources:\n  tmp: 256MiB\n  memory: 128MiB\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`3:8: resources.tmp: tmp 256MiB is larger than memory 128MiB; files in /tmp count against the memory limit`}},
		{"tmp larger than the default memory", "image: x\nresources: {tmp: 1GiB}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:18: resources.tmp: tmp 1GiB is larger than memory 128MiB`}},
		{"bad concurrency", "image: x\nconcurrency: 0\nevents: [{handler: a.b, pattern: {k: [v]}}]\n", []string{`2:14: concurrency: concurrency must be a positive integer`}},
		{"bad network", "image: x\nnetwork: bridge\nevents: [{handler: a.b, pattern: {k: [v]}}]\n", []string{`2:10: network: network must be none or host`}},
		{"bad env", "image: x\nenv: {RELAY_X: a, 1BAD: b, PORT: 8080}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`env.RELAY_X: environment variable names starting with RELAY_ are reserved`, `env.1BAD: environment variable name "1BAD" must match`, `env.PORT: environment values must be strings; quote it`}},
		{"yaml syntax", "image: x\nevents: [\n", []string{`YAML syntax error`}},
		{"bad image", "image: \"Not_A_Valid/Ref!!\"\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`1:8: image: "Not_A_Valid/Ref!!" contains '!', which no OCI reference can`}},
		{"image not lowercase", "image: \"Not_A_Valid/Ref\"\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`1:8: image: "Not_A_Valid/Ref" is not a valid OCI reference (invalid reference format: repository name (Ref) must be lowercase)`}},
		{"merge key", "image: x\nevents:\n  - <<: {handler: a.b}\n    pattern: {k: [v]}\n",
			[]string{`3:5: events[0]: YAML merge keys (<<) are not supported in templates`}},
		{"env value not a scalar", "image: x\nenv: {C: [1]}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`env.C: environment values must be strings, not a list`}},
		{"not a mapping", "- a\n- b\n", []string{`1:1: template must be a mapping, not a list`}},
		{"alias", "image: &i x\ncommand: [*i]\nevents: [{handler: a.b, pattern: {k: [v]}}]\n", []string{`2:11: command[0]: must be a string, not a YAML alias (aliases are not supported`}},
		{"fraction", "image: x\nresources: {pids: 1.5}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n", []string{`resources.pids: must be a whole number, not the fraction 1.5`}},
		{"numbers YAML reads otherwise", "image: x\nresources: {cpus: .nan, pids: 1e9}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:19: resources.cpus: must be a finite number, not .nan`, `2:31: resources.pids: must be a whole number, not the string "1e9"`}},
		{"invalid UTF-8", "image: x\nevents: [{handler: a.b, pattern: {k: [\"a\xffb\"]}}]\n",
			[]string{`2:41: template is not valid UTF-8 (byte 0xff); save it as UTF-8`}},
		{"invalid UTF-8 after a byte order mark", "\xef\xbb\xbfimage: \xe9\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`1:8: template is not valid UTF-8 (byte 0xe9)`}},
		{"UTF-16", "\xff\xfei\x00m\x00",
			[]string{`1:1: template is not valid UTF-8 (byte 0xff); save it as UTF-8`}},
		{"cpus in hex out of range", "image: x\nresources: {cpus: 0x1000}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:19: resources.cpus: cpus must be a number > 0 and at most 1024, not 0x1000`}},
		{"cpus out of range", "image: x\nresources: {cpus: 2000}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`resources.cpus: cpus must be a number > 0 and at most 1024, not 2000`}},
		{"alias in env", "image: x\nenv: {A: &v a, B: *v}\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
			[]string{`2:19: env.B: environment values must be strings, not a YAML alias (aliases are not supported`}},
		{"bad schedules", "image: x\nschedules:\n  - {name: Bad_Name, handler: a.b, cron: '* * * * *'}\n  - {name: s1, handler: a.b, cron: '0 * * * * *'}\n  - {name: s2, handler: a.b, cron: '@every 5m'}\n  - {name: s3, handler: a.b, cron: 'TZ=UTC * * * * *'}\n  - {name: s4, handler: a.b, cron: '* * * * *', timezone: Local}\n  - {name: s5, handler: a.b, cron: '* * * * *', timezone: Mars/Base}\n  - {name: s5, handler: a.b, cron: '61 * * * *'}\n",
			[]string{`schedules[0].name: schedule name "Bad_Name"`, `schedules[1].cron: cron "0 * * * * *" has 6 fields, want 5`, `a seconds field is not supported`, `schedules[2].cron: cron "@every 5m": @every is not supported`, `schedules[3].cron: cron "TZ=UTC * * * * *" embeds a time zone`, `schedules[4].timezone: timezone "Local"`, `schedules[5].timezone: timezone "Mars/Base" is not a known IANA zone name`, `schedules[6].name: schedule name "s5" is used twice`, `schedules[6].cron: cron "61 * * * *"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := apptest.One(t, "app", c.src)
			if a.Available() {
				t.Fatal("invalid template loaded as available")
			}
			all := make([]string, len(a.Errors))
			for i, e := range a.Errors {
				all[i] = e.Error()
				if !strings.HasPrefix(all[i], "app/template.yaml:") {
					t.Errorf("error %q does not start with the template path", all[i])
				}
			}
			joined := strings.Join(all, "\n")
			if strings.Contains(joined, "needs at least one event rule") && !strings.Contains(c.name, "no rules") {
				t.Errorf("rules were declared, yet: %s", joined)
			}
			for _, w := range c.want {
				if !strings.Contains(joined, w) {
					t.Errorf("missing %q in:\n%s", w, joined)
				}
			}
		})
	}
}

// TestIntegersInOtherBases: YAML integers written in hex, octal or with
// underscores mean the same number in every numeric key, cpus too.
func TestIntegersInOtherBases(t *testing.T) {
	a := apptest.One(t, "app", "image: x\nconcurrency: 0x10\nresources: {cpus: 0x10, pids: 0o20}\nevents: [{handler: a.b, pattern: {k: [v]}, retries: 1_6}]\n")
	if !a.Available() {
		t.Fatalf("errors: %v", a.Errors)
	}
	if a.Concurrency != 16 || a.Spec.CPUs != 16 || a.Spec.PIDs != 16 || a.Rules[0].Retries != 16 {
		t.Errorf("concurrency %d, cpus %v, pids %d, retries %d; want 16 each", a.Concurrency, a.Spec.CPUs, a.Spec.PIDs, a.Rules[0].Retries)
	}
}

// TestEnvironmentFitsAProcess: a variable longer than the kernel passes to
// a process (NAME=value, 128 KiB) would fail every attempt to start, so a
// template whose env value or handler name makes one is refused, except
// for Go handlers, which are not started as processes.
func TestEnvironmentFitsAProcess(t *testing.T) {
	long := strings.Repeat("x", 128<<10)
	src := "image: x\nenv: {BIG: " + long + ", OK: " + long[:100<<10] + "}\nevents:\n  - {handler: a." + long + ", pattern: {k: [v]}}\n  - {handler: a.b, pattern: {k: [v]}}\n"
	a := apptest.One(t, "app", src)
	var all []string
	for _, e := range a.Errors {
		all = append(all, e.Error())
	}
	got := strings.Join(all, "\n")
	for _, want := range []string{"app/template.yaml:2:12: env.BIG: environment variable BIG is 131076 bytes", "app/template.yaml:4:15: events[0].handler: RELAY_HANDLER would be 131088 bytes"} {
		if !strings.Contains(got, want) {
			t.Errorf("missing %q in %.300s", want, got)
		}
	}
	if len(a.Errors) != 2 {
		t.Errorf("%d errors, want 2", len(a.Errors))
	}
	goApp := apptest.One(t, "app", strings.Replace(src, "image: x", "runtime: go", 1))
	if !goApp.Available() {
		t.Errorf("runtime: go: %.300s", goApp.Errors.Error())
	}
}

func TestInvalidAppDoesNotStopOthers(t *testing.T) {
	apps := apptest.Load(t, map[string]string{
		"good":    "image: x\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
		"bad":     "image: x\nevents: [{handler: a.b, pattern: {k: v}}]\n",
		"Invalid": "image: x\nevents: [{handler: a.b, pattern: {k: [v]}}]\n",
	})
	if !apps.Get("good").Available() || apps.Get("bad").Available() || apps.Get("Invalid").Available() {
		t.Fatal("availability wrong")
	}
	if !strings.Contains(apps.Get("Invalid").Errors.Error(), `app name "Invalid"`) {
		t.Errorf("bad app name not reported: %v", apps.Get("Invalid").Errors)
	}
	var names []string
	for _, a := range apps.List() {
		names = append(names, a.Name)
	}
	if strings.Join(names, ",") != "Invalid,bad,good" {
		t.Errorf("order = %v", names)
	}
}

func TestLoadAppsIgnoresDirsWithoutTemplate(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "notes"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "README.md"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root)
	if err != nil || len(apps.List()) != 0 {
		t.Fatalf("apps = %v, err = %v", apps.List(), err)
	}
	if _, err := template.LoadDir(filepath.Join(root, "missing")); err == nil {
		t.Error("missing apps root is not an error")
	}
}

func TestHostileTemplateIsBounded(t *testing.T) {
	big := "image: x\nevents: [{handler: a.b, pattern: {k: [v]}}]\n# " + strings.Repeat("x", 2<<20) + "\n"
	a := apptest.One(t, "big", big)
	if a.Available() || !strings.Contains(a.Errors.Error(), "larger than") {
		t.Errorf("oversized template: %v", a.Errors)
	}
	// Deep nesting is refused before the YAML parser sees it: the parser's
	// memory grows with the square of the depth.
	deep := "image: x\nevents: [{handler: a.b, pattern: " + strings.Repeat("{a: ", 400000) + "[v]" + strings.Repeat("}", 400000) + "}]\n"
	d := apptest.One(t, "deep", deep[:min(len(deep), 1<<20)])
	if d.Available() || !strings.Contains(d.Errors.Error(), "nests [ and { more than 64 deep") {
		t.Errorf("deep template: %v", d.Errors)
	}
	indented := "image: x\nevents:\n" + strings.Repeat(" ", 300) + "- {handler: a.b, pattern: {k: [v]}}\n"
	if a := apptest.One(t, "indented", indented); a.Available() || !strings.Contains(a.Errors.Error(), "indented more than 256") {
		t.Errorf("indented template: %v", a.Errors)
	}
	// Many lines are refused before the YAML parser sees them: its time
	// grows with the square of a block mapping's keys.
	var lines strings.Builder
	lines.WriteString("image: x\nevents: [{handler: a.b, pattern: {k: [v]}}]\nenv:\n")
	for i := range 6000 {
		fmt.Fprintf(&lines, "  V%d: x\n", i)
	}
	if a := apptest.One(t, "long", lines.String()); a.Available() || !strings.Contains(a.Errors.Error(), "long/template.yaml:5001:1: template has 6003 lines, more than 5000") {
		t.Errorf("long template: %v", a.Errors)
	}
	// Nesting hidden from a scan of the text: an apostrophe in a plain
	// scalar is no quote, and compact block sequences (- - - x) nest on
	// one line. Unchecked, each costs the parser gigabytes.
	hidden := "image: x\nenv: {A: it's}\nevents: [{handler: a.b, pattern: {k: " + strings.Repeat("[", 30000) + "v" + strings.Repeat("]", 30000) + "}}]\n# '\n"
	if a := apptest.One(t, "hidden", hidden); a.Available() || !strings.Contains(a.Errors.Error(), "hidden/template.yaml:3:") || !strings.Contains(a.Errors.Error(), "nests [ and { more than 64 deep") {
		t.Errorf("flow nesting after an apostrophe: %v", a.Errors)
	}
	compact := "image: x\nevents:\n  " + strings.Repeat("- ", 30000) + "x\n"
	if a := apptest.One(t, "compact", compact); a.Available() || !strings.Contains(a.Errors.Error(), "compact/template.yaml:3:") || !strings.Contains(a.Errors.Error(), "more than 256 columns") {
		t.Errorf("compact block sequences: %v", a.Errors)
	}
	// A long flow list is parsed with about 500 bytes of memory per item:
	// the items are bounded, not only the bytes.
	flat := "image: x\nevents: [{handler: a.b, pattern: {k: [" + strings.Repeat("v,", 400000) + "v]}}]\n"
	if a := apptest.One(t, "flat", flat); a.Available() || !strings.Contains(a.Errors.Error(), "tokens") {
		t.Errorf("flat flow list: %v", a.Errors)
	}
	quoted := "image: x\nenv: {X: \"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[\"}\nevents: [{handler: a.b, pattern: {k: [v]}}] # {{{{\n"
	if a := apptest.One(t, "quoted", quoted); !a.Available() {
		t.Errorf("brackets in strings and comments are not nesting: %v", a.Errors)
	}
}

func TestTemplateMustBeARegularFile(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "fifo")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(dir, app.TemplateFile), 0o644); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root) // must not block on the FIFO
	if err != nil {
		t.Fatal(err)
	}
	a := apps.Get("fifo")
	if a == nil || a.Available() || !strings.Contains(a.Errors.Error(), "must be a regular file, not a named pipe") || !a.Incomplete {
		t.Errorf("FIFO template: %+v", a)
	}
}

// TestByteOrderMark: a template saved with a UTF-8 byte order mark loads.
func TestByteOrderMark(t *testing.T) {
	a := apptest.One(t, "bom", "\xef\xbb\xbfimage: x\nevents: [{handler: a.b, pattern: {k: [v]}}]\n")
	if !a.Available() {
		t.Fatalf("template with a BOM: %v", a.Errors.Err())
	}
}

// TestTemplateDirectory: a directory named template.yaml is named as one.
func TestTemplateDirectory(t *testing.T) {
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "dir", app.TemplateFile), 0o755); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	if a := apps.Get("dir"); a == nil || a.Available() || !strings.Contains(a.Errors.Error(), "must be a regular file, not a directory") {
		t.Errorf("directory as template: %+v", a)
	}
}

func TestAnchorsAreFollowed(t *testing.T) {
	a := apptest.One(t, "anchored", "image: &img relay.local/busybox:latest\nevents:\n  - handler: a.b\n    pattern: &p {k: [v]}\n")
	if !a.Available() || a.Spec.Image != "relay.local/busybox:latest" || len(a.Rules) != 1 {
		t.Errorf("anchored template: %v %+v", a.Errors, a.Spec)
	}
}

// directory, as a ConfigMap volume makes, still loads.
func TestTemplateSymlinks(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("root:*:20228:0:99999:7:::\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	leak := filepath.Join(root, "leak")
	inside := filepath.Join(root, "inside")
	for _, d := range []string{leak, filepath.Join(inside, "..data")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(leak, app.TemplateFile)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(inside, "..data", app.TemplateFile), []byte("image: x\nevents:\n  - {handler: a.b, pattern: {k: [v]}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", app.TemplateFile), filepath.Join(inside, app.TemplateFile)); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	l := apps.Get("leak")
	if l == nil || l.Available() || !strings.Contains(l.Errors.Err().Error(), "outside the app directory") || strings.Contains(l.Errors.Err().Error(), "root:") {
		t.Errorf("leak: %+v", l)
	}
	if in := apps.Get("inside"); in == nil || !in.Available() {
		t.Errorf("inside: %+v", in)
	}
}

// TestDanglingTemplateLink: a template that is a symbolic link to nothing
// makes the app unavailable, so its messages wait; ignored as if the app
// had no template, its events were acknowledged as unmatched.
func TestDanglingTemplateLink(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "dangling")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join("..data", app.TemplateFile), filepath.Join(dir, app.TemplateFile)); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	a := apps.Get("dangling")
	if a == nil || a.Available() || !a.Incomplete || !strings.Contains(a.Errors.Error(), "dangling/template.yaml:1:1: template is a symbolic link to a file that does not exist") {
		t.Errorf("dangling: %+v", a)
	}
}

// A `runtime: go` template names Go functions: it needs no image, and
// refuses every setting of a container.
func TestLoadGoRuntime(t *testing.T) {
	a := apptest.One(t, "orders", `
runtime: go
events:
  - handler: orders.placed
    pattern: {type: [orders.placed]}
`)
	if !a.Available() || a.Spec.Runtime != "go" || a.Spec.Image != "" || a.Rules[0].Retries != app.DefaultRetries {
		t.Fatalf("runtime: go app: errors %v, spec %+v", a.Errors, a.Spec)
	}
	bad := apptest.One(t, "orders", `
runtime: go
image: relay.local/busybox:latest
warm: true
resources: {memory: 64MiB}
events:
  - handler: orders.placed
    pattern: {type: [orders.placed]}
`)
	var msg string
	for _, e := range bad.Errors {
		msg += e.Error() + "\n"
	}
	for _, key := range []string{"image", "warm", "resources"} {
		if !strings.Contains(msg, key+" configures a container; runtime: go runs Go functions") {
			t.Errorf("errors do not refuse %s:\n%s", key, msg)
		}
	}
}

// TestFileErrorsArePositioned: an error about a whole file (a template or
// manifest that is a directory, a link out of the app, too large) still
// reads file:line:col: message, as relay validate prints every error, so
// editors and CI annotations that parse that form find it.
func TestFileErrorsArePositioned(t *testing.T) {
	root := t.TempDir()
	outside := filepath.Join(t.TempDir(), "elsewhere.yaml")
	if err := os.WriteFile(outside, []byte("image: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{"dir/" + app.TemplateFile, "link", "manifest/requirements.txt"} {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(root, "link", app.TemplateFile)); err != nil {
		t.Fatal(err)
	}
	tpl := "runtime: python3\nevents: [{handler: a.b, pattern: {k: [v]}}]\n"
	if err := os.WriteFile(filepath.Join(root, "manifest", app.TemplateFile), []byte(tpl), 0o644); err != nil {
		t.Fatal(err)
	}
	apps, err := template.LoadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{
		"dir":      "dir/template.yaml:1:1: template must be a regular file, not a directory",
		"link":     "link/template.yaml:1:1: template is a symbolic link to a file outside the app directory",
		"manifest": "manifest/requirements.txt:1:1: requirements.txt must be a regular file",
	} {
		a := apps.Get(name)
		if a == nil || len(a.Errors) != 1 || !strings.HasPrefix(a.Errors[0].Error(), want) {
			t.Errorf("%s: errors %v, want one starting %q", name, a.Errors, want)
		}
	}
}
