// Package deps builds, caches, shares and prunes the dependency images of
// apps with a manifest (docs/runtimes.md "Dependencies").
package deps

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/presence"
)

// Dependencies (docs/runtimes.md "Dependencies"): an app with a manifest
// runs in an image of its own, the runtime image plus one layer holding
// what the installer wrote to runtime.DepsDir. The image is named by a
// cache key, the hash of the manifest, the lockfile and the runtime
// image's digest, so that an unchanged manifest never builds again and
// every Runner of a containerd namespace shares it; a lease named by the
// key makes those Runners build each key once (Lock).

// Labels of a dependency image.
const (
	LabelApp      = "relay.deps.app"      // the app that built it first
	LabelBase     = "relay.deps.base"     // the runtime image's reference
	LabelBuilt    = "relay.deps.built"    // RFC 3339 time of the build
	LabelDuration = "relay.deps.duration" // build time, a Go duration
	LabelSize     = "relay.deps.size"     // bytes of the layer, compressed
	LabelUsed     = "relay.deps.used"     // RFC 3339 time a Runner last used it (Maintain)
)

// ImagePrefix names dependency images: ImagePrefix + the cache key (64
// hex digits).
const ImagePrefix = "relay.local/deps:"

// Limits of a build container.
const (
	BuildMemoryBytes = 2 << 30
	BuildPIDs        = 1024
)

// Config is how a Builder builds (the WithBuild and WithDeps options).
type Config struct {
	MaxBuilds     int           // builds at a time, > 0
	Timeout       time.Duration // bounds one build
	RetryInterval time.Duration // how long a failed build of a manifest is not tried again
	// Env holds the variables given to builds (BuildEnvNames).
	Env map[string]string
	// CAFile holds PEM certificates builds trust besides the image's; "" for none.
	CAFile string
	// Retention is how long an image no Runner uses stays; 0 for ever.
	Retention time.Duration
}

// Builder makes the dependency images of one Runner's apps, each key once
// for all the Runners of the namespace. It is safe for concurrent use.
type Builder struct {
	host     *core.Host
	presence *presence.Presence

	sem           chan struct{}
	timeout       time.Duration
	retryInterval time.Duration
	env           map[string]string
	caFile        string

	retention time.Duration // WithDepsRetention

	// closing ends the builds still running when the Runner closes, and
	// builds wait for them: a build outlives its callers (Prepare, Run)
	// but not its Runner, so that a stopping worker releases its lease and
	// removes its build container instead of leaving the lease to block
	// other workers until it expires.
	closing context.Context
	close   context.CancelFunc
	builds  sync.WaitGroup

	mu       sync.Mutex
	done     map[string]client.Image // by key
	inflight map[string]*depsCall
	failed   map[string]depsFailure
	used     map[string]time.Time // by key: this Runner's last use
	touched  map[string]time.Time // by key: when this Runner last wrote LabelUsed
}

type depsCall struct {
	done chan struct{}
	img  client.Image
	err  error
}

type depsFailure struct {
	err error
	at  time.Time
}

// New returns the Builder of host's Runner, whose presence tells other
// Runners that its builds' leases have a live holder.
func New(host *core.Host, p *presence.Presence, cfg Config) *Builder {
	closing, close := context.WithCancel(context.Background())
	return &Builder{
		host:          host,
		presence:      p,
		closing:       closing,
		close:         close,
		sem:           make(chan struct{}, cfg.MaxBuilds),
		timeout:       cfg.Timeout,
		retryInterval: cfg.RetryInterval,
		env:           cfg.Env,
		caFile:        cfg.CAFile,
		retention:     cfg.Retention,
		done:          map[string]client.Image{},
		used:          map[string]time.Time{},
		touched:       map[string]time.Time{},
		inflight:      map[string]*depsCall{},
		failed:        map[string]depsFailure{},
	}
}

// Key is the cache key of spec's dependencies on the image base (64 hex
// digits): the manifest, the runtime image and the installer's script, so
// that a Relay that installs differently builds anew.
func Key(spec runtime.Spec, base client.Image) string {
	h := sha256.New()
	script, _ := buildScript(spec)
	fmt.Fprintf(h, "relay deps v1\nruntime=%s\nbase=%s\ndeps=%s\nscript=%s\n", spec.Runtime, base.Target().Digest, spec.Deps.Digest(), script)
	return hex.EncodeToString(h.Sum(nil))
}

