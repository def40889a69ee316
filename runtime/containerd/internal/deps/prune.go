package deps

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/runtime/containerd/internal/core"
)

// Pruning dependency images (docs/runtimes.md "Dependencies"). An image is
// shared by every Runner of the namespace, each of which may be using it,
// so no Runner can tell alone that it is unused. Each records its use on
// the image instead (LabelUsed, written at most once per
// depsTouchInterval per image), and Sweep removes the images whose last
// recorded use is older than the retention. containerd's garbage collector
// then frees their content and snapshots; containers created from one keep
// their own snapshots until they are removed.

// depsTouchInterval is how often a Runner refreshes LabelUsed of an
// image it uses: the label is the only cross-Runner record of a use, and an
// update per Run would be a containerd call on the hot path.
const depsTouchInterval = time.Hour

// Maintain refreshes the use marks of the dependency images this
// Runner used and removes the images unused for longer than the
// retention (a Sweep). It returns the joined errors.
func (b *Builder) Maintain(ctx context.Context) error {
	if b.retention == 0 {
		return nil
	}
	now := time.Now()
	b.mu.Lock()
	var touch []string
	for key, at := range b.used {
		if at.After(b.touched[key]) && now.Sub(b.touched[key]) >= depsTouchInterval {
			touch = append(touch, key)
		}
	}
	used := make(map[string]time.Time, len(b.used))
	for key, at := range b.used {
		used[key] = at
	}
	b.mu.Unlock()

	is := b.host.Client.ImageService()
	var errs []error
	for _, key := range touch {
		img := images.Image{Name: ImagePrefix + key, Labels: map[string]string{LabelUsed: used[key].UTC().Format(time.RFC3339)}}
		if _, err := is.Update(ctx, img, "labels."+LabelUsed); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("mark dependency image %s used: %w", img.Name, core.Classify(err)))
			continue
		}
		b.mu.Lock()
		b.touched[key] = now
		b.mu.Unlock()
	}

	list, err := is.List(ctx, "labels."+strconv.Quote(LabelBuilt))
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("list dependency images: %w", core.Classify(err)))...)
	}
	for _, img := range list {
		key, ok := strings.CutPrefix(img.Name, ImagePrefix)
		if !ok {
			continue
		}
		last := lastUse(img.Labels)
		if at, ok := used[key]; ok && at.After(last) {
			last = at
		}
		if last.IsZero() || now.Sub(last) < b.retention {
			continue
		}
		b.host.Logger.LogAttrs(ctx, slog.LevelInfo, "removing dependency image unused for longer than the retention",
			slog.String("image", img.Name), slog.String("app", img.Labels[LabelApp]),
			slog.Time("last_used", last), slog.Duration("retention", b.retention))
		if err := is.Delete(ctx, img.Name); err != nil && !errdefs.IsNotFound(err) {
			errs = append(errs, fmt.Errorf("remove dependency image %s: %w", img.Name, core.Classify(err)))
			continue
		}
		b.mu.Lock()
		delete(b.done, key)
		delete(b.used, key)
		delete(b.touched, key)
		b.mu.Unlock()
	}
	return errors.Join(errs...)
}

// lastUse is the latest use recorded on a dependency image: LabelUsed,
// or its build time for an image built before Relay recorded uses. Zero
// when neither parses: such an image is left alone.
func lastUse(labels map[string]string) time.Time {
	for _, l := range []string{LabelUsed, LabelBuilt} {
		if at, err := time.Parse(time.RFC3339, labels[l]); err == nil {
			return at
		}
	}
	return time.Time{}
}
