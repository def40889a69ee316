// Package exechelper creates the tasks of prepared one-shot containers
// ahead of demand with the exec helper, relay-exec (cmd/relay-exec):
// it installs and keeps the helper's copy, and it creates, starts and
// discards those tasks (docs/runtimes.md "One-shot containers").
package exechelper

import (
	"bytes"
	"context"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"syscall"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/secrets"
	"github.com/relaydev/relay/runtime/containerd/internal/statedir"
)

// Pre-created tasks (docs/runtimes.md "One-shot containers"). With the exec
// helper, relay-exec (cmd/relay-exec), a prepared container also gets its
// task ahead of demand: created, not started, its process the helper
// with the handler's command line as arguments, stdin a pipe and stdout
// and stderr writers that the attempt taking it connects. The attempt then
// writes a header holding its own environment, then the event, and starts
// the task; the helper reads the header and replaces itself with the
// handler, which is PID 1 and reads the event from the same stdin.

// Name is the file name of the exec helper that relay start looks for
// next to its own executable.
const Name = "relay-exec"

// mountPath is where the helper is bind-mounted in a container.
const mountPath = "/.relay/exec"

// NextTo returns the path of Name in the directory of executable, or ""
// when there is no such file.
func NextTo(executable string) string {
	p := filepath.Join(filepath.Dir(executable), Name)
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		return ""
	}
	return p
}

// checkExecHelper reports why the file at path cannot serve as the exec
// helper in any image, or nil.
func checkExecHelper(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.Mode().IsRegular() || fi.Mode().Perm()&0o005 != 0o005 {
		return fmt.Errorf("not a regular file readable and executable by all (mode %s)", fi.Mode())
	}
	f, err := elf.Open(path)
	if err != nil {
		return fmt.Errorf("not an ELF executable: %w", err)
	}
	defer f.Close()
	if f.Type != elf.ET_EXEC && f.Type != elf.ET_DYN {
		return fmt.Errorf("not an ELF executable (%s)", f.Type)
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return errors.New("dynamically linked: build it with CGO_ENABLED=0")
		}
	}
	return nil
}

// Install checks the helper at path and copies it into the state
// directory stateDir (a private one under os.TempDir() when it is ""),
// where containerd can mount it even when this process runs in a
// container of its own. It returns the Helper of that copy, or why the
// file cannot serve in any image: not a static ELF executable readable
// and executable by all, or a copy that cannot be written.
func Install(path, stateDir string, logger *slog.Logger) (*Helper, error) {
	p, data, err := install(path, stateDir)
	if err != nil {
		return nil, err
	}
	return &Helper{path: p, data: data, logger: logger}, nil
}

func install(path, stateDir string) (string, []byte, error) {
	if err := checkExecHelper(path); err != nil {
		return "", nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	if stateDir == "" {
		if err := privateDir(statedir.UserHelperRoot()); err != nil {
			return "", nil, err
		}
	}
	sum := sha256.Sum256(data)
	dst := filepath.Join(statedir.HelperDir(stateDir), Name+"-"+hex.EncodeToString(sum[:8]))
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, data) {
		return dst, data, nil
	}
	if err := statedir.WriteAtomic(dst, data, 0o555); err != nil {
		return "", nil, err
	}
	return dst, data, nil
}

