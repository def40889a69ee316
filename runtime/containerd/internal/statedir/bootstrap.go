// Package statedir keeps the files a Runner writes on the host for its
// containers to mount: the copies of the language bootstraps and of the
// exec helper, in the state directory (WithStateDir) or a temporary one,
// each written atomically and named by its content, so that Runners of
// different versions share a directory; and it sweeps the copies no
// version has used for long (docs/operations.md "State directory").
package statedir

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// Bootstraps keeps the host copies of the embedded bootstraps, which
// Runs bind-mount read-only into containers (docs/apps.md "The handler contract").
// A copy is named by the hash of its content and written once, atomically,
// so Runners of different Relay versions can share a directory.
type Bootstraps struct {
	mu       sync.Mutex
	stateDir string          // WithStateDir; "" means a private temp dir
	dir      string          // where copies live, once known
	verified map[string]bool // copies whose content was checked
}

// NewBootstraps returns the Bootstraps of a Runner with the state
// directory stateDir ("": a private directory made under os.TempDir() at
// the first Mount, removed by RemovePrivate).
func NewBootstraps(stateDir string) *Bootstraps {
	return &Bootstraps{stateDir: stateDir, verified: map[string]bool{}}
}

// Mount returns the bind mount that puts b at b.MountPath(), writing the
// host copy first if it is missing or damaged. Errors name the directory and
// wrap runtime.ErrUnavailable: no handler of the runtime can run until the
// operator fixes the directory.
func (f *Bootstraps) Mount(b runtime.Bootstrap) (specs.Mount, error) {
	host, err := f.file(b)
	if err != nil {
		return specs.Mount{}, fmt.Errorf("bootstrap of runtime %s: %w (check the Runner's state directory): %w", b.Runtime, err, runtime.ErrUnavailable)
	}
	return specs.Mount{
		Destination: b.MountPath(),
		Type:        "bind",
		Source:      host,
		// The interpreter reads the script; nothing executes or writes it.
		Options: []string{"bind", "ro", "nosuid", "nodev", "noexec"},
	}, nil
}

func (f *Bootstraps) file(b runtime.Bootstrap) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.dir == "" {
		if f.stateDir == "" {
			d, err := os.MkdirTemp("", "relay-bootstrap-")
			if err != nil {
				return "", err
			}
			f.dir = d
		} else {
			f.dir = BootstrapDir(f.stateDir)
		}
	}
	path := filepath.Join(f.dir, b.Runtime+"-"+b.Digest()[:16]+filepath.Ext(b.FileName))
	if f.verified[path] {
		// Cheap check per Run: a copy removed behind our back (a cleaned
		// temp dir) would otherwise fail every container's mount.
		if fi, err := os.Stat(path); err == nil && fi.Size() == int64(len(b.Source)) {
			Touch(path, fi) // in use: no sweep takes it for an old version's
			return path, nil
		}
		delete(f.verified, path)
	}
	if have, err := os.ReadFile(path); err == nil && bytes.Equal(have, b.Source) {
		f.verified[path] = true
		return path, nil
	}
	if err := WriteAtomic(path, b.Source, 0o444); err != nil {
		return "", err
	}
	f.verified[path] = true
	return path, nil
}

// BootstrapDir is where Runners with the state directory stateDir keep
// their bootstrap copies.
func BootstrapDir(stateDir string) string { return filepath.Join(stateDir, "bootstrap") }

// RemovePrivate removes the temporary directory of a Runner without a
// state directory (Close): no other process uses it. A Run after Close
// fails before it mounts anything.
func (f *Bootstraps) RemovePrivate() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.stateDir == "" && f.dir != "" {
		os.RemoveAll(f.dir)
		f.dir, f.verified = "", map[string]bool{}
	}
}

// WriteAtomic writes data to path with mode through a temporary file
// renamed into place, so a reader (or a container being created by another
// process) never sees a partial script. Its error names path, never the
// temporary file, so that it reads the same every time: a failure repeated
// attempt after attempt (a full disk) is then logged as one
// (docs/operations.md#logs).
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
	if err := writeTemp(path, data, mode); err != nil {
		return fmt.Errorf("write %s: %w", path, core.PathCause(err))
	}
	return nil
}

func writeTemp(path string, data []byte, mode os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // after a successful rename: not found, harmless
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	// Readable by the handler user (uid 65534), writable by no one.
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}
