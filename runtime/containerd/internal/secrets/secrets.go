// Package secrets stages the secrets an app names into private copies
// that its containers mount read-only at /run/secrets, and sweeps the
// copies of containers that are gone (docs/apps.md "Secrets").
package secrets

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// MaxBytes bounds one secret file (the size of a Kubernetes Secret).
const MaxBytes = 1 << 20

// Stager copies secrets from the secrets directory (WithSecretsDir) for
// the containers of one Runner's namespace. It is safe for concurrent use.
type Stager struct {
	host *core.Host
	dir  string // the secrets directory
}

// New returns the Stager of host's namespace reading secrets from dir.
func New(host *core.Host, dir string) *Stager { return &Stager{host: host, dir: dir} }

// Staged is a private copy of an app's secrets on the host, which a
// container sees read-only at /run/secrets (docs/apps.md "Secrets"). The
// copy, not the secrets directory itself, is mounted: a container sees only
// its app's secrets, and a secret rotated while it runs changes for its
// next invocation, not in the middle of one.
type Staged struct {
	root string // private to the worker's user (0700); removed by remove
	dir  string // root/s: the mount's source
}

// secretError is the error of secret name that cannot be read; it wraps
// runtime.ErrUnavailable: a missing secret holds the app's messages pending
// until it appears.
func (r *Stager) secretError(name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("secret %q: no file %s in the secrets directory %s (RELAY_SECRETS_DIR): %w",
			name, name, r.dir, runtime.ErrUnavailable)
	}
	return fmt.Errorf("secret %q in the secrets directory %s: %v: %w", name, r.dir, err, runtime.ErrUnavailable)
}

// Check reports the first of names that cannot be read from the
// secrets directory, with an error wrapping runtime.ErrUnavailable.
func (r *Stager) Check(names []string) error {
	for _, name := range names {
		if err := runtime.CheckSecretName(name); err != nil {
			return fmt.Errorf("%w: %w", err, runtime.ErrUnavailable)
		}
		fi, err := os.Stat(filepath.Join(r.dir, name))
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			return r.secretError(name, err)
		}
	}
	return nil
}

// Stage copies the secrets names from the secrets directory into a
// new private directory; nil when names is empty. The error names the
// missing or unreadable secret, never a value.
func (r *Stager) Stage(names []string) (*Staged, error) {
	if len(names) == 0 {
		return nil, nil
	}
	s, err := r.newStagingDir()
	if err != nil {
		// The directory's name is random: the error names its parent.
		return nil, fmt.Errorf("stage secrets in %s: %w", os.TempDir(), core.PathCause(err))
	}
	if err := r.Refresh(s, names); err != nil {
		s.Remove()
		return nil, err
	}
	return s, nil
}

// stagingPrefix begins the names of the staging directories of namespace
// ns under os.TempDir(). '@' cannot occur in a containerd namespace, so no
// other namespace's directories share the prefix.
func stagingPrefix(ns string) string { return "relay-secrets-" + ns + "@" }

// newStagingDir makes a private directory for staged secrets: a new
// directory under os.TempDir() holding the directory containers mount,
// mode 0700 until filled.
func (r *Stager) newStagingDir() (*Staged, error) {
	root, err := os.MkdirTemp("", stagingPrefix(r.host.Namespace)+"*")
	if err != nil {
		return nil, err
	}
	s := &Staged{root: root, dir: filepath.Join(root, "s")}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		s.Remove()
		return nil, err
	}
	return s, nil
}

