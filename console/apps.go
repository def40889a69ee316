package console

import (
	"context"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/parser"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/schedule"
)

// nextFires is how many fire times the apps page lists per schedule.
const nextFires = 3

type appView struct {
	Name    string
	Ready   bool
	File    string
	Runtime string
	Image   string
	// ImageDefault names the runtime whose default image Image is.
	ImageDefault string
	Command      string
	Concurrency  int
	Memory       string
	CPUs         string
	PIDs         int64
	Network      string
	Warm         bool
	Env          []string // names only: values are never shown
	Secrets      []string // names only: values are never read
	Deps         *depsView
	Rules        []ruleView
	Schedules    []scheduleView
	Errors       []errorView
	// Incomplete: some of its rules cannot be read, which holds every
	// message (docs/delivery.md#held-messages).
	Incomplete bool
	// Holds say what the live workers hold for this app, and why.
	Holds []holdView
}

// depsView is an app's dependency manifest and the state of its image.
type depsView struct {
	Manifest, Lockfile string
	Digest             string // the first 12 hex digits
	Image              string // the image's reference, "" when not known
	State              string // built, not built yet, unknown, not looked up
	Class              string // the badge's colour
	Detail             string // size and build time, or why it is unknown
}

type ruleView struct {
	Handler string
	Timeout time.Duration
	Retries int
	Pattern string // YAML
}

type scheduleView struct {
	Name, Handler, Cron, Zone string
	Timeout                   time.Duration
	Retries                   int
	Next                      []fireView
	Error                     string
}

type fireView struct{ UTC, Local string }

// errorView is one template error: where, and what.
type errorView struct {
	Where string // file:line:col
	Path  string
	Msg   string
}

type appsView struct {
	Apps []appView
	// SecretsMount is where an app's secrets are mounted in its containers.
	SecretsMount string
	Problem      string
	Now          time.Time
}

func (s *Server) apps(w http.ResponseWriter, r *http.Request) {
	v := appsView{Now: time.Now(), SecretsMount: runtime.SecretsMountDir}
	set, err := s.cfg.Apps.Load(r.Context())
	if err != nil {
		v.Problem = "loading the apps failed: " + err.Error()
		s.render(w, r, "apps", "Apps", v)
		return
	}
	holds := s.appHolds(r.Context())
	for _, a := range set.List() {
		av := viewApp(a, v.Now)
		if av.Image == "" && s.cfg.DefaultImage != nil {
			if av.Image = s.cfg.DefaultImage(a.Spec.Runtime); av.Image != "" {
				av.ImageDefault = a.Spec.Runtime
			}
		}
		av.Holds = holds[a.Name]
		if av.Deps != nil {
			s.lookUpDeps(r.Context(), a.Spec, av.Deps)
		}
		v.Apps = append(v.Apps, av)
	}
	s.render(w, r, "apps", "Apps", v)
}

func viewApp(a *app.App, now time.Time) appView {
	v := appView{Name: a.Name, Ready: a.Available(), File: a.File, Runtime: a.Spec.Runtime, Image: a.Spec.Image,
		Command: a.Spec.CommandLine(), Concurrency: a.Concurrency, Memory: runtime.FormatSize(a.Spec.MemoryBytes),
		CPUs: strconv.FormatFloat(a.Spec.CPUs, 'f', -1, 64), PIDs: a.Spec.PIDs, Network: a.Spec.Network, Warm: a.Spec.Warm,
		Incomplete: a.Incomplete, Env: slices.Sorted(maps.Keys(a.Spec.Env))}
	// Names and errors come from the template, which may be broken:
	// shown as the CLI shows stored text.
	for i, n := range v.Env {
		v.Env[i] = clean(n)
	}
	for _, n := range a.Spec.Secrets {
		v.Secrets = append(v.Secrets, clean(n))
	}
	if d := a.Spec.Deps; d != nil {
		v.Deps = &depsView{Manifest: clean(d.Manifest), Lockfile: clean(d.Lockfile), Digest: d.Digest()[:12],
			State: "not looked up", Detail: "no containerd to ask (relay console asks it with --runner containerd)"}
	}
	for _, r := range a.Rules {
		v.Rules = append(v.Rules, ruleView{Handler: r.Handler, Timeout: r.Timeout, Retries: r.Retries, Pattern: patternYAML(r.Pattern.String())})
	}
	for _, sc := range a.Schedules {
		sv := scheduleView{Name: sc.Name, Handler: sc.Handler, Zone: sc.Timezone().String(), Timeout: sc.Timeout, Retries: sc.Retries}
		if sc.Cron != nil {
			sv.Cron = sc.Cron.String()
			spec := schedule.Spec{App: a.Name, Name: sc.Name, Handler: sc.Handler, Cron: sc.Cron}
			at := now
			for range nextFires {
				next, err := spec.Next(at)
				if err != nil {
					sv.Error = err.Error()
					break
				}
				sv.Next = append(sv.Next, fireView{UTC: next.UTC().Format("2006-01-02 15:04 MST"),
					Local: next.In(sc.Timezone()).Format("2006-01-02 15:04 MST")})
				at = next
			}
		}
		v.Schedules = append(v.Schedules, sv)
	}
	for _, e := range a.Errors {
		ev := errorView{Where: e.File, Path: clean(e.Path), Msg: clean(e.Msg)}
		if e.Line > 0 {
			ev.Where += ":" + strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Col)
		}
		ev.Where = clean(ev.Where)
		v.Errors = append(v.Errors, ev)
	}
	return v
}

