package worker

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/runtime"
)

// preparerRunner fails Prepare for a manifest containing "broken".
type preparerRunner struct {
	mu       sync.Mutex
	prepared []string
}

func (p *preparerRunner) Run(context.Context, runtime.Request) (runtime.Result, error) {
	return runtime.Result{}, nil
}

func (p *preparerRunner) Prepare(_ context.Context, name string, spec runtime.Spec) error {
	p.mu.Lock()
	p.prepared = append(p.prepared, name)
	p.mu.Unlock()
	if spec.Deps != nil && strings.Contains(string(spec.Deps.ManifestData), "broken") {
		return errors.New("dependency build failed: pip: no matching distribution for broken==1: " + runtime.ErrUnavailable.Error())
	}
	return nil
}

// TestPrepareApps: at start every app is prepared, whether it has
// dependencies or not (its image is prepared too), and one that fails is
// unavailable with the reason; on a reload only new, changed or not ready
// apps are prepared, and a changed manifest that fails leaves the previous
// version serving.
func TestPrepareApps(t *testing.T) {
	withDeps := func(name, digest, manifest string) *app.App {
		a := &app.App{Name: name, File: name + "/template.yaml", Digest: digest,
			Rules: []app.Rule{{Handler: "h.run", Pattern: &matcher.Pattern{}}}}
		a.Spec.Runtime = runtime.RuntimePython3
		if manifest != "" {
			a.Spec.Deps = &runtime.Deps{Manifest: runtime.PythonManifest, ManifestData: []byte(manifest)}
		}
		return a
	}
	set := func(apps ...*app.App) *app.Set {
		s, err := app.Loaded(apps)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	r := &preparerRunner{}
	w := &reloader{log: slog.New(slog.NewTextHandler(io.Discard, nil)), preps: map[string]*preparation{}}
	w.cfg.preparer = r
	w.cfg.prepareWait = time.Minute

	start, _, _ := w.prepareApps(t.Context(), nil, set(withDeps("a", "1", "pkg==1\n"), withDeps("b", "1", "broken==1\n"), withDeps("plain", "1", "")))
	if !start.Get("a").Available() || start.Get("b").Available() || !start.Get("plain").Available() {
		t.Fatalf("after start: a %v, b %v, plain %v; want b alone unavailable", start.Get("a").Errors, start.Get("b").Errors, start.Get("plain").Errors)
	}
	if msg := start.Get("b").Errors.Error(); !strings.Contains(msg, "no matching distribution for broken==1") {
		t.Errorf("b's reason %q lacks the installer's error", msg)
	}
	if len(r.prepared) != 3 {
		t.Errorf("prepared %v, want a, b and plain (its image)", r.prepared)
	}

	// Reload: a's manifest breaks (same template), b unchanged.
	r.prepared = nil
	loaded, _, _ := w.prepareApps(t.Context(), start, set(withDeps("a", "1", "broken==1\n"), withDeps("b", "1", "broken==1\n"), withDeps("plain", "1", "")))
	next, changes := nextGeneration(start, loaded)
	if a := next.Get("a"); a != start.Get("a") || !a.Available() {
		t.Errorf("a after a broken manifest = %+v, want the previous version serving", a)
	}
	kept := false
	for _, c := range changes {
		kept = kept || c.app.Name == "a" && c.kept
	}
	if !kept {
		t.Errorf("changes %+v: a not reported as kept", changes)
	}
	if strings.Join(r.prepared, ",") != "a,b" && strings.Join(r.prepared, ",") != "b,a" {
		// b is prepared again: its previous version is unavailable.
		t.Errorf("prepared on reload %v, want a (changed manifest) and b (unavailable)", r.prepared)
	}

	// Reload: b's manifest fixed.
	fixed, _, _ := w.prepareApps(t.Context(), next, set(withDeps("a", "1", "pkg==1\n"), withDeps("b", "1", "pkg==2\n"), withDeps("plain", "1", "")))
	next2, _ := nextGeneration(next, fixed)
	if !next2.Get("b").Available() {
		t.Errorf("b after its manifest was fixed: %v", next2.Get("b").Errors)
	}
}
