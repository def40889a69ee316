package containerdtest

import (
	"bytes"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/core/images"
	"github.com/containerd/errdefs"
	"github.com/google/go-containerregistry/pkg/registry"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Registry is an in-memory OCI registry on the loopback interface, which
// containerd pulls from over plain HTTP. Its downloads can be held back,
// to observe a pull in progress, and it counts the requests it gets.
type Registry struct {
	// Host is the registry's host:port, the start of its references.
	Host string

	srv      *httptest.Server
	hold     atomic.Pointer[chan struct{}] // while set, downloads wait for it to close
	requests atomic.Int64
}

// NewRegistry starts a Registry, closed at the end of the test.
func NewRegistry(t testing.TB) *Registry {
	t.Helper()
	reg := &Registry{}
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	reg.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reg.requests.Add(1)
		download := r.Method == http.MethodGet || r.Method == http.MethodHead
		if download && (strings.Contains(r.URL.Path, "/manifests/") || strings.Contains(r.URL.Path, "/blobs/")) {
			if ch := reg.hold.Load(); ch != nil {
				select {
				case <-*ch:
				case <-r.Context().Done():
					return
				}
			}
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(reg.srv.Close)
	reg.Host = strings.TrimPrefix(reg.srv.URL, "http://")
	return reg
}

// Hold makes the downloads of manifests and blobs wait until release is
// called: a pull stays in progress even when containerd finds its blobs
// in another namespace (its content store shares them) and fetches none.
func (reg *Registry) Hold() (release func()) {
	ch := make(chan struct{})
	reg.hold.Store(&ch)
	return func() {
		reg.hold.Store(nil)
		close(ch)
	}
}

// Requests returns how many requests the registry got, held ones included.
func (reg *Registry) Requests() int64 { return reg.requests.Load() }

// Close stops the registry: it answers no more connections.
func (reg *Registry) Close() { reg.srv.Close() }

// Push pushes Image from c's default namespace to the registry as
// repo:tag, then deletes it and its content from that namespace, so that
// pulling it there downloads every blob again. It returns the pushed
// reference.
func (reg *Registry) Push(t testing.TB, c *client.Client, repo string) string {
	t.Helper()
	ctx := t.Context()
	img, err := c.GetImage(ctx, Image)
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/" + repo
	if err := c.Push(ctx, ref, img.Target()); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
	if err := c.ImageService().Delete(ctx, Image, images.SynchronousDelete()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ContentStore().Info(ctx, img.Target().Digest); !errdefs.IsNotFound(err) {
		t.Fatalf("the image's manifest is still in the content store (err %v): the pull would not download it", err)
	}
	return ref
}

// Tag makes the image the registry holds as from ("repo:tag") available
// as to too, as a push of it under that name would, without containerd:
// an image can appear in the registry while a test's Runner runs.
func (reg *Registry) Tag(t testing.TB, from, to string) {
	t.Helper()
	manifest := func(ref string) string {
		repo, tag, _ := strings.Cut(ref, ":")
		return reg.srv.URL + "/v2/" + repo + "/manifests/" + tag
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, manifest(from), nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", strings.Join([]string{ocispec.MediaTypeImageIndex, ocispec.MediaTypeImageManifest,
		images.MediaTypeDockerSchema2ManifestList, images.MediaTypeDockerSchema2Manifest}, ", "))
	resp, err := reg.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("get the manifest of %s: %v", from, err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("get the manifest of %s: status %s, %v", from, resp.Status, err)
	}
	put, err := http.NewRequestWithContext(t.Context(), http.MethodPut, manifest(to), bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	put.Header.Set("Content-Type", resp.Header.Get("Content-Type"))
	presp, err := reg.srv.Client().Do(put)
	if err != nil {
		t.Fatalf("put the manifest of %s as %s: %v", from, to, err)
	}
	presp.Body.Close()
	if presp.StatusCode != http.StatusCreated {
		t.Fatalf("put the manifest of %s as %s: status %s", from, to, presp.Status)
	}
}
