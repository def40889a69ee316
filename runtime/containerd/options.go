package containerd

import (
	"errors"
	"io"
	"log/slog"
	"maps"
	"os"
	"time"
)

// Defaults (reference.md "Apps and template.yaml"; DESIGN.md).
const (
	// DefaultNamespace is the containerd namespace Relay works in.
	DefaultNamespace = "relay"
	// DefaultSnapshotter is the snapshotter of container root filesystems.
	DefaultSnapshotter = "overlayfs"
	// DefaultMemoryBytes, DefaultCPUs and DefaultPIDs apply when the Spec
	// leaves a limit at 0.
	DefaultMemoryBytes = 128 << 20
	DefaultCPUs        = 1.0
	DefaultPIDs        = 128
	// DefaultCleanupTimeout bounds the removal of one container, task and
	// snapshot, which runs detached from the caller's context.
	DefaultCleanupTimeout = 30 * time.Second
	// HandlerUID and HandlerGID are the ids handlers run as (nobody/nogroup).
	HandlerUID = 65534
	HandlerGID = 65534
)

// Labels set on every container and snapshot the Runner creates.
const (
	LabelHost    = "relay.host"
	LabelApp     = "relay.app"
	LabelHandler = "relay.handler"
)

// Option configures a Runner.
type Option func(*options) error

type options struct {
	namespace      string
	snapshotter    string
	hostID         string
	stdout, stderr io.Writer
	defaultImages  map[string]string
	logger         *slog.Logger
	cleanupTimeout time.Duration
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

// WithHostID sets the value of the relay.host label that marks what this
// process creates, so that Sweep finds its leftovers after a crash. Processes
// sharing a containerd must use different ids. Default: the hostname.
func WithHostID(id string) Option {
	return func(o *options) error {
		if id == "" {
			return errors.New("containerd: WithHostID: empty id")
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
// used when an app sets `runtime` but no `image`. The map is copied.
// Default: none (such apps are unavailable until an image is configured).
func WithDefaultImages(images map[string]string) Option {
	return func(o *options) error {
		for rt, ref := range images {
			if rt == "" || ref == "" {
				return errors.New("containerd: WithDefaultImages: empty runtime or image")
			}
		}
		o.defaultImages = maps.Clone(images)
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

func newOptions(opts []Option) (options, error) {
	o := options{
		namespace:      DefaultNamespace,
		snapshotter:    DefaultSnapshotter,
		stdout:         os.Stdout,
		stderr:         os.Stderr,
		cleanupTimeout: DefaultCleanupTimeout,
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
	return o, nil
}
