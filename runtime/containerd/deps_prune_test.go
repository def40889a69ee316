package containerd_test

import (
	"strings"
	"testing"
	"time"

	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/runtime"
	"github.com/relaydev/relay/runtime/containerd"
)

// TestSweepPrunesUnusedDepsImages: the sweep removes the dependency images
// whose last recorded use is older than the retention (an image built
// before uses were recorded counts from its build), keeps the recent ones
// and the ones this Runner's apps use, whose use it records on the image
// for the other Runners of the namespace; images that are not dependency
// images are never touched.
func TestSweepPrunesUnusedDepsImages(t *testing.T) {
	f := newFixture(t)
	if _, err := containerd.New(f.client, containerd.WithDepsRetention(time.Minute)); err == nil || !strings.Contains(err.Error(), "WithDepsRetention") {
		t.Errorf("WithDepsRetention(1m) = %v, want an error naming it", err)
	}
	r := f.newRunner(t, "test-"+randomHex(4),
		containerd.WithDefaultImages(map[string]string{runtime.RuntimePython3: containerdtest.Image}),
		containerd.WithDepsRetention(48*time.Hour))
	ctx := t.Context()
	spec := runtime.Spec{Dir: f.dir, Runtime: runtime.RuntimePython3,
		Deps: &runtime.Deps{Manifest: runtime.PythonManifest, ManifestData: []byte("relaydemo==1.0\n")}}
	di, ok, err := r.DepsImageOf(ctx, spec)
	if err != nil || !ok {
		t.Fatalf("DepsImageOf = %+v, %v, %v", di, ok, err)
	}

	// Every image points at the test image's manifest: what matters here
	// is names and labels, and a Runner can unpack it.
	base, err := f.client.GetImage(ctx, containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	is := f.client.ImageService()
	now := time.Now()
	stamp := func(d time.Duration) string { return now.Add(-d).UTC().Format(time.RFC3339) }
	key := func(c string) string { return containerd.DepsImagePrefix + strings.Repeat(c, 64) }
	plant := map[string]map[string]string{
		di.Name:                              {containerd.LabelDepsBuilt: stamp(240 * time.Hour), containerd.LabelDepsUsed: stamp(240 * time.Hour)},
		key("a"):                             {containerd.LabelDepsBuilt: stamp(240 * time.Hour), containerd.LabelDepsUsed: stamp(72 * time.Hour)},
		key("b"):                             {containerd.LabelDepsBuilt: stamp(72 * time.Hour)},
		key("c"):                             {containerd.LabelDepsBuilt: stamp(240 * time.Hour), containerd.LabelDepsUsed: stamp(time.Hour)},
		key("d"):                             {containerd.LabelDepsBuilt: "not a time"},
		"example.com/keep:1.0":               {containerd.LabelDepsBuilt: stamp(240 * time.Hour)},
		containerd.DepsImagePrefix + "short": {},
	}
	for name, labels := range plant {
		if _, err := is.Create(ctx, images.Image{Name: name, Target: base.Target(), Labels: labels}); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for name := range plant {
			_ = is.Delete(t.Context(), name)
		}
	})

	// The app's image exists: Prepare finds it in the cache and uses it.
	if err := r.Prepare(ctx, "shop", spec); err != nil {
		t.Fatal(err)
	}
	if err := r.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{di.Name: true, key("a"): false, key("b"): false, key("c"): true, key("d"): true,
		"example.com/keep:1.0": true, containerd.DepsImagePrefix + "short": true}
	for name, kept := range want {
		img, err := is.Get(ctx, name)
		switch {
		case kept && err != nil:
			t.Errorf("%s: %v, want it kept", name, err)
		case !kept && !errdefs.IsNotFound(err):
			t.Errorf("%s: err %v, want it removed", name, err)
		case name == di.Name && err == nil:
			used, perr := time.Parse(time.RFC3339, img.Labels[containerd.LabelDepsUsed])
			if perr != nil || now.Sub(used) > time.Minute {
				t.Errorf("%s: %s = %q, want the time of its use by the Runner", name, containerd.LabelDepsUsed, img.Labels[containerd.LabelDepsUsed])
			}
		}
	}
	// Once marked, the image keeps serving its app.
	if err := r.Prepare(ctx, "shop", spec); err != nil {
		t.Fatal(err)
	}
}
