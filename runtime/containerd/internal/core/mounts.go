package core

import (
	"context"
	"fmt"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/typeurl/v2"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// Mounted returns the keys that pick gives for the mounts of every
// container of the namespace, whatever worker made them, where it reports
// one: what a sweep of host files must not remove. An unreadable spec is
// an error, so that no mounted file is removed.
func (h *Host) Mounted(ctx context.Context, pick func(specs.Mount) (string, bool)) (map[string]bool, error) {
	conts, err := h.Client.Containers(ctx)
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", Classify(err))
	}
	mounted := make(map[string]bool)
	for _, c := range conts {
		info, err := c.Info(ctx, client.WithoutRefreshedMetadata)
		if err != nil || info.Spec == nil {
			continue
		}
		var spec specs.Spec
		if err := typeurl.UnmarshalTo(info.Spec, &spec); err != nil {
			// Unreadable: keep every file rather than remove a mounted one.
			return nil, fmt.Errorf("read the spec of container %s: %w", c.ID(), err)
		}
		for _, m := range spec.Mounts {
			if k, ok := pick(m); ok {
				mounted[k] = true
			}
		}
	}
	return mounted, nil
}