// lookUpDeps fills in the state of spec's dependency image through
// Config.Deps, as relay app inspect shows it.
func (s *Server) lookUpDeps(ctx context.Context, spec runtime.Spec, v *depsView) {
	if s.cfg.Deps == nil {
		return
	}
	img, err := s.cfg.Deps(ctx, spec)
	v.Image = clean(img.Name)
	switch {
	case err != nil:
		v.State, v.Class, v.Detail = "unknown", "warn", clean(err.Error())
	case !img.Built:
		v.State, v.Class, v.Detail = "not built yet", "warn", "the first start or invocation builds it"
	default:
		v.State, v.Class = "built", "good"
		v.Detail = runtime.FormatSize(img.Size) + " compressed, built " + utc(img.BuiltAt) + " in " + img.BuildTime.Round(100*time.Millisecond).String()
	}
}

// patternYAML renders a pattern's canonical flow YAML (matcher's
// Pattern.String) in block style as a template writes it: maps one key per
// line, lists of scalars kept in brackets. Scalars keep their exact text
// (quotes, number spelling). It returns flow unchanged if it does not parse.
func patternYAML(flow string) string {
	f, err := parser.ParseBytes([]byte(flow), 0)
	if err != nil || len(f.Docs) != 1 || f.Docs[0].Body == nil {
		return flow
	}
	var b strings.Builder
	writeBlock(&b, f.Docs[0].Body, 0)
	return strings.TrimRight(b.String(), "\n")
}

func writeBlock(b *strings.Builder, n ast.Node, indent int) {
	pad := strings.Repeat("  ", indent)
	switch n := n.(type) {
	case *ast.MappingNode:
		for _, kv := range n.Values {
			b.WriteString(pad + kv.Key.String() + ":")
			writeValue(b, kv.Value, indent)
		}
	case *ast.MappingValueNode:
		b.WriteString(pad + n.Key.String() + ":")
		writeValue(b, n.Value, indent)
	default:
		b.WriteString(pad + n.String() + "\n")
	}
}

// writeValue writes the value of a key whose "key:" is already written.
func writeValue(b *strings.Builder, n ast.Node, indent int) {
	switch n := n.(type) {
	case *ast.MappingNode, *ast.MappingValueNode:
		b.WriteByte('\n')
		writeBlock(b, n, indent+1)
	case *ast.SequenceNode:
		if allScalars(n.Values) {
			parts := make([]string, len(n.Values))
			for i, v := range n.Values {
				parts[i] = v.String()
			}
			b.WriteString(" [" + strings.Join(parts, ", ") + "]\n")
			return
		}
		b.WriteByte('\n')
		pad := strings.Repeat("  ", indent+1)
		for _, v := range n.Values {
			var item strings.Builder
			writeBlock(&item, v, 0)
			lines := strings.Split(strings.TrimRight(item.String(), "\n"), "\n")
			for i, l := range lines {
				if i == 0 {
					b.WriteString(pad + "- " + l + "\n")
				} else {
					b.WriteString(pad + "  " + l + "\n")
				}
			}
		}
	default:
		b.WriteString(" " + n.String() + "\n")
	}
}

func allScalars(ns []ast.Node) bool {
	for _, n := range ns {
		switch n.(type) {
		case *ast.MappingNode, *ast.MappingValueNode, *ast.SequenceNode:
			return false
		}
	}
	return true
}
