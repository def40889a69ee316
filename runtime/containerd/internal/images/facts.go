package images

import (
	"context"
	"sync"
	"time"

	"github.com/containerd/containerd/v2/client"
	digest "github.com/opencontainers/go-digest"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// imageFacts remembers, by image digest, what every Run would otherwise
// read from containerd again: the image config (content-addressed, so it
// never changes) and that the image is unpacked into the snapshotter
// (trusted for unpackedTTL, since an operator could remove the snapshots).
// It saves half a dozen containerd calls per Run (docs/runtimes.md
// "One-shot containers").
type imageFacts struct {
	mu       sync.Mutex
	byDigest map[digest.Digest]*imageFact
}

type imageFact struct {
	spec       *ocispec.Image
	unpackedAt time.Time
}

// unpackedTTL bounds how long an image found unpacked is taken to be.
const unpackedTTL = 10 * time.Second

func (f *imageFacts) get(d digest.Digest) *imageFact {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.byDigest == nil {
		f.byDigest = map[digest.Digest]*imageFact{}
	}
	fact := f.byDigest[d]
	if fact == nil {
		fact = &imageFact{}
		f.byDigest[d] = fact
	}
	return fact
}

// unpacked reports whether img was found unpacked within unpackedTTL.
func (f *imageFacts) unpacked(img client.Image) bool {
	fact := f.get(img.Target().Digest)
	f.mu.Lock()
	defer f.mu.Unlock()
	return !fact.unpackedAt.IsZero() && time.Since(fact.unpackedAt) < unpackedTTL
}

func (f *imageFacts) markUnpacked(img client.Image) {
	fact := f.get(img.Target().Digest)
	f.mu.Lock()
	defer f.mu.Unlock()
	fact.unpackedAt = time.Now()
}

// spec returns img's config, read once per digest.
func (f *imageFacts) spec(ctx context.Context, img client.Image) (ocispec.Image, error) {
	fact := f.get(img.Target().Digest)
	f.mu.Lock()
	s := fact.spec
	f.mu.Unlock()
	if s != nil {
		return *s, nil
	}
	spec, err := img.Spec(ctx)
	if err != nil {
		return ocispec.Image{}, err
	}
	f.mu.Lock()
	fact.spec = &spec
	f.mu.Unlock()
	return spec, nil
}

// Config returns img's config, read from containerd once per digest:
// content-addressed, it never changes.
func (s *Store) Config(ctx context.Context, img client.Image) (ocispec.Image, error) {
	return s.facts.spec(ctx, img)
}
