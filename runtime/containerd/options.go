package containerd

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"time"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/exechelper"
)

// Defaults (docs/apps.md "template.yaml", docs/operations.md).
const (
	// DefaultNamespace is the containerd namespace Relay works in.
	DefaultNamespace = "relay"
	// DefaultSnapshotter is the snapshotter of container root filesystems.
	DefaultSnapshotter = "overlayfs"
	// DefaultMemoryBytes (128 MiB), DefaultCPUs (1) and DefaultPIDs (128)
	// apply when the Spec leaves a limit at 0.
	DefaultMemoryBytes = core.DefaultMemoryBytes
	DefaultCPUs        = core.DefaultCPUs
	DefaultPIDs        = core.DefaultPIDs
	// DefaultTmpBytes (64 MiB) is the size of the tmpfs at /tmp when the
	// Spec leaves TmpBytes at 0, capped at half the memory limit (its
	// files count against it).
	DefaultTmpBytes = core.DefaultTmpBytes
	// DefaultCleanupTimeout bounds the removal of one container, task and
	// snapshot, which runs detached from the caller's context.
	DefaultCleanupTimeout = 30 * time.Second
	// HandlerUID and HandlerGID are the ids handlers run as
	// (nobody/nogroup, 65534).
	HandlerUID = core.HandlerUID
	HandlerGID = core.HandlerGID
	// DefaultPullTimeout bounds one image pull, download and unpack.
	DefaultPullTimeout = 10 * time.Minute
	// DefaultPullRetryInterval is how long a failed pull of an image is not
	// tried again; Runs needing the image fail at once meanwhile.
	DefaultPullRetryInterval = 30 * time.Second
	// DefaultPullProgressInterval is the period of the progress log line of
	// an image pull.
	DefaultPullProgressInterval = 5 * time.Second
	// DefaultWarmMaxInvocations is how many invocations a warm container
	// serves before it is replaced (WithWarmMaxInvocations).
	DefaultWarmMaxInvocations = 1000
	// DefaultWarmIdleTimeout is how long a warm container may stay unused
	// before it is removed (WithWarmIdleTimeout).
	DefaultWarmIdleTimeout = 5 * time.Minute
	// DefaultOrphanTimeout is how long a host's presence label may go
	// unrefreshed before other Runners sweep its containers
	// (WithOrphanTimeout).
	DefaultOrphanTimeout = 5 * time.Minute
)

// Default images of the language runtimes (docs/runtimes.md "Images":
// `image` defaults to the runtime's default image): the official images of
// Docker Hub, pulled when absent. WithDefaultImages replaces them, e.g. with images built
// offline by scripts/runtime-images.sh.
const (
	DefaultPython3Image = "docker.io/library/python:3.12-slim"
	DefaultNodeImage    = "docker.io/library/node:22-slim"
)

// DefaultImage returns the image a Runner without WithDefaultImages runs an
// app in that sets runtime rt and no image: DefaultPython3Image or
// DefaultNodeImage, and "" for any other runtime (go, or none).
func DefaultImage(rt string) string {
	switch rt {
	case runtime.RuntimePython3:
		return DefaultPython3Image
	case runtime.RuntimeNode:
		return DefaultNodeImage
	}
	return ""
}

// Option configures a Runner.
type Option func(*options) error

type options struct {
	namespace            string
	snapshotter          string
	hostID               string
	stdout, stderr       io.Writer
	defaultImages        map[string]string
	logger               *slog.Logger
	cleanupTimeout       time.Duration
	stateDir             string
	pull                 bool
	pullTimeout          time.Duration
	pullRetryInterval    time.Duration
	pullProgressInterval time.Duration
	warmMaxInvocations   int
	warmIdleTimeout      time.Duration
	warmMaxContainers    int
	taskCreationGrace    time.Duration
	orphanTimeout        time.Duration
	secretsDir           string
	maxBuilds            int
	buildTimeout         time.Duration
	buildEnv             map[string]string // nil: buildEnvFromOS
	buildCAFile          string
	depsRetention        time.Duration
	preparedContainers   int
	execHelper           string
}

// WithNamespace sets the containerd namespace in which images are looked up
// and containers created. Default: DefaultNamespace.
func WithNamespace(ns string) Option {
	return func(o *options) error {
		if ns == "" {
			return errors.New("containerd: WithNamespace: empty namespace")
		}
		o.namespace = ns
		return nil
	}
}

// WithSnapshotter sets the snapshotter for container root filesystems; the
// image is unpacked into it on first use. Default: DefaultSnapshotter.
func WithSnapshotter(name string) Option {
	return func(o *options) error {
		if name == "" {
			return errors.New("containerd: WithSnapshotter: empty name")
		}
		o.snapshotter = name
		return nil
	}
}

// MaxHostIDBytes bounds WithHostID's id: it is a label value, and part of
// the presence label's key, which containerd limits to 4 KiB together.
const MaxHostIDBytes = 1024

