package containerd

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
	"strconv"
	"sync"
	"syscall"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/mount"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
)

// Pre-created tasks (docs/runtimes.md "One-shot containers"). With the exec
// helper, relay-exec (cmd/relay-exec), a prepared container also gets its
// task ahead of demand: created, not started, its process the helper
// with the handler's command line as arguments, stdin a pipe and stdout
// and stderr writers that the attempt taking it connects. The attempt then
// writes a header holding its own environment, then the event, and starts
// the task; the helper reads the header and replaces itself with the
// handler, which is PID 1 and reads the event from the same stdin.

// ExecHelperName is the file name of the exec helper that relay start looks
// for next to its own executable.
const ExecHelperName = "relay-exec"

// execHelperMount is where the helper is bind-mounted in a container.
const execHelperMount = "/.relay/exec"

// WithExecHelper sets the exec helper (cmd/relay-exec, a static
// executable) with which prepared containers get their task created ahead
// of demand as well (docs/runtimes.md "One-shot containers"). New copies it
// into dir/bin of the state directory (WithStateDir; without one, into
// relay-exec-<uid> under os.TempDir()), from where containers mount it.
// A path that is not a static ELF executable readable and executable by
// all is logged once and ignored: prepared containers then have no task.
// Default: none.
func WithExecHelper(path string) Option {
	return func(o *options) error {
		o.execHelper = path
		return nil
	}
}

// ExecHelperNextTo returns the path of ExecHelperName in the directory of
// executable, or "" when there is no such file.
func ExecHelperNextTo(executable string) string {
	p := filepath.Join(filepath.Dir(executable), ExecHelperName)
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

// installExecHelper checks the helper at path and copies it into the state
// directory (a private one under os.TempDir() when none is set), where containerd can
// mount it even when this process runs in a container of its own; it
// returns the copy's path and its content.
func installExecHelper(path, stateDir string) (string, []byte, error) {
	if err := checkExecHelper(path); err != nil {
		return "", nil, err
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil, err
	}
	if stateDir == "" {
		if err := privateDir(userHelperRoot()); err != nil {
			return "", nil, err
		}
	}
	sum := sha256.Sum256(data)
	dst := filepath.Join(helperDir(stateDir), ExecHelperName+"-"+hex.EncodeToString(sum[:8]))
	if have, err := os.ReadFile(dst); err == nil && bytes.Equal(have, data) {
		return dst, data, nil
	}
	if err := writeFileAtomic(dst, data, 0o555); err != nil {
		return "", nil, err
	}
	return dst, data, nil
}

// helperDir is where installExecHelper copies the helper: bin/ of the
// state directory, or of userHelperRoot without one.
func helperDir(stateDir string) string {
	if stateDir == "" {
		stateDir = userHelperRoot()
	}
	return filepath.Join(stateDir, "bin")
}

// userHelperRoot is the directory of the helper copies of Runners without
// a state directory: one per user, shared by its processes, since copies
// are named by content.
func userHelperRoot() string {
	return filepath.Join(os.TempDir(), "relay-exec-"+strconv.Itoa(os.Getuid()))
}

// helperCopy returns the path of the exec helper's copy for a prepared
// container, or "" when there is no helper. A copy removed behind the
// Runner's back (a cleaned state or temp directory) is written again from
// memory; when that fails too the container is prepared without a task,
// and the failure is logged once until a copy works again.
func (r *Runner) helperCopy(ctx context.Context) string {
	h := &r.helper
	if h.path == "" {
		return ""
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	fi, err := os.Stat(h.path)
	if err == nil && fi.Size() == int64(len(h.data)) {
		h.failing = false
		touchCopy(h.path, fi) // in use: no sweep takes it for an old version's
		return h.path
	}
	if err = writeFileAtomic(h.path, h.data, 0o555); err == nil {
		h.failing = false
		return h.path
	}
	if !h.failing {
		h.failing = true
		r.logger.LogAttrs(ctx, slog.LevelWarn, "the exec helper's copy is gone and cannot be written again: prepared containers get their task on demand until it can",
			slog.String("path", h.path), slog.Any("error", err))
	}
	return ""
}

// execHelper is the installed copy of the exec helper (WithExecHelper).
type execHelper struct {
	path string // "" without a helper
	data []byte // its content, to write the copy again

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

// helperSpec makes a prepared container's process the helper, running the
// command the spec had, and mounts the helper and, when not nil, the
// secrets directory that attempts fill (docs/apps.md "Secrets").
func (r *Runner) helperSpec(helper string, secrets *stagedSecrets) oci.SpecOpts {
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		s.Process.Args = append([]string{execHelperMount}, s.Process.Args...)
		// Not noexec: the container executes it.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: execHelperMount, Type: "bind", Source: helper,
			Options: []string{"bind", "ro", "nosuid", "nodev"}})
		if secrets != nil {
			s.Mounts = append(s.Mounts, secrets.mount())
		}
		return nil
	}
}

