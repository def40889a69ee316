package core

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"

	"github.com/containerd/containerd/v2/client"
	"github.com/containerd/containerd/v2/pkg/oci"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
)

// Prepared is what a container of one Spec needs, resolved and checked:
// the image (present and unpacked; the dependency image when the app has
// dependencies), its config, the app directory and the command.
type Prepared struct {
	Ref     string // the image reference the Spec resolved to
	Img     client.Image
	ImgSpec ocispec.Image
	AppDir  string   // absolute
	Argv    []string // nil: the image's entrypoint
	Mounts  []specs.Mount
	// SpecOpts adjust the spec after SpecOpts (the dependencies' paths).
	SpecOpts []oci.SpecOpts
}

// Spec returns the OCI spec options of a container running req.
func (p Prepared) Spec(req runtime.Request) []oci.SpecOpts {
	return append(SpecOpts(req, p.ImgSpec, p.AppDir, p.Argv, p.Mounts), p.SpecOpts...)
}

// SpecKey identifies the containers that can serve spec with the image
// ref: equal keys mean equal image, command, mounts, environment and
// limits, so a container made for one serves the other.
func SpecKey(spec runtime.Spec, ref string) string {
	b, _ := json.Marshal(struct {
		Spec runtime.Spec
		Ref  string
	}{spec, ref}) // maps marshal in key order: the key is deterministic
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:16])
}
