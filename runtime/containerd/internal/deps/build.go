package deps

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/content"
	"github.com/containerd/containerd/v2/core/diff"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/containerd/v2/core/snapshots"
	"github.com/containerd/containerd/v2/pkg/cio"
	"github.com/containerd/containerd/v2/pkg/oci"
	"github.com/containerd/errdefs"
	"github.com/opencontainers/go-digest"
	"github.com/opencontainers/image-spec/identity"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// Limits of a build's output (docs/runtimes.md "Dependencies").
const (
	// buildLogLines is how many lines of a build's output are logged; the
	// rest is counted.
	buildLogLines = 200
	// buildTailLines is how many last lines a failed build reports.
	buildTailLines = 10
	// buildLineBytes caps one logged line.
	buildLineBytes = 1024
)

// Paths inside a build container.
const (
	buildManifestDir = "/relay-build"              // the manifest, lockfile and CA file, read-only
	buildCAFile      = "relay-build-ca.pem"        // RELAY_BUILD_CA_FILE's copy there
	buildHome        = "/tmp/relay-build-home"     // HOME and caches, on the tmpfs
	buildPythonDir   = runtime.DepsDir + "/python" // pip --target
	buildNodeDir     = runtime.DepsDir             // npm ci runs here
)

// errBuildTimedOut is runBuild's error for a build killed at the build
// timeout.
var errBuildTimedOut = errors.New("killed at the build timeout")

// buildScript returns the shell script that installs spec's dependencies
// into runtime.DepsDir. pip runs in /app so that relative paths in
// requirements.txt (--find-links wheels) name the app's files, and with -B:
// the bytecode of pip's own modules, written beside them, would otherwise
// end up in the layer (pip still compiles what it installs).
func buildScript(spec runtime.Spec) (script, what string) {
	d := spec.Deps
	if spec.Runtime == runtime.RuntimeNode {
		return fmt.Sprintf(`set -e
mkdir -p %[1]s
cp %[2]s/%[3]s %[2]s/%[4]s %[1]s/
cd %[1]s
exec npm ci --omit=dev --no-audit --no-fund --no-update-notifier
`, buildNodeDir, buildManifestDir, d.Manifest, d.Lockfile), "npm ci --omit=dev"
	}
	return fmt.Sprintf(`set -e
mkdir -p %[1]s
cd /app
exec python3 -B -m pip install --no-cache-dir --disable-pip-version-check --no-warn-script-location --target %[1]s -r %[2]s/%[3]s
`, buildPythonDir, buildManifestDir, d.Manifest), "pip install --target " + buildPythonDir
}

// build runs the installer in a build container from base and makes an
// image named name of base plus the layer of what it wrote.
func (b *Builder) build(ctx context.Context, spec runtime.Spec, ref string, base client.Image, name, app string) (client.Image, error) {
	start := time.Now()
	script, what := buildScript(spec)
	b.host.Logger.LogAttrs(ctx, slog.LevelInfo, "building dependency image",
		slog.String("app", app), slog.String("image", name), slog.String("base", ref), slog.String("installer", what))
	infra := func(err error) error { return depsInfra(app, err) }
	// The lease keeps the layer and the new blobs from garbage collection
	// until the image refers to them.
	lctx, done, err := b.host.Client.WithLease(ctx)
	if err != nil {
		return nil, infra(fmt.Errorf("lease: %w", err))
	}
	defer func() {
		dctx, cancel := b.host.Detached(ctx)
		defer cancel()
		done(dctx)
	}()
	staging, err := b.stageBuildFiles(spec)
	if staging != "" {
		defer os.RemoveAll(staging)
	}
	if err != nil {
		return nil, infra(err)
	}
	out := newBuildOutput(b.host.Logger, app)
	id := core.ContainerID(app, "deps-build")
	b.host.Track(id, true)
	defer b.host.Track(id, false)
	cont, err := b.createBuildContainer(lctx, id, app, spec, base, staging, script)
	if err != nil {
		return nil, infra(err)
	}
	defer func() {
		dctx, cancel := b.host.Detached(ctx)
		defer cancel()
		if err := cont.Delete(dctx, client.WithSnapshotCleanup); err != nil && !errdefs.IsNotFound(err) {
			b.host.Logger.LogAttrs(dctx, slog.LevelError, "build container cleanup failed", slog.String("app", app),
				slog.String("container_id", id), slog.Any("error", err))
		}
	}()
	code, err := b.runBuild(lctx, cont, out)
	out.Close()
	if err := b.buildFailed(ctx, app, what, code, err, out); err != nil {
		return nil, err
	}
	img, size, err := b.commitDeps(lctx, base, id, name, app, ref, what, start)
	if err != nil {
		return nil, infra(err)
	}
	b.host.Logger.LogAttrs(ctx, slog.LevelInfo, "dependency image built", slog.String("app", app), slog.String("image", name),
		slog.Int64("size_bytes", size), slog.Duration("duration", time.Since(start)))
	return img, nil
}