// Copy returns the path of the helper's copy for a prepared container, or
// "" when there is none: nil h, or a copy removed behind the Runner's back
// (a cleaned state or temp directory) that cannot be written again from
// memory. The container is then prepared without a task, and the failure
// is logged once until a copy works again.
func (h *Helper) Copy(ctx context.Context) string {
	if h == nil {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	fi, err := os.Stat(h.path)
	if err == nil && fi.Size() == int64(len(h.data)) {
		h.failing = false
		statedir.Touch(h.path, fi) // in use: no sweep takes it for an old version's
		return h.path
	}
	if err = statedir.WriteAtomic(h.path, h.data, 0o555); err == nil {
		h.failing = false
		return h.path
	}
	if !h.failing {
		h.failing = true
		h.logger.LogAttrs(ctx, slog.LevelWarn, "the exec helper's copy is gone and cannot be written again: prepared containers get their task on demand until it can",
			slog.String("path", h.path), slog.Any("error", err))
	}
	return ""
}

// Helper is the installed copy of the exec helper (WithExecHelper). It is
// safe for concurrent use.
type Helper struct {
	path   string
	data   []byte // its content, to write the copy again
	logger *slog.Logger

	mu      sync.Mutex
	failing bool // the copy could not be written: logged
}

// privateDir makes directory dir, mode 0700, unless it exists, and checks
// that it is a directory of this user's that no one else can write to: the
// helper copied into it runs in every container.
func privateDir(dir string) error {
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !fi.IsDir() || !ok || int(st.Uid) != os.Getuid() || fi.Mode().Perm()&0o022 != 0 {
		return fmt.Errorf("%s is not a directory of this user's that only it can write to (mode %s)", dir, fi.Mode())
	}
	return nil
}

// Spec makes a prepared container's process the helper at path (a Copy),
// running the command the spec had, and mounts the helper and, when not
// nil, the secrets directory that attempts fill (docs/apps.md "Secrets").
func Spec(path string, secrets *secrets.Staged) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Args = append([]string{mountPath}, s.Process.Args...)
		// Not noexec: the container executes it.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: mountPath, Type: "bind", Source: path,
			Options: []string{"bind", "ro", "nosuid", "nodev"}})
		if secrets != nil {
			s.Mounts = append(s.Mounts, secrets.Mount())
		}
		return nil
	}
}

// Task is the task of a prepared container, created and not started.
type Task struct {
	Task           client.Task
	stdin          *io.PipeWriter
	stdout, stderr *lateWriter
	// Secrets is mounted at /run/secrets; nil when the Spec names none.
	Secrets *secrets.Staged
}

// NewTask creates cont's task, whose snapshot mounts are rootfs, with
// the helper as its process (cont's spec has Spec); secrets is its
// secrets directory, if any.
func NewTask(ctx context.Context, host *core.Host, cont client.Container, rootfs []mount.Mount, secrets *secrets.Staged) (*Task, error) {
	stdin, w := io.Pipe()
	pt := &Task{stdin: w, stdout: &lateWriter{}, stderr: &lateWriter{}, Secrets: secrets}
	task, err := host.NewTask(ctx, cont, rootfs, cio.NewCreator(cio.WithStreams(stdin, pt.stdout, pt.stderr)))
	if err != nil {
		w.Close()
		return nil, err
	}
	pt.Task = task
	return pt, nil
}

// Start connects the attempt's output, feeds the helper the header with
// env (the attempt's environment, KEY=value) and then event, and starts
// the task.
func (pt *Task) Start(ctx context.Context, env []string, event []byte, stdout, stderr io.Writer) error {
	pt.stdout.attach(stdout)
	pt.stderr.attach(stderr)
	h, err := json.Marshal(struct {
		Env []string `json:"env"`
	}{env})
	if err != nil {
		return err
	}
	msg := make([]byte, 4, 4+len(h)+len(event))
	n := len(h)
	msg[0], msg[1], msg[2], msg[3] = byte(n>>24), byte(n>>16), byte(n>>8), byte(n)
	msg = append(append(msg, h...), event...)
	// The pipe passes the bytes on as the shim reads them: into the
	// process's stdin pipe, read once it runs. Release ends a write the
	// handler never reads.
	go func() {
		pt.stdin.Write(msg)
		pt.stdin.Close()
	}()
	return pt.Task.Start(ctx)
}

// Release closes the stdin pipe and removes the secrets directory; the
// task is deleted by its owner.
func (pt *Task) Release() {
	pt.stdin.CloseWithError(errors.New("released"))
	pt.Secrets.Remove()
}

// Discard kills and deletes the task, never started, then releases pt.
func (pt *Task) Discard(ctx context.Context, cont client.Container) error {
	defer pt.Release()
	err := core.DeleteTask(ctx, cont, pt.Task, client.WithProcessKill)
	if i := pt.Task.IO(); i != nil {
		// Deleted or not, the FIFOs and their copies go.
		i.Cancel()
		i.Close()
	}
	return err
}

// lateWriter passes writes on to the writer attach sets, holding those
// that come before (none do: the process writes once started).
type lateWriter struct {
	mu  sync.Mutex
	w   io.Writer
	buf bytes.Buffer
}

func (l *lateWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.w == nil {
		return l.buf.Write(p)
	}
	return l.w.Write(p)
}

func (l *lateWriter) attach(w io.Writer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.buf.Len() > 0 {
		w.Write(l.buf.Bytes())
		l.buf.Reset()
	}
	l.w = w
}
