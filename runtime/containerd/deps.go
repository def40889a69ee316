package containerd

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/deps"
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

// DepsImageOf returns the dependency image of spec, built or not, without
// building it; ok is false when spec has no dependencies. The runtime
// image must be present.
func (r *Runner) DepsImageOf(ctx context.Context, spec runtime.Spec) (_ DepsImage, ok bool, _ error) {
	if spec.Deps == nil || spec.Runtime == "" {
		return DepsImage{}, false, nil
	}
	ctx = namespaces.WithNamespace(ctx, r.host.Namespace)
	ref, _, _, err := r.resolve(spec)
	if err != nil {
		return DepsImage{}, true, err
	}
	base, err := r.host.Client.GetImage(ctx, ref)
	if err != nil {
		return DepsImage{}, true, core.Classify(fmt.Errorf("image %s: %w", ref, err))
	}
	info := DepsImage{Name: DepsImagePrefix + deps.Key(spec, base)}
	img, err := r.host.Client.ImageService().Get(ctx, info.Name)
	if errdefs.IsNotFound(err) {
		return info, true, nil
	}
	if err != nil {
		return info, true, core.Classify(err)
	}
	info.Built = true
	info.At, _ = time.Parse(time.RFC3339, img.Labels[LabelDepsBuilt])
	info.Duration, _ = time.ParseDuration(img.Labels[LabelDepsDuration])
	info.Size, _ = strconv.ParseInt(img.Labels[LabelDepsSize], 10, 64)
	return info, true, nil
}