// stageBuildFiles writes the manifest, the lockfile and the extra CA
// certificates of a build to a new directory, which the build container
// mounts, and returns it ("" when none could be made).
func (b *Builder) stageBuildFiles(spec runtime.Spec) (string, error) {
	staging, err := os.MkdirTemp("", "relay-build-")
	if err != nil {
		return "", err
	}
	files := map[string][]byte{spec.Deps.Manifest: spec.Deps.ManifestData}
	if spec.Deps.Lockfile != "" {
		files[spec.Deps.Lockfile] = spec.Deps.LockfileData
	}
	if b.caFile != "" {
		// A copy beside the manifest: the worker may read the file at a
		// path containerd, which resolves bind mounts on the host, cannot.
		ca, err := os.ReadFile(b.caFile)
		if err != nil {
			return staging, fmt.Errorf("RELAY_BUILD_CA_FILE: %w", err)
		}
		files[buildCAFile] = ca
	}
	for f, data := range files {
		if err := os.WriteFile(filepath.Join(staging, f), data, 0o444); err != nil {
			return staging, err
		}
	}
	os.Chmod(staging, 0o755)
	return staging, nil
}

// createBuildContainer creates build container id of app from base,
// running script with the staged files; on error nothing is left.
func (b *Builder) createBuildContainer(lctx context.Context, id, app string, spec runtime.Spec, base client.Image, staging, script string) (client.Container, error) {
	labels := b.host.Labels(app, "deps-build")
	appDir, _ := filepath.Abs(spec.Dir)
	imgSpec, err := base.Spec(lctx)
	if err != nil {
		return nil, err
	}
	cont, err := b.host.Client.NewContainer(lctx, id,
		client.WithImage(base),
		client.WithSnapshotter(b.host.Snapshotter),
		client.WithNewSnapshot(id, base, snapshots.WithLabels(labels)),
		client.WithContainerLabels(labels),
		client.WithNewSpec(b.buildSpecOpts(imgSpec, appDir, staging, script)...),
	)
	if err != nil {
		b.host.Remove(lctx, id)
		return nil, fmt.Errorf("create build container: %w", err)
	}
	return cont, nil
}

// depsInfra marks err as a failure of app's build that is not the
// manifest's (errDepsInfra).
func depsInfra(app string, err error) error {
	return fmt.Errorf("dependency build of app %s: %w: %w", app, errDepsInfra, core.Classify(err))
}

