package containerd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/core/leases"
	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime"
)

// Dependencies (docs/runtimes.md "Dependencies"): an app with a manifest
// runs in an image of its own, the runtime image plus one layer holding
// what the installer wrote to runtime.DepsDir. The image is named by a
// cache key, the hash of the manifest, the lockfile and the runtime
// image's digest, so that an unchanged manifest never builds again and
// every Runner of a containerd namespace shares it; a lease named by the
// key makes those Runners build each key once (lockDeps).

// Labels of a dependency image.
const (
	LabelDepsApp      = "relay.deps.app"      // the app that built it first
	LabelDepsBase     = "relay.deps.base"     // the runtime image's reference
	LabelDepsBuilt    = "relay.deps.built"    // RFC 3339 time of the build
	LabelDepsDuration = "relay.deps.duration" // build time, a Go duration
	LabelDepsSize     = "relay.deps.size"     // bytes of the layer, compressed
	LabelDepsUsed     = "relay.deps.used"     // RFC 3339 time a Runner last used it (pruneDeps)
)

// DepsImage describes an app's dependency image (relay app inspect).
type DepsImage struct {
	// Name is the image's reference, DepsImagePrefix + cache key.
	Name string
	// Built is set when the image exists; the other fields then too.
	Built    bool
	At       time.Time
	Duration time.Duration
	// Size is the size of the dependency layer in bytes, compressed.
	Size int64
}

type depsBuilder struct {
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
	touched  map[string]time.Time // by key: when this Runner last wrote LabelDepsUsed
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

func newDepsBuilder(o options) depsBuilder {
	closing, close := context.WithCancel(context.Background())
	return depsBuilder{
		closing:       closing,
		close:         close,
		sem:           make(chan struct{}, o.maxBuilds),
		timeout:       o.buildTimeout,
		retryInterval: DefaultBuildRetryInterval,
		env:           o.buildEnv,
		caFile:        o.buildCAFile,
		retention:     o.depsRetention,
		done:          map[string]client.Image{},
		used:          map[string]time.Time{},
		touched:       map[string]time.Time{},
		inflight:      map[string]*depsCall{},
		failed:        map[string]depsFailure{},
	}
}

// depsKey is the cache key of spec's dependencies on the image base: the
// manifest, the runtime image and the installer's script, so that a Relay
// that installs differently builds anew.
func depsKey(spec runtime.Spec, base client.Image) string {
	h := sha256.New()
	script, _ := buildScript(spec)
	fmt.Fprintf(h, "relay deps v1\nruntime=%s\nbase=%s\ndeps=%s\nscript=%s\n", spec.Runtime, base.Target().Digest, spec.Deps.Digest(), script)
	return hex.EncodeToString(h.Sum(nil))
}

// DepsImageOf returns the dependency image of spec, built or not, without
// building it; ok is false when spec has no dependencies. The runtime
// image must be present.
func (r *Runner) DepsImageOf(ctx context.Context, spec runtime.Spec) (_ DepsImage, ok bool, _ error) {
	if spec.Deps == nil || spec.Runtime == "" {
		return DepsImage{}, false, nil
	}
	ctx = namespaces.WithNamespace(ctx, r.namespace)
	ref, _, _, err := r.resolve(spec)
	if err != nil {
		return DepsImage{}, true, err
	}
	base, err := r.client.GetImage(ctx, ref)
	if err != nil {
		return DepsImage{}, true, classify(fmt.Errorf("image %s: %w", ref, err))
	}
	info := DepsImage{Name: DepsImagePrefix + depsKey(spec, base)}
	img, err := r.client.ImageService().Get(ctx, info.Name)
	if errdefs.IsNotFound(err) {
		return info, true, nil
	}
	if err != nil {
		return info, true, classify(err)
	}
	info.Built = true
	info.At, _ = time.Parse(time.RFC3339, img.Labels[LabelDepsBuilt])
	info.Duration, _ = time.ParseDuration(img.Labels[LabelDepsDuration])
	info.Size, _ = strconv.ParseInt(img.Labels[LabelDepsSize], 10, 64)
	return info, true, nil
}

// ensureDeps returns the dependency image of spec on base (the runtime
// image ref), building it when no Runner has.
func (r *Runner) ensureDeps(ctx context.Context, spec runtime.Spec, ref string, base client.Image, app string) (depsResult, error) {
	key := depsKey(spec, base)
	b := &r.deps
	b.mu.Lock()
	b.used[key] = time.Now()
	if img, ok := b.done[key]; ok {
		b.mu.Unlock()
		return depsResult{image: img}, nil
	}
	if f, ok := b.failed[key]; ok && time.Since(f.at) < b.retryInterval {
		b.mu.Unlock()
		return depsResult{}, f.err
	}
	call, ok := b.inflight[key]
	if !ok {
		if b.closing.Err() != nil {
			b.mu.Unlock()
			return depsResult{}, fmt.Errorf("dependency build of app %s: the runner is closed: %w", app, runtime.ErrUnavailable)
		}
		call = &depsCall{done: make(chan struct{})}
		b.inflight[key] = call
		b.builds.Add(1)
		go func() {
			defer b.builds.Done()
			// Detached: the callers waiting for it may come and go; only
			// closing the Runner ends it early (closeDeps).
			bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.timeout+time.Minute)
			defer cancel()
			defer context.AfterFunc(b.closing, cancel)()
			call.img, call.err = r.depsImage(bctx, spec, ref, base, key, app)
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
			return depsResult{}, call.err
		}
		return depsResult{image: call.img}, nil
	case <-ctx.Done():
		return depsResult{}, ctx.Err()
	}
}

