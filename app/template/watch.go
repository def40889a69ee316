package template

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
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
// of changes are reported once, after they settle. Watch also reports once
// as soon as its watches are in place: a change made after the caller's
// last load but before the watch began is not missed. Watch returns nil when
// ctx ends, and an error when the root cannot be watched at start; an
// error of the watch later (an overflow of the kernel's queue, a watch
// removed under it) counts as a change and the watch goes on. It
// implements relay.AppWatcher for Dir.
//
// A watch can miss changes (a file system that does not report them, such
// as some network mounts, or an overflow of the kernel's queue): callers
// rescan on a timer too, as worker.Worker does.
func (d Dir) Watch(ctx context.Context, changed func()) error {
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return err
	}
	root := string(d)
	if err := w.Add(root); err != nil {
		w.Close()
		return err
	}
	watchApps(w, root)
	// The watcher's reader sends some errors while it holds the lock that
	// Add takes (a watch that vanished before its rename was read), so a
	// loop that both read the channels and added watches could wait for
	// the lock while the reader waits for it to read. One goroutine only
	// drains the channels; this loop adds watches and reports.
	var rewatch atomic.Bool
	seen := make(chan struct{}, 1)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		for {
			select {
			case ev, ok := <-w.Events:
				if !ok {
					return
				}
				if ev.Has(fsnotify.Create) || ev.Has(fsnotify.Rename) || ev.Has(fsnotify.Remove) {
					rewatch.Store(true)
				}
			case _, ok := <-w.Errors:
				if !ok {
					return
				}
				// An overflow of the kernel's queue, or a watch that
				// vanished before its event was read (EINVAL): either way
				// something changed, so rescan; neither ends the watch.
				rewatch.Store(true)
			}
			select {
			case seen <- struct{}{}:
			default:
			}
		}
	}()
	defer func() {
		w.Close()
		<-drained
	}()
	changed() // for what changed before the watch began
	var timer <-chan time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-drained:
			return nil
		case <-seen:
			if rewatch.Swap(false) {
				// A new app directory, or a ConfigMap's new ..data
				// directory: watch what is there now.
				watchApps(w, root)
			}
			timer = time.After(settle)
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