// buildFailed says what a finished build's exit code and runBuild's error
// mean: nil for a success, an error wrapping runtime.ErrUnavailable for a
// failure of the installer (logged), a depsInfra error for one of the
// infrastructure.
func (b *Builder) buildFailed(ctx context.Context, app, what string, code int, err error, out *buildOutput) error {
	if errors.Is(err, errBuildTimedOut) {
		// The installer's doing, most often waiting on an index that does
		// not answer: a failure of this manifest, tried again after the
		// retry interval like any other, not at the next reload.
		b.host.Logger.LogAttrs(ctx, slog.LevelError, "dependency build timed out", slog.String("app", app),
			slog.String("installer", what), slog.Duration("timeout", b.timeout))
		return fmt.Errorf("dependency build of app %s timed out: %s was killed after %v; check that the worker reaches the package index (PIP_INDEX_URL, npm_config_registry, HTTPS_PROXY); last output: %s: %w",
			app, what, b.timeout, out.Tail(), runtime.ErrUnavailable)
	}
	if err != nil {
		return depsInfra(app, err)
	}
	if code != 0 {
		b.host.Logger.LogAttrs(ctx, slog.LevelError, "dependency build failed", slog.String("app", app),
			slog.String("installer", what), slog.Int("exit_code", code))
		return fmt.Errorf("dependency build of app %s failed (%s exited with code %d): %s%s: %w",
			app, what, code, out.Tail(), tlsHint(out.Tail()), runtime.ErrUnavailable)
	}
	return nil
}

// tlsHint points a build whose installer did not trust the package index's
// certificate (a TLS-intercepting proxy, a private index) at
// RELAY_BUILD_CA_FILE; "" for any other output.
func tlsHint(output string) string {
	for _, s := range []string{"SELF_SIGNED_CERT_IN_CHAIN", "UNABLE_TO_GET_ISSUER_CERT", "unable to get local issuer certificate",
		"CERTIFICATE_VERIFY_FAILED", "self signed certificate", "self-signed certificate"} {
		if strings.Contains(output, s) {
			return "; the installer does not trust the package index's TLS certificate: give its CA certificate with RELAY_BUILD_CA_FILE"
		}
	}
	return ""
}

// buildSpecOpts is the spec of a build container: the runtime image's
// environment plus the build variables, a writable root file system, host
// network, the app read-only at /app and the manifest at
// buildManifestDir. It runs as root without capabilities, so that it can
// write runtime.DepsDir and nothing owned by another user.
func (b *Builder) buildSpecOpts(img ocispec.Image, appDir, staging, script string) []oci.SpecOpts {
	env := append([]string(nil), img.Config.Env...)
	if len(env) == 0 {
		env = []string{core.DefaultPath}
	}
	env = append(env, "HOME="+buildHome, "npm_config_cache="+buildHome+"/.npm", "npm_config_update_notifier=false",
		"PIP_NO_CACHE_DIR=1")
	names := make([]string, 0, len(b.env))
	for k := range b.env {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		env = append(env, k+"="+b.env[k])
	}
	mounts := []specs.Mount{
		{Destination: "/app", Type: "bind", Source: appDir, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		{Destination: buildManifestDir, Type: "bind", Source: staging, Options: []string{"rbind", "ro", "nosuid", "nodev"}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.Itoa(1<<30)}},
	}
	if b.caFile != "" {
		ca := buildManifestDir + "/" + buildCAFile
		env = append(env, "PIP_CERT="+ca, "NODE_EXTRA_CA_CERTS="+ca)
	}
	return []oci.SpecOpts{
		oci.WithProcessArgs("/bin/sh", "-c", "mkdir -p "+buildHome+" && "+script),
		oci.WithProcessCwd("/"),
		oci.WithEnv(env),
		oci.WithUIDGID(0, 0),
		oci.WithNoNewPrivileges,
		oci.WithCapabilities(nil),
		core.WithNoAmbientCapabilities,
		seccomp.WithDefaultProfile(),
		oci.WithMounts(mounts),
		oci.WithMemoryLimit(BuildMemoryBytes),
		oci.WithPidsLimit(BuildPIDs),
		oci.WithHostNamespace(specs.NetworkNamespace),
		oci.WithHostResolvconf,
		oci.WithHostHostsFile,
	}
}