// Ensure returns the dependency image of app's spec on base (the runtime
// image ref), building it when no Runner has, and waits for the build
// until ctx ends. A failed build is an error wrapping
// runtime.ErrUnavailable with the installer's last lines, returned again
// without a build for the retry interval; a failure of the build's
// infrastructure is not remembered.
func (b *Builder) Ensure(ctx context.Context, spec runtime.Spec, ref string, base client.Image, app string) (client.Image, error) {
	key := Key(spec, base)
	b.mu.Lock()
	b.used[key] = time.Now()
	if img, ok := b.done[key]; ok {
		b.mu.Unlock()
		return img, nil
	}
	if f, ok := b.failed[key]; ok && time.Since(f.at) < b.retryInterval {
		b.mu.Unlock()
		return nil, f.err
	}
	call, ok := b.inflight[key]
	if !ok {
		if b.closing.Err() != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("dependency build of app %s: the runner is closed: %w", app, runtime.ErrUnavailable)
		}
		call = &depsCall{done: make(chan struct{})}
		b.inflight[key] = call
		b.builds.Add(1)
		go func() {
			defer b.builds.Done()
			// Detached: the callers waiting for it may come and go; only
			// closing the Runner ends it early (Close).
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout+time.Minute)
			defer cancel()
			defer context.AfterFunc(b.closing, cancel)()
			call.img, call.err = b.image(bctx, spec, ref, base, key, app)
			b.mu.Lock()
			delete(b.inflight, key)
			if call.err == nil {
				b.done[key] = call.img
				delete(b.failed, key)
			} else if !errors.Is(call.err, errDepsInfra) {
				b.failed[key] = depsFailure{err: call.err, at: time.Now()}
			}
			b.mu.Unlock()
			close(call.done)
		}()
	}
	b.mu.Unlock()
	select {
	case <-call.done:
		if call.err != nil {
			return nil, call.err
		}
		return call.img, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// Close ends the dependency builds still running and waits, until ctx
// ends, for each to release its lease and remove its build container; its
// error says they are still stopping. Ensure fails after Close.
func (b *Builder) Close(ctx context.Context) error {
	b.mu.Lock() // no build starts after this (Ensure)
	b.close()
	b.mu.Unlock()
	if !core.WaitUntil(ctx, b.builds.Wait) {
		return fmt.Errorf("dependency builds still stopping: %w", ctx.Err())
	}
	return nil
}

// errDepsInfra marks a build failure that is not the manifest's: it is not
// remembered, so the next invocation tries again.
var errDepsInfra = errors.New("dependency build infrastructure")

// image returns the image named by key, building it under the
// namespace's lock for key when it does not exist.
func (b *Builder) image(ctx context.Context, spec runtime.Spec, ref string, base client.Image, key, app string) (client.Image, error) {
	name := ImagePrefix + key
	if img, err := b.cached(ctx, name, app); img != nil || err != nil {
		return img, err
	}
	select {
	case b.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.sem }()
	lctx, unlock, err := b.Lock(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("lock dependency build: %w: %w", errDepsInfra, core.Classify(err))
	}
	defer unlock()
	// Another Runner may have built it while we waited.
	if img, err := b.cached(lctx, name, app); img != nil || err != nil {
		return img, err
	}
	return b.build(lctx, spec, ref, base, name, app)
}

// cached returns the image name, unpacked, or nil when it does not
// exist.
func (b *Builder) cached(ctx context.Context, name, app string) (client.Image, error) {
	img, err := b.host.Client.GetImage(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDepsInfra, core.Classify(fmt.Errorf("image %s: %w", name, err)))
	}
	unpacked, err := img.IsUnpacked(ctx, b.host.Snapshotter)
	if err == nil && !unpacked {
		err = img.Unpack(ctx, b.host.Snapshotter)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDepsInfra, core.Classify(fmt.Errorf("unpack %s: %w", name, err)))
	}
	b.host.Logger.LogAttrs(ctx, slog.LevelInfo, "dependency image cached; not rebuilding",
		slog.String("app", app), slog.String("image", name), slog.String("built", img.Labels()[LabelBuilt]))
	return img, nil
}

// depsLockPoll is how often a Runner waiting for another's build of the
// same key looks again.
const depsLockPoll = time.Second

