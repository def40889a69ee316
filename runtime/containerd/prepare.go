package containerd

import (
	"context"

	"github.com/containerd/containerd/v2/pkg/namespaces"

	"github.com/relaydev/relay/runtime"
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
	ctx = namespaces.WithNamespace(ctx, r.namespace)
	if err := r.checkSecrets(spec.Secrets); err != nil {
		return err
	}
	ref, _, _, err := r.resolve(spec)
	if err != nil {
		return err
	}
	img, err := r.image(ctx, ref)
	if err != nil {
		return err
	}
	if spec.Deps == nil || spec.Runtime == "" {
		return nil
	}
	_, err = r.ensureDeps(ctx, spec, ref, img, app)
	return err
}