type depsResult struct {
	image client.Image
}

// closeDeps ends the dependency builds still running and waits, until ctx
// ends, for each to release its lease and remove its build container.
func (r *Runner) closeDeps(ctx context.Context) error {
	b := &r.deps
	b.mu.Lock() // no build starts after this (ensureDeps)
	b.close()
	b.mu.Unlock()
	if !waitUntil(ctx, b.builds.Wait) {
		return fmt.Errorf("dependency builds still stopping: %w", ctx.Err())
	}
	return nil
}

// errDepsInfra marks a build failure that is not the manifest's: it is not
// remembered, so the next invocation tries again.
var errDepsInfra = errors.New("dependency build infrastructure")

// depsImage returns the image named by key, building it under the host's
// lock for key when it does not exist.
func (r *Runner) depsImage(ctx context.Context, spec runtime.Spec, ref string, base client.Image, key, app string) (client.Image, error) {
	name := DepsImagePrefix + key
	if img, err := r.cachedDeps(ctx, name, app); img != nil || err != nil {
		return img, err
	}
	b := &r.deps
	select {
	case b.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-b.sem }()
	lctx, unlock, err := r.lockDeps(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("lock dependency build: %w: %w", errDepsInfra, classify(err))
	}
	defer unlock()
	// Another Runner may have built it while we waited.
	if img, err := r.cachedDeps(lctx, name, app); img != nil || err != nil {
		return img, err
	}
	return r.buildDeps(lctx, spec, ref, base, name, app)
}

// cachedDeps returns the image name, unpacked, or nil when it does not
// exist.
func (r *Runner) cachedDeps(ctx context.Context, name, app string) (client.Image, error) {
	img, err := r.client.GetImage(ctx, name)
	if errdefs.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDepsInfra, classify(fmt.Errorf("image %s: %w", name, err)))
	}
	unpacked, err := img.IsUnpacked(ctx, r.snapshotter)
	if err == nil && !unpacked {
		err = img.Unpack(ctx, r.snapshotter)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errDepsInfra, classify(fmt.Errorf("unpack %s: %w", name, err)))
	}
	r.logger.LogAttrs(ctx, slog.LevelInfo, "dependency image cached; not rebuilding",
		slog.String("app", app), slog.String("image", name), slog.String("built", img.Labels()[LabelDepsBuilt]))
	return img, nil
}

