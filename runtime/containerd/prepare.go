package containerd

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/oci"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/deps"
)

// Prepare readies what app needs before its handlers run (relay.Preparer,
// docs/runtimes.md "Images" and "Dependencies"): it checks that every
// secret of spec exists in the secrets directory, makes sure spec's image
// (image:, or the runtime's default) is in the namespace and unpacked,
// pulling it when it is absent and pulling is on (WithPull: the same pull,
// progress logs, time limit and memory of a failed pull as Run's), and
// builds spec's dependency image unless it is cached, waiting for the pull
// and the build until ctx ends. An image already present costs a lookup in
// containerd, no registry request. Errors wrap runtime.ErrUnavailable: a
// missing secret, an image that is absent and cannot be pulled, a failed
// build (with the installer's last lines), an unreachable containerd.
// When ctx ends, a pull it started ends with it.
func (r *Runner) Prepare(ctx context.Context, app string, spec runtime.Spec) error {
	ctx = namespaces.WithNamespace(ctx, r.host.Namespace)
	if err := r.secrets.Check(spec.Secrets); err != nil {
		return err
	}
	ref, _, _, err := r.resolve(spec)
	if err != nil {
		return err
	}
	img, err := r.images.Get(ctx, ref)
	if err != nil {
		return err
	}
	if spec.Deps == nil || spec.Runtime == "" {
		return nil
	}
	_, err = r.deps.Ensure(ctx, spec, ref, img, app)
	return err
}

// prepare resolves spec's image and command, checks its app directory and
// writes the bootstrap a language runtime needs.
func (r *Runner) prepare(ctx context.Context, spec runtime.Spec) (core.Prepared, error) {
	ref, argv, boot, err := r.resolve(spec)
	if err != nil {
		return core.Prepared{}, err
	}
	appDir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return core.Prepared{}, err
	}
	fi, err := os.Stat(appDir)
	if err != nil || !fi.IsDir() {
		return core.Prepared{}, fmt.Errorf("app directory %q is not a directory: %w", appDir, runtime.ErrUnavailable)
	}
	// The handler runs as HandlerUID, which sees /app through the "other"
	// permission bits; without them every attempt would fail inside.
	if fi.Mode().Perm()&0o005 != 0o005 {
		return core.Prepared{}, fmt.Errorf("app directory %q (mode %s) is not readable by the handler user (uid %d): run chmod -R o+rX %s: %w",
			appDir, fi.Mode().Perm(), core.HandlerUID, appDir, runtime.ErrUnavailable)
	}
	img, err := r.images.Get(ctx, ref)
	if err != nil {
		return core.Prepared{}, err
	}
	var extraOpts []oci.SpecOpts
	if spec.Deps != nil && spec.Runtime != "" {
		// The app's dependencies: the runtime image plus their layer.
		if img, err = r.deps.Ensure(ctx, spec, ref, img, filepath.Base(appDir)); err != nil {
			return core.Prepared{}, err
		}
		extraOpts = append(extraOpts, deps.Env(spec))
	}
	imgSpec, err := r.images.Config(ctx, img)
	if err != nil {
		return core.Prepared{}, core.Classify(fmt.Errorf("image %s: %w", ref, err))
	}
	var mounts []specs.Mount
	if boot != nil {
		m, err := r.bootstraps.Mount(*boot)
		if err != nil {
			return core.Prepared{}, err
		}
		argv, mounts = boot.Command(m.Destination), []specs.Mount{m}
	}
	return core.Prepared{Ref: ref, Img: img, ImgSpec: imgSpec, AppDir: appDir, Argv: argv, Mounts: mounts, SpecOpts: extraOpts}, nil
}

// resolve returns the image reference and command line for spec; argv is
// nil when the image's entrypoint runs. For a language runtime, boot is its
// bootstrap, which prepare mounts and whose command replaces argv.
func (r *Runner) resolve(spec runtime.Spec) (ref string, argv []string, boot *runtime.Bootstrap, err error) {
	ref = spec.Image
	if spec.Runtime == "" {
		if ref == "" {
			return "", nil, nil, fmt.Errorf("no image in template.yaml: %w", runtime.ErrUnavailable)
		}
		return ref, spec.Command, nil, nil
	}
	b, err := runtime.LookupBootstrap(spec.Runtime)
	if err != nil {
		return "", nil, nil, err
	}
	if ref == "" {
		ref = r.defaultImages[spec.Runtime]
	}
	if ref == "" {
		return "", nil, nil, fmt.Errorf("no image for runtime %q: set image in template.yaml or configure a default image: %w", spec.Runtime, runtime.ErrUnavailable)
	}
	return ref, nil, &b, nil
}

// resolveImage returns the image reference of spec (resolve).
func (r *Runner) resolveImage(spec runtime.Spec) (string, error) {
	ref, _, _, err := r.resolve(spec)
	return ref, err
}