// WithHostID sets the value of the relay.host label that marks what this
// process creates, so that Sweep finds its leftovers after a crash. Processes
// sharing a containerd must use different ids. At most MaxHostIDBytes.
// Default: the hostname.
func WithHostID(id string) Option {
	return func(o *options) error {
		if id == "" {
			return errors.New("containerd: WithHostID: empty id")
		}
		if len(id) > MaxHostIDBytes {
			// containerd refuses labels over 4 KiB: nothing could run.
			return fmt.Errorf("containerd: WithHostID: id of %d bytes; at most %d (a hostname and consumer name that long cannot label containers)", len(id), MaxHostIDBytes)
		}
		o.hostID = id
		return nil
	}
}

// WithOutput sets where handler stdout and stderr lines go; both must be
// non-nil and may be the same writer. Default: os.Stdout and os.Stderr.
func WithOutput(stdout, stderr io.Writer) Option {
	return func(o *options) error {
		if stdout == nil || stderr == nil {
			return errors.New("containerd: WithOutput: nil writer")
		}
		o.stdout, o.stderr = stdout, stderr
		return nil
	}
}

// WithDefaultImages maps a language runtime ("python3", "node") to the image
// used when an app sets `runtime` but no `image`; each entry replaces the
// default of its runtime, the others keep theirs. Default: DefaultPython3Image
// and DefaultNodeImage.
func WithDefaultImages(images map[string]string) Option {
	return func(o *options) error {
		for rt, ref := range images {
			if _, err := runtime.LookupBootstrap(rt); err != nil {
				return fmt.Errorf("containerd: WithDefaultImages: %w", err)
			}
			if ref == "" {
				return fmt.Errorf("containerd: WithDefaultImages: empty image for runtime %q", rt)
			}
		}
		maps.Copy(o.defaultImages, images)
		return nil
	}
}

// WithStateDir sets the directory for the Runner's local files: the copies
// of the language bootstraps that it bind-mounts read-only into containers,
// in dir/bootstrap, named by content hash so that Runners of different
// versions can share dir. dir is created if missing. Default: a private
// directory made under os.TempDir() at the first use of a bootstrap.
func WithStateDir(dir string) Option {
	return func(o *options) error {
		if dir == "" {
			return errors.New("containerd: WithStateDir: empty directory")
		}
		o.stateDir = dir
		return nil
	}
}

// WithPull sets whether an image that is not in the namespace is pulled
// from its registry (anonymously, plain HTTP only for localhost) by Prepare
// or before the first container uses it (docs/runtimes.md "Images").
// Without pulling, such an app is unavailable until the image is imported.
// Default: true.
func WithPull(enabled bool) Option {
	return func(o *options) error {
		o.pull = enabled
		return nil
	}
}

// WithPullTimeout bounds one image pull (resolve, download and unpack).
// d must be > 0. Default: DefaultPullTimeout.
func WithPullTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithPullTimeout: must be > 0")
		}
		o.pullTimeout = d
		return nil
	}
}

// WithPullRetryInterval sets how long after a failed pull of an image Runs
// needing it fail at once with that pull's error instead of trying again, so
// that a backlog of messages does not hammer an unreachable registry.
// d must be > 0. Default: DefaultPullRetryInterval.
func WithPullRetryInterval(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithPullRetryInterval: must be > 0")
		}
		o.pullRetryInterval = d
		return nil
	}
}

// WithPullProgressInterval sets the period of the "image pull progress" log
// line while an image is pulled. d must be > 0.
// Default: DefaultPullProgressInterval.
func WithPullProgressInterval(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithPullProgressInterval: must be > 0")
		}
		o.pullProgressInterval = d
		return nil
	}
}

// WithLogger sets the logger for failures that do not change an outcome,
// such as a container that could not be removed. Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return errors.New("containerd: WithLogger: nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithCleanupTimeout bounds the detached removal of one invocation's
// container, task and snapshot. d must be > 0. Default: DefaultCleanupTimeout.
func WithCleanupTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithCleanupTimeout: must be > 0")
		}
		o.cleanupTimeout = d
		return nil
	}
}

// DefaultTaskCreationGrace is WithTaskCreationGrace's default.
const DefaultTaskCreationGrace = 30 * time.Second

// WithTaskCreationGrace sets how long Sweep leaves a container without a
// task alone: a worker that died while containerd created the task would
// otherwise have its container removed first, orphaning the task where no
// container listing finds it (containerd 1.6 cannot delete a task without
// its container). A later sweep removes both. The same grace is how long a
// shim may be seen without its container, and how old a staged copy of
// secrets that no container mounts must be, before a sweep ends or removes
// it (docs/operations.md "containerd"). d must be >= 0.
// Default: DefaultTaskCreationGrace.
func WithTaskCreationGrace(d time.Duration) Option {
	return func(o *options) error {
		if d < 0 {
			return errors.New("containerd: WithTaskCreationGrace: must be >= 0")
		}
		o.taskCreationGrace = d
		return nil
	}
}

