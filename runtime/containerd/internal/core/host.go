package core

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/shim"
)

// Labels set on every container and snapshot a Runner creates (the
// public names are in package runtime/containerd).
const (
	LabelHost    = "relay.host"
	LabelApp     = "relay.app"
	LabelHandler = "relay.handler"
	LabelOwner   = "relay.owner"
)

// Config is what NewHost needs; every field is required.
type Config struct {
	Client      *client.Client
	Namespace   string
	Snapshotter string
	// HostID is the value of LabelHost, Owner the value of LabelOwner.
	HostID, Owner string
	Logger        *slog.Logger
	// CleanupTimeout bounds a removal detached from its caller (Detached).
	CleanupTimeout time.Duration
	// TaskGrace is how long a container may be without its task before a
	// sweep takes it for a leftover (WithTaskCreationGrace).
	TaskGrace time.Duration
}

// Host is one Runner's view of containerd. Its exported fields are set
// by NewHost and never change; the set of live containers is safe for
// concurrent use.
type Host struct {
	Config
	// Shims ends the shims of containers Remove removes.
	Shims *shim.Reaper

	mu   sync.Mutex
	live map[string]struct{} // containers of invocations in flight and warm ones, which sweeps spare
}

// NewHost returns the Host of cfg; it contacts nothing.
func NewHost(cfg Config) *Host {
	return &Host{Config: cfg, Shims: shim.New(cfg.Client, cfg.Namespace, cfg.Logger), live: map[string]struct{}{}}
}

// Detached returns a context that survives ctx's cancellation, bounded by
// the cleanup timeout.
func (h *Host) Detached(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), h.CleanupTimeout)
}

// Background is the context of work no Run waits for, in the Host's
// namespace.
func (h *Host) Background() context.Context {
	return namespaces.WithNamespace(context.Background(), h.Namespace)
}

// Track marks container id live (a sweep spares it) or no longer live.
func (h *Host) Track(id string, live bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if live {
		h.live[id] = struct{}{}
	} else {
		delete(h.live, id)
	}
}

// IsLive reports whether container id is tracked live.
func (h *Host) IsLive(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.live[id]
	return ok
}

// Labels returns the labels of a container of app's handler ("" for a
// container no handler has been given yet).
func (h *Host) Labels(app, handler string) map[string]string {
	return map[string]string{LabelHost: h.HostID, LabelOwner: h.Owner, LabelApp: app, LabelHandler: handler}
}

// LogCleanup logs a failed removal: it does not change the attempt's
// outcome, and Sweep removes the leftover at the next start. A prepared
// container that served no attempt has no handler, and its log line none
// either.
func (h *Host) LogCleanup(ctx context.Context, req runtime.Request, id string, err error) {
	if err == nil {
		return
	}
	attrs := []slog.Attr{slog.String("app", req.App)}
	if req.Handler != "" {
		attrs = append(attrs, slog.String("handler", req.Handler))
	}
	attrs = append(attrs, slog.String("container_id", id), slog.Any("error", err))
	h.Logger.LogAttrs(ctx, slog.LevelError, "container cleanup failed", attrs...)
}
