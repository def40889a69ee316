package template

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"time"

	"github.com/fsnotify/fsnotify"
)

// settle is how long Watch waits after a change for the next one before it
// reports: an editor or a git checkout writes several files, a Kubernetes
// ConfigMap update swaps a symbolic link and removes the old directory.
const settle = 200 * time.Millisecond

// Watch calls changed after something under the apps root may have changed
// (docs/apps.md#changing-apps): a file written, created, removed or renamed
// in the root or in an app directory, including the swap of the ..data
// symbolic link that Kubernetes uses to update a ConfigMap volume. Bursts
// of changes are reported once, after they settle. Watch returns nil when
// ctx ends, and an error when the root cannot be watched; it implements
// relay.AppWatcher for Dir.
//
// A watch can miss changes (a file system that does not report them, such
// as some network mounts, or an overflow of the kernel's queue): callers
// rescan on a timer too, as relay.Worker does.
func (d Dir) Watch(ctx context.Context, changed func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	defer w.Close()
	root := string(d)
	if err := w.Add(root); err != nil {
		return err
	}
	watchApps(w, root)
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return nil
			}
			if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove) {
				// A new app directory, or a ConfigMap's new ..data
				// directory: watch what is there now.
				watchApps(w, root)
			}
			timer = time.After(settle)
		case err, ok := <-w.Errors:
			if !ok {
				return nil
			}
			if errors.Is(err, fsnotify.ErrEventOverflow) {
				timer = time.After(settle) // something changed; rescan
				continue
			}
			return err
		case <-timer:
			timer = nil
			changed()
		}
	}
}

// watchApps adds every app directory under root, and the directory a
// symbolic link in it points to, to w. Adding a path twice is harmless;
// paths that vanished meanwhile are skipped.
func watchApps(w *fsnotify.Watcher, root string) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return
	}
	for _, e := range entries {
		dir := filepath.Join(root, e.Name())
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			continue
		}
		_ = w.Add(dir)
		// The files of a ConfigMap volume are links into ..data, itself a
		// link to a timestamped directory that an update replaces.
		if target, err := filepath.EvalSymlinks(filepath.Join(dir, "..data")); err == nil {
			_ = w.Add(target)
		}
	}
}