// WithOrphanTimeout sets how long the presence label of another host id may
// go unrefreshed before this Runner's Sweep removes that host's containers
// and snapshots, and how often this Runner refreshes its own (every d/5,
// from its first Run or Sweep until Close; every 5 s while refreshing
// fails). A worker stalled for longer than d, or cut off from containerd,
// loses its containers: its running attempts then fail. Runners sharing a
// namespace should use the same d. d must be > 0.
// Default: DefaultOrphanTimeout.
func WithOrphanTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithOrphanTimeout: must be > 0")
		}
		o.orphanTimeout = d
		return nil
	}
}

// WithWarmMaxInvocations sets how many invocations a warm container serves
// before it is removed and a new one takes its place, which bounds what a
// leak in an app's code can accumulate. n must be > 0.
// Default: DefaultWarmMaxInvocations.
func WithWarmMaxInvocations(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return errors.New("containerd: WithWarmMaxInvocations: must be > 0")
		}
		o.warmMaxInvocations = n
		return nil
	}
}

// WithWarmIdleTimeout sets how long a warm container may wait for its next
// invocation before it is removed, so that an app that has gone quiet holds
// no memory. d must be > 0. Default: DefaultWarmIdleTimeout.
func WithWarmIdleTimeout(d time.Duration) Option {
	return func(o *options) error {
		if d <= 0 {
			return errors.New("containerd: WithWarmIdleTimeout: must be > 0")
		}
		o.warmIdleTimeout = d
		return nil
	}
}

// DefaultPreparedContainers is WithPreparedContainers's default.
const DefaultPreparedContainers = 2

// WithPreparedContainers sets how many one-shot containers (snapshot and
// container object) are kept ready per app, created in the background after
// the app's first Run, so that a Run skips their creation (docs/runtimes.md
// "One-shot containers"); they are removed 10 s after the app's last Run.
// n must be >= 0; 0 disables them, which suits a
// process that runs a few attempts and exits (relay app invoke).
// Default: DefaultPreparedContainers.
func WithPreparedContainers(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return errors.New("containerd: WithPreparedContainers: must be >= 0")
		}
		o.preparedContainers = n
		return nil
	}
}

// ExecHelperName ("relay-exec") is the file name of the exec helper that
// relay start looks for next to its own executable.
const ExecHelperName = exechelper.Name

// ExecHelperNextTo returns the path of ExecHelperName in the directory of
// executable, or "" when there is no such file.
func ExecHelperNextTo(executable string) string { return exechelper.NextTo(executable) }

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

// TmpBytes returns the size in bytes of the tmpfs at /tmp of spec's
// containers: resources.tmp, or DefaultTmpBytes but at most half the
// memory limit (docs/apps.md#templateyaml).
func TmpBytes(spec runtime.Spec) int64 { return core.TmpBytes(spec) }

// WithWarmMaxContainers caps the warm containers of one app, busy or idle;
// a Run that finds them all busy waits for one. n must be >= 0; 0 means no
// cap other than the number of concurrent Runs, which the Engine bounds by
// the app's concurrency. Default: 0.
func WithWarmMaxContainers(n int) Option {
	return func(o *options) error {
		if n < 0 {
			return errors.New("containerd: WithWarmMaxContainers: must be >= 0")
		}
		o.warmMaxContainers = n
		return nil
	}
}

func newOptions(opts []Option) (options, error) {
	o := options{
		namespace:         DefaultNamespace,
		snapshotter:       DefaultSnapshotter,
		stdout:            os.Stdout,
		stderr:            os.Stderr,
		cleanupTimeout:    DefaultCleanupTimeout,
		taskCreationGrace: DefaultTaskCreationGrace,
		orphanTimeout:     DefaultOrphanTimeout,
		defaultImages: map[string]string{
			runtime.RuntimePython3: DefaultImage(runtime.RuntimePython3),
			runtime.RuntimeNode:    DefaultImage(runtime.RuntimeNode),
		},
		pull:                 true,
		pullTimeout:          DefaultPullTimeout,
		pullRetryInterval:    DefaultPullRetryInterval,
		pullProgressInterval: DefaultPullProgressInterval,
		warmMaxInvocations:   DefaultWarmMaxInvocations,
		warmIdleTimeout:      DefaultWarmIdleTimeout,
		secretsDir:           runtime.DefaultSecretsDir,
		maxBuilds:            DefaultMaxConcurrentBuilds,
		buildTimeout:         DefaultBuildTimeout,
		depsRetention:        DefaultDepsRetention,
		preparedContainers:   DefaultPreparedContainers,
	}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return o, err
		}
	}
	if o.hostID == "" {
		h, err := os.Hostname()
		if err != nil || h == "" {
			return o, errors.New("containerd: no hostname; use WithHostID")
		}
		o.hostID = h
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	if o.buildEnv == nil {
		o.buildEnv = buildEnvFromOS()
	}
	return o, nil
}
