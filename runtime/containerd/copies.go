package containerd

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// copyRetention is how long a copy of the exec helper or of a bootstrap
// that no Runner touched stays in its directory: a Relay upgrade leaves
// the previous version's copies behind, one of each per version. A Runner
// touches the copies it uses once per copyTouch, so only copies of
// versions gone for days qualify.
const (
	copyRetention = 7 * 24 * time.Hour
	copyTouch     = 24 * time.Hour
)

// touchCopy marks path, a copy in use, as used now, when its mark is older
// than copyTouch (fi is its Stat). Errors are ignored: a copy removed
// after all is written again on its next use.
func touchCopy(path string, fi fs.FileInfo) {
	if time.Since(fi.ModTime()) >= copyTouch {
		now := time.Now()
		os.Chtimes(path, now, now)
	}
}

// copyDirs returns the directories where Runners write the copies they
// mount into containers: the exec helper's and the bootstraps'
// (docs/operations.md "State directory").
func (r *Runner) copyDirs() []string {
	sd := r.bootstraps.stateDir
	if sd == "" {
		// Bootstraps then live in a directory of this process's, removed
		// by Close; helpers in one per user, shared.
		return []string{helperDir(sd)}
	}
	return []string{helperDir(sd), bootstrapDir(sd)}
}

// sweepCopies removes the copies of the exec helper and of the bootstraps
// that no Runner touched for copyRetention and no container of the
// namespace mounts, and temporary files of an interrupted write older than
// copyTouch.
func (r *Runner) sweepCopies(ctx context.Context) error {
	var stale []string
	for _, dir := range r.copyDirs() {
		entries, err := os.ReadDir(dir)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("list %s: %w", dir, err)
		}
		for _, e := range entries {
			fi, err := e.Info()
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			age := time.Since(fi.ModTime())
			if age >= copyRetention || strings.HasPrefix(e.Name(), ".tmp-") && age >= copyTouch {
				stale = append(stale, filepath.Join(dir, e.Name()))
			}
		}
	}
	if len(stale) == 0 {
		return nil
	}
	mounted, err := r.mountSources(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, path := range stale {
		if mounted[path] {
			continue
		}
		msg := "removing a copy no Relay used for a week (an earlier version's)"
		if strings.HasPrefix(filepath.Base(path), ".tmp-") {
			msg = "removing the temporary file of an interrupted copy"
		}
		r.logger.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("path", path))
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