// runBuild runs the build container's task to its end, bounded by the
// build timeout, and returns its exit code.
func (b *Builder) runBuild(ctx context.Context, cont client.Container, out *buildOutput) (int, error) {
	task, err := cont.NewTask(ctx, cio.NewCreator(cio.WithStreams(bytes.NewReader(nil), out, out)))
	if err != nil {
		return 0, fmt.Errorf("create build task: %w", err)
	}
	defer func() {
		dctx, cancel := b.host.Detached(ctx)
		defer cancel()
		core.DeleteTask(dctx, cont, task, client.WithProcessKill)
	}()
	statusC, err := task.Wait(context.WithoutCancel(ctx))
	if err != nil {
		return 0, fmt.Errorf("wait build task: %w", err)
	}
	if err := task.Start(ctx); err != nil {
		return 0, fmt.Errorf("start build task: %w", err)
	}
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	select {
	case st := <-statusC:
		code, _, err := st.Result()
		if err != nil {
			return 0, err
		}
		core.DrainOutput(task, core.OutputDrainTimeout)
		return int(code), nil
	case <-t.C:
		b.host.Kill(ctx, task, statusC)
		return 0, fmt.Errorf("%w: it exceeded %v (WithBuildTimeout)", errBuildTimedOut, b.timeout)
	case <-ctx.Done():
		b.host.Kill(ctx, task, statusC)
		return 0, ctx.Err()
	}
}

// commitDeps turns what the build container id wrote into a layer (the
// diff service's Compare of its snapshot against the base's), writes the
// config and manifest of base plus that layer into the content store,
// creates the image name and unpacks it (the diff service's Apply). It
// returns the image and the layer's size.
func (b *Builder) commitDeps(ctx context.Context, base client.Image, id, name, app, ref, what string, start time.Time) (client.Image, int64, error) {
	sn := b.host.Client.SnapshotService(b.host.Snapshotter)
	cs := b.host.Client.ContentStore()
	diffIDs, err := base.RootFS(ctx)
	if err != nil {
		return nil, 0, err
	}
	parent := identity.ChainID(diffIDs).String()
	viewKey := id + "-lower"
	lower, err := sn.View(ctx, viewKey, parent)
	if err != nil {
		return nil, 0, fmt.Errorf("view of %s: %w", ref, err)
	}
	defer sn.Remove(context.WithoutCancel(ctx), viewKey)
	upper, err := sn.Mounts(ctx, id)
	if err != nil {
		return nil, 0, fmt.Errorf("mounts of the build: %w", err)
	}
	layer, err := b.host.Client.DiffService().Compare(ctx, lower, upper,
		diff.WithMediaType(ocispec.MediaTypeImageLayerGzip), diff.WithReference("relay-deps-"+id))
	if err != nil {
		return nil, 0, fmt.Errorf("diff of the build: %w", err)
	}
	diffID, err := images.GetDiffID(ctx, cs, layer)
	if err != nil {
		return nil, 0, fmt.Errorf("diff id of the layer: %w", err)
	}

	manifest, err := images.Manifest(ctx, cs, base.Target(), base.Platform())
	if err != nil {
		return nil, 0, fmt.Errorf("manifest of %s: %w", ref, err)
	}
	cfgBlob, err := content.ReadBlob(ctx, cs, manifest.Config)
	if err != nil {
		return nil, 0, fmt.Errorf("config of %s: %w", ref, err)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(cfgBlob, &cfg); err != nil {
		return nil, 0, fmt.Errorf("config of %s: %w", ref, err)
	}
	now := time.Now().UTC()
	cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, diffID)
	cfg.History = append(cfg.History, ocispec.History{Created: &now, CreatedBy: "relay: " + what, Comment: "dependencies of app " + app})
	cfgDesc, err := writeJSON(ctx, cs, ocispec.MediaTypeImageConfig, cfg, nil)
	if err != nil {
		return nil, 0, err
	}
	manifest.Config = cfgDesc
	manifest.MediaType = ocispec.MediaTypeImageManifest
	manifest.Layers = append(manifest.Layers, layer)
	gc := map[string]string{"containerd.io/gc.ref.content.config": cfgDesc.Digest.String()}
	for i, l := range manifest.Layers {
		gc["containerd.io/gc.ref.content.l."+strconv.Itoa(i)] = l.Digest.String()
	}
	mfDesc, err := writeJSON(ctx, cs, ocispec.MediaTypeImageManifest, manifest, gc)
	if err != nil {
		return nil, 0, err
	}
	rec := images.Image{Name: name, Target: mfDesc, Labels: map[string]string{
		LabelApp:      app,
		LabelBase:     ref,
		LabelBuilt:    now.Format(time.RFC3339),
		LabelUsed:     now.Format(time.RFC3339),
		LabelDuration: time.Since(start).Round(time.Millisecond).String(),
		LabelSize:     strconv.FormatInt(layer.Size, 10),
	}}
	stored, err := b.host.Client.ImageService().Create(ctx, rec)
	if errdefs.IsAlreadyExists(err) {
		stored, err = b.host.Client.ImageService().Get(ctx, name)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("create image %s: %w", name, err)
	}
	img := client.NewImageWithPlatform(b.host.Client, stored, base.Platform())
	if err := img.Unpack(ctx, b.host.Snapshotter); err != nil {
		return nil, 0, fmt.Errorf("unpack %s: %w", name, err)
	}
	return img, layer.Size, nil
}