// Lock takes the lock of key's build for every Runner of the
// containerd namespace: a lease with the id relay-deps-<key>, which only
// one can create. The returned context carries the lease, which keeps what
// the build writes from garbage collection until the image refers to it.
// A lease whose holder is gone (staleLease) is deleted and taken: at
// once when its worker restarted under the same host id, after the orphan
// timeout when it was replaced under another, and at the latest when the
// lease expires, the build timeout after it was taken. It returns the
// release of the lock, which never fails (a lease left expires).
func (b *Builder) Lock(ctx context.Context, key string) (context.Context, func(), error) {
	// The holder's presence is what tells others it lives (staleLease).
	b.presence.Announce(ctx)
	h := b.host
	ls := h.Client.LeasesService()
	id := "relay-deps-" + key
	ttl := b.timeout + 2*time.Minute
	for {
		l, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(ttl),
			leases.WithLabels(map[string]string{core.LabelOwner: h.Owner, core.LabelHost: h.HostID}))
		if err == nil {
			release := func() {
				dctx, cancel := h.Detached(ctx)
				defer cancel()
				if err := ls.Delete(dctx, l); err != nil && !errdefs.IsNotFound(err) {
					h.Logger.LogAttrs(dctx, slog.LevelWarn, "releasing the dependency build lease failed; it expires by itself",
						slog.String("lease", id), slog.Any("error", err))
				}
			}
			return leases.WithLease(ctx, l.ID), release, nil
		}
		if !errdefs.IsAlreadyExists(err) {
			return nil, nil, err
		}
		held, err := ls.List(ctx, "id=="+id)
		if err != nil {
			return nil, nil, err
		}
		for _, l := range held {
			if why := b.staleLease(ctx, l); why != "" {
				h.Logger.LogAttrs(ctx, slog.LevelWarn, "taking over the dependency build of a worker gone mid-build",
					slog.String("lease", id), slog.String("host_id", l.Labels[core.LabelHost]), slog.String("why", why))
				if err := ls.Delete(ctx, l); err != nil && !errdefs.IsNotFound(err) {
					return nil, nil, err
				}
			}
		}
		select {
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		case <-time.After(depsLockPoll):
		}
		// The holder may have finished: the caller looks for its image.
		if img, err := h.Client.GetImage(ctx, ImagePrefix+key); err == nil && img != nil {
			return ctx, func() {}, nil
		}
	}
}

// staleLease says why the build lease l has no live holder, or returns
// "" while it may have one. A holder announced its presence before taking
// l (Lock), so its host's presence label names it while it lives:
// another owner there is a later process of that host id (the holder is
// gone unless it still runs on this machine, a twin), and a label older
// than the orphan timeout a host gone, judged as Sweep judges it, only once
// this Runner's own presence is current. A lease of an older Relay, without
// a host, is stale only once expired.
func (b *Builder) staleLease(ctx context.Context, l leases.Lease) string {
	if exp, err := time.Parse(time.RFC3339, l.Labels["containerd.io/gc.expire"]); err == nil && time.Now().After(exp) {
		return "expired"
	}
	owner, host := l.Labels[core.LabelOwner], l.Labels[core.LabelHost]
	if host == "" || owner == b.host.Owner {
		return ""
	}
	if presence.LiveRunner(owner) {
		return ""
	}
	labels, err := b.host.Client.NamespaceService().Labels(ctx, b.host.Namespace)
	if err != nil {
		return ""
	}
	at, current, ok := presence.Parse(labels[presence.LabelPrefix+host])
	if !ok || current != owner {
		if b.presence.OwnedByAnotherLiveRunner(ctx, owner) {
			return ""
		}
		return "its host id is now another process's"
	}
	if orphan := b.presence.OrphanTimeout(); b.presence.HealthyFor(orphan/2) && time.Since(at) >= orphan {
		return "its worker's presence is older than the orphan timeout"
	}
	return ""
}

// Env puts the dependencies on the runtime's import path (PYTHONPATH,
// NODE_PATH), after any path the app's env sets.
func Env(spec runtime.Spec) oci.SpecOpts {
	name, dir := "PYTHONPATH", runtime.DepsDir+"/python"
	if spec.Runtime == runtime.RuntimeNode {
		name, dir = "NODE_PATH", runtime.DepsDir+"/node_modules"
	}
	return func(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
		if s.Process == nil {
			return nil
		}
		for i, kv := range s.Process.Env {
			if v, ok := strings.CutPrefix(kv, name+"="); ok {
				if v != "" {
					v += ":"
				}
				s.Process.Env[i] = name + "=" + v + dir
				return nil
			}
		}
		s.Process.Env = append(s.Process.Env, name+"="+dir)
		return nil
	}
}
