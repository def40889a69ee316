package containerdtest_test

import (
	"testing"

	"github.com/relaydev/relay/internal/containerdtest"
)

func TestClient(t *testing.T) {
	c := containerdtest.Client(t)
	ns := c.DefaultNamespace()
	if len(ns) < len("relay-test-") || ns[:len("relay-test-")] != "relay-test-" {
		t.Fatalf("namespace %q", ns)
	}
	img, err := c.GetImage(t.Context(), containerdtest.Image)
	if err != nil {
		t.Fatal(err)
	}
	ok, err := img.IsUnpacked(t.Context(), containerdtest.Snapshotter)
	if err != nil || !ok {
		t.Fatalf("image unpacked = %v, %v", ok, err)
	}
	containerdtest.AssertClean(t, c)
}