// Refresh (re)writes every secret of names into s from the secrets
// directory as it is now, each replaced in one rename.
func (r *Stager) Refresh(s *Staged, names []string) error {
	// Writable for the copy, then read-only for the handler user again.
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("stage secrets: %w", core.PathCause(err))
	}
	for _, name := range names {
		if err := runtime.CheckSecretName(name); err != nil {
			return fmt.Errorf("%w: %w", err, runtime.ErrUnavailable)
		}
		data, err := readSecret(filepath.Join(r.dir, name))
		if err != nil {
			return r.secretError(name, err)
		}
		tmp := filepath.Join(s.dir, ".tmp-"+name)
		// Errors name the secret, not the staging directory's random path.
		if err := writeSecret(tmp, data); err != nil {
			return fmt.Errorf("stage secret %q: %w", name, core.PathCause(err))
		}
		if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("stage secret %q: %w", name, core.PathCause(err))
		}
	}
	if err := handOver(s.dir, 0o500, 0o555); err != nil {
		return fmt.Errorf("stage secrets: %w", core.PathCause(err))
	}
	return nil
}

// readSecret reads one secret file, refusing more than MaxBytes and
// anything but a regular file. It opens without blocking: opening a named
// pipe for reading would otherwise wait for a writer, holding the
// invocation and the worker's stop for ever.
func readSecret(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, errors.New("not a regular file")
	}
	data, err := io.ReadAll(io.LimitReader(f, MaxBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxBytes)
	}
	return data, nil
}

func writeSecret(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, 0o400)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = handOver(path, 0o400, 0o444)
	}
	if err != nil {
		os.Remove(path)
	}
	return err
}

// handOver gives path to the handler user with mode owned; a worker that
// may not change owners (not root) makes it readable by all with mode
// shared instead: the private parent directory still keeps other users of
// the host out.
func handOver(path string, owned, shared fs.FileMode) error {
	if err := os.Chown(path, core.HandlerUID, core.HandlerGID); err != nil {
		return os.Chmod(path, shared)
	}
	return os.Chmod(path, owned)
}

// Mount is the read-only bind mount of s at /run/secrets.
func (s *Staged) Mount() specs.Mount {
	return specs.Mount{
		Destination: runtime.SecretsMountDir,
		Type:        "bind",
		Source:      s.dir,
		Options:     []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
	}
}

// Remove deletes the copy; nil s is a no-op.
func (s *Staged) Remove() {
	if s != nil {
		os.RemoveAll(s.root)
	}
}

// Sweep removes the staged secrets of the namespace that no
// container mounts and that are older than the task-creation grace: the
// copies of a worker killed before it removed them (docs/apps.md
// "Secrets"), which would otherwise keep secret values on the host's disk
// (TMPDIR is often on the state volume) long after a rotation. The grace
// spares a copy made for a container not created yet; a copy whose
// container was removed a moment ago is one its worker removes too.
func (r *Stager) Sweep(ctx context.Context) error {
	dir := os.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	prefix := stagingPrefix(r.host.Namespace)
	var stale []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) >= r.host.TaskGrace {
			stale = append(stale, filepath.Join(dir, e.Name()))
		}
	}
	if len(stale) == 0 {
		return nil
	}
	mounted, err := r.mountedSecrets(ctx)
	if err != nil {
		return err
	}
	var errs []error
	for _, root := range stale {
		if mounted[root] {
			continue
		}
		r.host.Logger.LogAttrs(ctx, slog.LevelWarn, "removing secrets staged for a container that is gone", slog.String("path", root))
		if err := os.RemoveAll(root); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountedSecrets returns the staging directories (roots) that containers of
// the namespace mount at runtime.SecretsMountDir, whatever worker made them.
func (r *Stager) mountedSecrets(ctx context.Context) (map[string]bool, error) {
	return r.host.Mounted(ctx, func(m specs.Mount) (string, bool) {
		return filepath.Dir(m.Source), m.Destination == runtime.SecretsMountDir
	})
}

// Empty returns an empty private secrets directory, readable by the
// handler user, for a container whose attempt fills it later (Refresh):
// a bind mount shows files written after the container was created.
func (r *Stager) Empty() (*Staged, error) {
	s, err := r.newStagingDir()
	if err != nil {
		return nil, fmt.Errorf("secrets directory: %w", err)
	}
	if err := handOver(s.dir, 0o500, 0o555); err != nil {
		s.Remove()
		return nil, fmt.Errorf("secrets directory: %w", err)
	}
	return s, nil
}
