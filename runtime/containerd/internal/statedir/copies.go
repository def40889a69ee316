package statedir

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// Retention is how long a copy of the exec helper or of a bootstrap that
// no Runner touched stays in its directory: a Relay upgrade leaves the
// previous version's copies behind, one of each per version. A Runner
// touches the copies it uses once per touchInterval, so only copies of
// versions gone for days qualify.
const (
	Retention     = 7 * 24 * time.Hour
	touchInterval = 24 * time.Hour
)

// Touch marks path, a copy in use, as used now, when its mark is older
// than touchInterval (fi is its Stat). Errors are ignored: a copy removed
// after all is written again on its next use.
func Touch(path string, fi fs.FileInfo) {
	if time.Since(fi.ModTime()) >= touchInterval {
		now := time.Now()
		os.Chtimes(path, now, now)
	}
}

// HelperDir is where Runners with the state directory stateDir copy the
// exec helper: its bin/, or that of UserHelperRoot without one.
func HelperDir(stateDir string) string {
	if stateDir == "" {
		stateDir = UserHelperRoot()
	}
	return filepath.Join(stateDir, "bin")
}

// UserHelperRoot is the directory of the helper copies of Runners without
// a state directory: one per user, shared by its processes, since copies
// are named by content.
func UserHelperRoot() string {
	return filepath.Join(os.TempDir(), "relay-exec-"+strconv.Itoa(os.Getuid()))
}

// copyDirs returns the directories where Runners with the state directory
// stateDir write the copies they mount into containers: the exec
// helper's and the bootstraps' (docs/operations.md "State directory").
func copyDirs(stateDir string) []string {
	if stateDir == "" {
		// Bootstraps then live in a directory of this process's, removed
		// by Close; helpers in one per user, shared.
		return []string{HelperDir(stateDir)}
	}
	return []string{HelperDir(stateDir), BootstrapDir(stateDir)}
}

// Sweep removes the copies of the exec helper and of the bootstraps, of
// Runners with the state directory stateDir, that no Runner touched for
// Retention and no container of host's namespace mounts, and temporary
// files of an interrupted write older than touchInterval.
func Sweep(ctx context.Context, host *core.Host, stateDir string) error {
	var stale []string
	for _, dir := range copyDirs(stateDir) {
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
			if age >= Retention || strings.HasPrefix(e.Name(), ".tmp-") && age >= touchInterval {
				stale = append(stale, filepath.Join(dir, e.Name()))
			}
		}
	}
	if len(stale) == 0 {
		return nil
	}
	mounted, err := host.Mounted(ctx, func(m specs.Mount) (string, bool) { return m.Source, true })
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
		host.Logger.LogAttrs(ctx, slog.LevelInfo, msg, slog.String("path", path))
		if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
