package containerd

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

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/typeurl/v2"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
)

// MaxSecretBytes bounds one secret file (the size of a Kubernetes Secret).
const MaxSecretBytes = 1 << 20

// stagedSecrets is a private copy of an app's secrets on the host, which a
// container sees read-only at /run/secrets (docs/apps.md "Secrets"). The
// copy, not the secrets directory itself, is mounted: a container sees only
// its app's secrets, and a secret rotated while it runs changes for its
// next invocation, not in the middle of one.
type stagedSecrets struct {
	root string // private to the worker's user (0700); removed by remove
	dir  string // root/s: the mount's source
}

// secretError is the error of secret name that cannot be read; it wraps
// runtime.ErrUnavailable: a missing secret holds the app's messages pending
// until it appears.
func (r *Runner) secretError(name string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("secret %q: no file %s in the secrets directory %s (RELAY_SECRETS_DIR): %w",
			name, name, r.secretsDir, runtime.ErrUnavailable)
	}
	return fmt.Errorf("secret %q in the secrets directory %s: %v: %w", name, r.secretsDir, err, runtime.ErrUnavailable)
}

// checkSecrets reports the first of names that cannot be read from the
// secrets directory, with an error wrapping runtime.ErrUnavailable.
func (r *Runner) checkSecrets(names []string) error {
	for _, name := range names {
		if err := runtime.CheckSecretName(name); err != nil {
			return fmt.Errorf("%w: %w", err, runtime.ErrUnavailable)
		}
		fi, err := os.Stat(filepath.Join(r.secretsDir, name))
		if err == nil && !fi.Mode().IsRegular() {
			err = errors.New("not a regular file")
		}
		if err != nil {
			return r.secretError(name, err)
		}
	}
	return nil
}

// stageSecrets copies the secrets names from the secrets directory into a
// new private directory; nil when names is empty. The error names the
// missing or unreadable secret, never a value.
func (r *Runner) stageSecrets(names []string) (*stagedSecrets, error) {
	if len(names) == 0 {
		return nil, nil
	}
	s, err := r.newStagingDir()
	if err != nil {
		// The directory's name is random: the error names its parent.
		return nil, fmt.Errorf("stage secrets in %s: %w", os.TempDir(), pathCause(err))
	}
	if err := r.refreshSecrets(s, names); err != nil {
		s.remove()
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
func (r *Runner) newStagingDir() (*stagedSecrets, error) {
	root, err := os.MkdirTemp("", stagingPrefix(r.namespace)+"*")
	if err != nil {
		return nil, err
	}
	s := &stagedSecrets{root: root, dir: filepath.Join(root, "s")}
	if err := os.Mkdir(s.dir, 0o700); err != nil {
		s.remove()
		return nil, err
	}
	return s, nil
}

// refreshSecrets (re)writes every secret of names into s from the secrets
// directory as it is now, each replaced in one rename.
func (r *Runner) refreshSecrets(s *stagedSecrets, names []string) error {
	// Writable for the copy, then read-only for the handler user again.
	if err := os.Chmod(s.dir, 0o700); err != nil {
		return fmt.Errorf("stage secrets: %w", pathCause(err))
	}
	for _, name := range names {
		if err := runtime.CheckSecretName(name); err != nil {
			return fmt.Errorf("%w: %w", err, runtime.ErrUnavailable)
		}
		data, err := readSecret(filepath.Join(r.secretsDir, name))
		if err != nil {
			return r.secretError(name, err)
		}
		tmp := filepath.Join(s.dir, ".tmp-"+name)
		// Errors name the secret, not the staging directory's random path.
		if err := writeSecret(tmp, data); err != nil {
			return fmt.Errorf("stage secret %q: %w", name, pathCause(err))
		}
		if err := os.Rename(tmp, filepath.Join(s.dir, name)); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("stage secret %q: %w", name, pathCause(err))
		}
	}
	if err := handOver(s.dir, 0o500, 0o555); err != nil {
		return fmt.Errorf("stage secrets: %w", pathCause(err))
	}
	return nil
}

// readSecret reads one secret file, refusing more than MaxSecretBytes and
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
	data, err := io.ReadAll(io.LimitReader(f, MaxSecretBytes+1))
	if err != nil {
		return nil, err
	}
	if len(data) > MaxSecretBytes {
		return nil, fmt.Errorf("larger than %d bytes", MaxSecretBytes)
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
	if err := os.Chown(path, HandlerUID, HandlerGID); err != nil {
		return os.Chmod(path, shared)
	}
	return os.Chmod(path, owned)
}

// mount is the read-only bind mount of s at /run/secrets.
func (s *stagedSecrets) mount() specs.Mount {
	return specs.Mount{
		Destination: runtime.SecretsMountDir,
		Type:        "bind",
		Source:      s.dir,
		Options:     []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
	}
}

// remove deletes the copy; nil s is a no-op.
func (s *stagedSecrets) remove() {
	if s != nil {
		os.RemoveAll(s.root)
	}
}

// sweepSecrets removes the staged secrets of the namespace that no
// container mounts and that are older than the task-creation grace: the
// copies of a worker killed before it removed them (docs/apps.md
// "Secrets"), which would otherwise keep secret values on the host's disk
// (TMPDIR is often on the state volume) long after a rotation. The grace
// spares a copy made for a container not created yet; a copy whose
// container was removed a moment ago is one its worker removes too.
func (r *Runner) sweepSecrets(ctx context.Context) error {
	dir := os.TempDir()
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list %s: %w", dir, err)
	}
	prefix := stagingPrefix(r.namespace)
	var stale []string
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		if fi, err := e.Info(); err == nil && time.Since(fi.ModTime()) >= r.taskGrace {
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
		r.logger.LogAttrs(ctx, slog.LevelWarn, "removing secrets staged for a container that is gone", slog.String("path", root))
		if err := os.RemoveAll(root); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// mountedSecrets returns the staging directories (roots) that containers of
// the namespace mount at runtime.SecretsMountDir, whatever worker made them.
func (r *Runner) mountedSecrets(ctx context.Context) (map[string]bool, error) {
	return r.mounted(ctx, func(m specs.Mount) (string, bool) {
		return filepath.Dir(m.Source), m.Destination == runtime.SecretsMountDir
	})
}

// mountSources returns the host paths that containers of the namespace
// bind-mount, whatever worker made them.
func (r *Runner) mountSources(ctx context.Context) (map[string]bool, error) {
	return r.mounted(ctx, func(m specs.Mount) (string, bool) { return m.Source, true })
}

// mounted returns the keys that pick gives for the mounts of every
// container of the namespace, where it reports one.
func (r *Runner) mounted(ctx context.Context, pick func(specs.Mount) (string, bool)) (map[string]bool, error) {
	conts, err := r.client.Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", classify(err))
	}
	mounted := make(map[string]bool)
	for _, c := range conts {
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil || info.Spec == nil {
			continue
		}
		var spec specs.Spec
		if err := typeurl.UnmarshalTo(info.Spec, &spec); err != nil {
			// Unreadable: keep every file rather than remove a mounted one.
			return nil, fmt.Errorf("read the spec of container %s: %w", c.ID(), err)
		}
		for _, m := range spec.Mounts {
			if k, ok := pick(m); ok {
				mounted[k] = true
			}
		}
	}
	return mounted, nil
}
