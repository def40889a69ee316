// Package apptest loads apps from template sources, for tests: it writes
// an apps root with testutil.AppsRoot and reads it with app/template, as
// relay start reads one. It is separate from testutil because loading
// templates imports package app, which tests of the packages app imports
// (schedule) could not use without an import cycle.
package apptest

import (
	"testing"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/testutil"
)

// Load writes templates (app name → template.yaml source) into a new
// temporary apps root and loads it with template.LoadDir. An app whose
// template is invalid is in the set, unavailable; t fails only when the
// root cannot be read.
func Load(t testing.TB, templates map[string]string) *app.Set {
	t.Helper()
	apps, err := template.LoadDir(testutil.AppsRoot(t, templates))
	if err != nil {
		t.Fatal(err)
	}
	return apps
}

// One loads the single app name from its template source src; t fails
// when the app is not in the loaded set.
func One(t testing.TB, name, src string) *app.App {
	t.Helper()
	a := Load(t, map[string]string{name: src}).Get(name)
	if a == nil {
		t.Fatalf("app %q not loaded", name)
	}
	return a
}