// depsLockPoll is how often a Runner waiting for another's build of the
// same key looks again.
const depsLockPoll = time.Second

// lockDeps takes the lock of key's build for every Runner of the
// containerd namespace: a lease with the id relay-deps-<key>, which only
// one can create. The returned context carries the lease, which keeps what
// the build writes from garbage collection until the image refers to it.
// A lease whose holder is gone (staleDepsLease) is deleted and taken: at
// once when its worker restarted under the same host id, after the orphan
// timeout when it was replaced under another, and at the latest when the
// lease expires, the build timeout after it was taken.
func (r *Runner) lockDeps(ctx context.Context, key string) (context.Context, func(), error) {
	// The holder's presence is what tells others it lives (staleDepsLease).
	r.announce(ctx)
	ls := r.client.LeasesService()
	id := "relay-deps-" + key
	ttl := r.deps.timeout + 2*time.Minute
	for {
		l, err := ls.Create(ctx, leases.WithID(id), leases.WithExpiration(ttl),
			leases.WithLabels(map[string]string{LabelOwner: r.presence.owner, LabelHost: r.hostID}))
		if err == nil {
			release := func() {
				dctx, cancel := r.detached(ctx)
				defer cancel()
				if err := ls.Delete(dctx, l); err != nil && !errdefs.IsNotFound(err) {
					r.logger.LogAttrs(dctx, slog.LevelWarn, "releasing the dependency build lease failed; it expires by itself",
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
		for _, h := range held {
			if why := r.staleDepsLease(ctx, h); why != "" {
				r.logger.LogAttrs(ctx, slog.LevelWarn, "taking over the dependency build of a worker gone mid-build",
					slog.String("lease", id), slog.String("host_id", h.Labels[LabelHost]), slog.String("why", why))
				if err := ls.Delete(ctx, h); err != nil && !errdefs.IsNotFound(err) {
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
		if img, err := r.client.GetImage(ctx, DepsImagePrefix+key); err == nil && img != nil {
			return ctx, func() {}, nil
		}
	}
}

// staleDepsLease says why the build lease l has no live holder, or returns
// "" while it may have one. A holder announced its presence before taking
// l (lockDeps), so its host's presence label names it while it lives:
// another owner there is a later process of that host id (the holder is
// gone unless it still runs on this machine, a twin), and a label older
// than the orphan timeout a host gone, judged as Sweep judges it, only once
// this Runner's own presence is current. A lease of an older Relay, without
// a host, is stale only once expired.
func (r *Runner) staleDepsLease(ctx context.Context, l leases.Lease) string {
	if exp, err := time.Parse(time.RFC3339, l.Labels["containerd.io/gc.expire"]); err == nil && time.Now().After(exp) {
		return "expired"
	}
	owner, host := l.Labels[LabelOwner], l.Labels[LabelHost]
	if host == "" || owner == r.presence.owner {
		return ""
	}
	if _, ok := liveRunners.Load(owner); ok {
		return ""
	}
	labels, err := r.client.NamespaceService().Labels(ctx, r.namespace)
	if err != nil {
		return ""
	}
	at, current, ok := parsePresence(labels[LabelPresencePrefix+host])
	if !ok || current != owner {
		if r.ownedByAnotherLiveRunner(ctx, owner) {
			return ""
		}
		return "its host id is now another process's"
	}
	if r.healthyFor(r.orphanTimeout/2) && time.Since(at) >= r.orphanTimeout {
		return "its worker's presence is older than the orphan timeout"
	}
	return ""
}

// depsEnv puts the dependencies on the runtime's import path, after any
// path the app's env sets.
func depsEnv(spec runtime.Spec) oci.SpecOpts {
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
