package console

import (
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
	Name        string
	Ready       bool
	File        string
	Runtime     string
	Image       string
	Command     string
	Concurrency int
	Memory      string
	CPUs        string
	PIDs        int64
	Network     string
	Warm        bool
	Env         []string // names only: values are never shown
	Rules       []ruleView
	Schedules   []scheduleView
	Errors      []errorView
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
	Apps    []appView
	Problem string
	Now     time.Time
}

func (s *Server) apps(w http.ResponseWriter, r *http.Request) {
	v := appsView{Now: time.Now()}
	set, err := s.cfg.Apps.Load(r.Context())
	if err != nil {
		v.Problem = "loading the apps failed: " + err.Error()
		s.render(w, r, "apps", "Apps", v)
		return
	}
	for _, a := range set.List() {
		v.Apps = append(v.Apps, viewApp(a, v.Now))
	}
	s.render(w, r, "apps", "Apps", v)
}

func viewApp(a *app.App, now time.Time) appView {
	v := appView{Name: a.Name, Ready: a.Available(), File: a.File, Runtime: a.Spec.Runtime, Image: a.Spec.Image,
		Command: a.Spec.CommandLine(), Concurrency: a.Concurrency, Memory: runtime.FormatSize(a.Spec.MemoryBytes),
		CPUs: strconv.FormatFloat(a.Spec.CPUs, 'f', -1, 64), PIDs: a.Spec.PIDs, Network: a.Spec.Network, Warm: a.Spec.Warm,
		Env: slices.Sorted(maps.Keys(a.Spec.Env))}
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
		ev := errorView{Where: e.File, Path: e.Path, Msg: e.Msg}
		if e.Line > 0 {
			ev.Where += ":" + strconv.Itoa(e.Line) + ":" + strconv.Itoa(e.Col)
		}
		v.Errors = append(v.Errors, ev)
	}
	return v
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
