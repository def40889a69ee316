package template_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/app/template"
)

// TestLoadFS: apps in an fs.FS (an embed.FS in a binary) load as from a
// directory, with the same errors at the same file:line:col, names
// relative to the root; an app that would need a container is
// unavailable, since an FS has no directory to mount.
func TestLoadFS(t *testing.T) {
	files := map[string]string{
		"orders/template.yaml": "runtime: go\nevents:\n  - handler: orders.placed\n    pattern: {type: [orders.placed]}\n",
		"broken/template.yaml": "runtime: go\nevents:\n  - handler: b.run\n    pattern:\n      id: [{prefx: \"x\"}]\n    retry: 2\n",
		"notes/README":         "no template here",
	}
	fsys := fstest.MapFS{"top.txt": {Data: []byte("x")}}
	dir := t.TempDir()
	for name, data := range files {
		fsys["apps/"+name] = &fstest.MapFile{Data: []byte(data)}
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	fromFS, err := template.LoadFS(fsys, "apps")
	if err != nil {
		t.Fatal(err)
	}
	fromDir, err := template.LoadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, a := range fromFS.List() {
		names = append(names, a.Name)
	}
	if diff := cmp.Diff([]string{"broken", "orders"}, names); diff != "" {
		t.Errorf("apps (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(fromDir.Errors().Error(), fromFS.Errors().Error()); diff != "" {
		t.Errorf("errors from the FS differ from the directory's (-dir +fs):\n%s", diff)
	}
	if !strings.Contains(fromFS.Errors().Error(), `broken/template.yaml:5:13: events[0].pattern.id[0].prefx: unknown operator "prefx"`) {
		t.Errorf("errors: %v", fromFS.Errors())
	}
	orders := fromFS.Get("orders")
	if !orders.Available() || orders.Spec.Dir != "" || orders.Digest != fromDir.Get("orders").Digest || len(orders.Rules) != 1 || orders.Rules[0].Retries != 4 {
		t.Errorf("orders from the FS: %+v", orders)
	}

	container := fstest.MapFS{"shop/template.yaml": {Data: []byte("image: busybox\nevents:\n  - handler: a.b\n    pattern: {x: [1]}\n")}}
	set, err := template.LoadFS(container, ".")
	if err != nil || set.Get("shop").Available() || !strings.Contains(set.Errors().Error(), "shop/template.yaml:1:1: an app from an fs.FS has no directory to mount") {
		t.Errorf("container app from an FS: %v, %v", err, set.Errors())
	}

	if _, err := template.LoadFS(fsys, "nope"); err == nil {
		t.Error("LoadFS of a missing root succeeded")
	}
	src := template.FS(fsys, "apps")
	got, err := src.Load(t.Context())
	if err != nil || len(got.List()) != 2 {
		t.Errorf("FS(...).Load = %v, %v", got, err)
	}
}
