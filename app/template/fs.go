package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
)

// LoadFS loads every app under root in fsys, as LoadDir loads a directory
// (docs/embedding.md#apps-in-a-go-binary): each direct child directory of
// root holding template.yaml is an app named after it, validated alike,
// its errors naming "<app>/template.yaml" with the line and column. Use
// it for templates built into the binary with embed.FS (root is then the
// directory given to //go:embed). An FS has no host directory to mount
// into a container, so an app whose runtime is not go is unavailable
// ("runtime: go" serves Go functions of the process, docs/apps.md#go-handlers),
// and apps from an FS have no dependency manifests. The error is non-nil
// only when root itself cannot be read.
func LoadFS(fsys fs.FS, root string, opts ...Option) (*app.Set, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	entries, err := fs.ReadDir(fsys, root)
	if err != nil {
		return nil, fmt.Errorf("read apps root: %w", err)
	}
	var apps []*app.App
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		if a, ok := loadFSApp(fsys, path.Join(root, e.Name()), o); ok {
			apps = append(apps, a)
		}
	}
	return app.Loaded(apps)
}

// loadFSApp loads the app in dir of fsys; ok is false when dir has no
// template.yaml.
func loadFSApp(fsys fs.FS, dir string, o options) (a *app.App, ok bool) {
	name := path.Base(dir)
	file := name + "/" + app.TemplateFile
	a = &app.App{Name: name, File: file, Incomplete: true}
	f, err := fsys.Open(path.Join(dir, app.TemplateFile))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("cannot read template: %v", err))
		return a, true
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && !fi.Mode().IsRegular() {
		a.Errors.Add(file, 1, 1, "", "template must be a regular file")
		return a, true
	}
	src, err := io.ReadAll(io.LimitReader(f, maxTemplateBytes+1))
	if err != nil {
		a.Errors.Add(file, 1, 1, "", fmt.Sprintf("cannot read template: %v", err))
		return a, true
	}
	if parseSource(a, src, o) && a.Spec.Runtime != runtime.RuntimeGo {
		a.Errors.Add(file, 1, 1, "", "an app from an fs.FS has no directory to mount into a container: "+
			"write runtime: go for handlers that are Go functions, or load the app from a directory (template.LoadDir)")
	}
	a.Errors.Sort()
	return a, true
}

// FSApps is the apps under a root of an fs.FS read as a source of apps:
// it implements worker.AppSource, loading them with LoadFS on each Load.
// It does not watch: the files of an embed.FS never change, so a reload
// serves the same apps. Build it with FS.
type FSApps struct {
	fsys fs.FS
	root string
	opts []Option
}

// FS returns the apps under root in fsys as a worker.AppSource.
func FS(fsys fs.FS, root string, opts ...Option) FSApps {
	return FSApps{fsys: fsys, root: root, opts: opts}
}

// Load loads every app under the root (LoadFS).
func (f FSApps) Load(context.Context) (*app.Set, error) { return LoadFS(f.fsys, f.root, f.opts...) }