// preTask is the task of a prepared container, created and not started.
type preTask struct {
	task           client.Task
	stdin          *io.PipeWriter
	stdout, stderr *lateWriter
	secrets        *stagedSecrets // mounted at /run/secrets; nil when the Spec names none
}

// newSecretsDir returns an empty private secrets directory for a prepared
// container, readable by the handler user.
func (r *Runner) newSecretsDir() (*stagedSecrets, error) {
	s, err := r.newStagingDir()
	if err != nil {
		return nil, fmt.Errorf("secrets directory: %w", err)
	}
	if err := handOver(s.dir, 0o500, 0o555); err != nil {
		s.remove()
		return nil, fmt.Errorf("secrets directory: %w", err)
	}
	return s, nil
}

// newPreTask creates cont's task, whose snapshot mounts are rootfs, with
// the helper as its process; secrets is its secrets directory, if any.
func (r *Runner) newPreTask(ctx context.Context, cont client.Container, rootfs []mount.Mount, secrets *stagedSecrets) (*preTask, error) {
	stdin, w := io.Pipe()
	pt := &preTask{stdin: w, stdout: &lateWriter{}, stderr: &lateWriter{}, secrets: secrets}
	task, err := r.newTask(ctx, cont, rootfs, cio.NewCreator(cio.WithStreams(stdin, pt.stdout, pt.stderr)))
	if err != nil {
		w.Close()
		return nil, err
	}
	pt.task = task
	return pt, nil
}

// start connects the attempt's output, feeds the helper the header with
// env and then event, and starts the task.
func (pt *preTask) start(ctx context.Context, env []string, event []byte, stdout, stderr io.Writer) error {
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
	// process's stdin pipe, read once it runs. release ends a write the
	// handler never reads.
	go func() {
		pt.stdin.Write(msg)
		pt.stdin.Close()
	}()
	return pt.task.Start(ctx)
}

// release closes the stdin pipe and removes the secrets directory; the
// task is deleted by its owner.
func (pt *preTask) release() {
	pt.stdin.CloseWithError(errors.New("released"))
	pt.secrets.remove()
}

// discard kills and deletes the task, never started, then releases pt.
func (pt *preTask) discard(ctx context.Context, cont client.Container) error {
	defer pt.release()
	err := deleteTask(ctx, cont, pt.task, client.WithProcessKill)
	if i := pt.task.IO(); i != nil {
		// Deleted or not, the FIFOs and their copies go.
		i.Cancel()
		i.Close()
	}
	return err
}

// attemptEnv returns the environment req's container would have been
// created with: the image's, the app's and the attempt's variables.
func (r *Runner) attemptEnv(ctx context.Context, id string, req runtime.Request, p prepared) ([]string, error) {
	s, err := oci.GenerateSpec(ctx, r.client, &containers.Container{ID: id}, p.spec(req)...)
	if err != nil {
		return nil, err
	}
	return s.Process.Env, nil
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