// writeJSON stores v as a blob of mediaType with labels.
func writeJSON(ctx context.Context, cs content.Store, mediaType string, v any, labels map[string]string) (ocispec.Descriptor, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	desc := ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(b), Size: int64(len(b))}
	if err := content.WriteBlob(ctx, cs, "relay-deps-"+desc.Digest.Encoded(), bytes.NewReader(b), desc, content.WithLabels(labels)); err != nil {
		return ocispec.Descriptor{}, fmt.Errorf("write %s: %w", mediaType, err)
	}
	return desc, nil
}

// buildOutput logs a build's output line by line with the app's name, up
// to buildLogLines lines of at most buildLineBytes, and keeps the last
// buildTailLines for the error of a failed build.
type buildOutput struct {
	log *slog.Logger
	app string

	mu      sync.Mutex
	partial []byte
	logged  int
	dropped int
	tail    []string
}

func newBuildOutput(log *slog.Logger, app string) *buildOutput {
	return &buildOutput{log: log, app: app}
}

func (o *buildOutput) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range p {
		if c == '\n' {
			o.line()
			continue
		}
		if len(o.partial) < buildLineBytes {
			o.partial = append(o.partial, c)
		}
	}
	return len(p), nil
}

// line ends the current line. Called with mu held.
func (o *buildOutput) line() {
	s := strings.TrimRight(string(o.partial), "\r ")
	o.partial = o.partial[:0]
	if strings.TrimSpace(s) == "" {
		return
	}
	if o.logged < buildLogLines {
		o.logged++
		o.log.LogAttrs(context.Background(), slog.LevelInfo, "dependency build output", slog.String("app", o.app), slog.String("line", s))
	} else {
		o.dropped++
	}
	if strings.Contains(s, "A complete log of this run can be found in") {
		return // npm's log is in the build container, removed with it
	}
	o.tail = append(o.tail, s)
	if len(o.tail) > buildTailLines {
		o.tail = o.tail[1:]
	}
}

// Close ends a last unterminated line and logs how many lines were not.
func (o *buildOutput) Close() {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.partial) > 0 {
		o.line()
	}
	if o.dropped > 0 {
		o.log.LogAttrs(context.Background(), slog.LevelInfo, "dependency build output truncated",
			slog.String("app", o.app), slog.Int("lines_not_logged", o.dropped))
		o.dropped = 0
	}
}

// Tail returns the last lines of the output, joined by " | ".
func (o *buildOutput) Tail() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if len(o.tail) == 0 {
		return "no output"
	}
	return strings.Join(o.tail, " | ")
}
