package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
)

// Containerfile mode (-containerfile): the final stage of a Containerfile
// is built as Docker would build it, from files another stage produced.
// That stage must be FROM scratch and hold only COPY --from=<stage>
// (regular files), ENV, USER, EXPOSE, WORKDIR, LABEL, ENTRYPOINT and CMD:
// anything that would need the base image's tools (RUN, ADD) is refused.
// -stage NAME=DIR says where the earlier stage NAME's filesystem is on
// disk, so COPY --from=NAME /out/relay reads DIR/out/relay. Each COPY is
// one layer, as in a Docker build. File times and the creation time are
// SOURCE_DATE_EPOCH when set, else the fixed epoch.

// buildOptions are the inputs of runContainerfile.
type buildOptions struct {
	out, ref, containerfile string
	stages                  map[string]string // stage name -> directory
	labels                  []string          // KEY=VALUE added to the Containerfile's
}

// finalStage parses the Containerfile with BuildKit's own parser and
// returns its last stage.
func finalStage(containerfile string) (instructions.Stage, error) {
	f, err := os.Open(containerfile)
	if err != nil {
		return instructions.Stage{}, err
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		return instructions.Stage{}, fmt.Errorf("parse %s: %w", containerfile, err)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		return instructions.Stage{}, fmt.Errorf("parse %s: %w", containerfile, err)
	}
	if len(stages) == 0 {
		return instructions.Stage{}, fmt.Errorf("%s has no stage", containerfile)
	}
	return stages[len(stages)-1], nil
}

func runContainerfile(o buildOptions) error {
	ref, err := name.ParseReference(o.ref, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("parse -ref: %w", err)
	}
	created, err := sourceDateEpoch()
	if err != nil {
		return err
	}
	st, err := finalStage(o.containerfile)
	if err != nil {
		return err
	}
	if st.BaseName != "scratch" {
		return fmt.Errorf("%s: the final stage is FROM %s; mkimage builds FROM scratch only (it cannot fetch a base image)", o.containerfile, st.BaseName)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	cfg := v1.Config{WorkingDir: "/", Labels: map[string]string{}}
	for _, c := range st.Commands {
		switch c := c.(type) {
		case *instructions.CopyCommand:
			layer, err := copyLayer(c, o.stages, created)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", o.containerfile, c, err)
			}
			img, err = mutate.Append(img, mutate.Addendum{
				Layer:     layer,
				MediaType: types.OCILayer,
				History:   v1.History{Created: v1.Time{Time: created}, CreatedBy: c.String()},
			})
			if err != nil {
				return err
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				cfg.Env = slices.DeleteFunc(cfg.Env, func(e string) bool { return strings.HasPrefix(e, kv.Key+"=") })
				cfg.Env = append(cfg.Env, kv.Key+"="+kv.Value)
			}
		case *instructions.UserCommand:
			cfg.User = c.User
		case *instructions.WorkdirCommand:
			cfg.WorkingDir = c.Path
		case *instructions.ExposeCommand:
			if cfg.ExposedPorts == nil {
				cfg.ExposedPorts = map[string]struct{}{}
			}
			for _, p := range c.Ports {
				if !strings.Contains(p, "/") {
					p += "/tcp"
				}
				cfg.ExposedPorts[p] = struct{}{}
			}
		case *instructions.LabelCommand:
			for _, kv := range c.Labels {
				cfg.Labels[kv.Key] = kv.Value
			}
		case *instructions.EntrypointCommand:
			if c.PrependShell {
				return fmt.Errorf("%s: %s: use the exec form (a JSON array): the image has no shell", o.containerfile, c)
			}
			cfg.Entrypoint = c.CmdLine
		case *instructions.CmdCommand:
			if c.PrependShell {
				return fmt.Errorf("%s: %s: use the exec form (a JSON array): the image has no shell", o.containerfile, c)
			}
			cfg.Cmd = c.CmdLine
		default:
			return fmt.Errorf("%s: %s: mkimage builds a FROM scratch stage of COPY --from, ENV, USER, WORKDIR, EXPOSE, LABEL, ENTRYPOINT and CMD only", o.containerfile, c)
		}
	}
	for _, l := range o.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("-label %q: want KEY=VALUE", l)
		}
		cfg.Labels[k] = v
	}
	if len(cfg.Labels) == 0 {
		cfg.Labels = nil
	}

	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Created = v1.Time{Time: created}
	cf.Config = cfg
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return err
	}
	return writeLayoutArchive(o.out, ref, img, created)
}

// sourceDateEpoch is SOURCE_DATE_EPOCH (seconds since 1970, the
// reproducible-builds convention), or epoch when it is unset.
func sourceDateEpoch() (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		return epoch, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH=%q: want seconds since 1970", s)
	}
	return time.Unix(n, 0).UTC(), nil
}

// copyLayer returns the layer of one COPY --from: each source file at the
// destination (inside it when the destination ends in / or there are
// several sources), with its parent directories (0755), owned by root or
// --chown's numeric owner, mode --chmod or the source's.
func copyLayer(c *instructions.CopyCommand, stages map[string]string, mtime time.Time) (v1.Layer, error) {
	switch {
	case c.From == "":
		return nil, errors.New("COPY from the build context: mkimage copies from a stage only (COPY --from=<stage>)")
	case c.Link || c.Parents || len(c.ExcludePatterns) > 0 || len(c.SourceContents) > 0:
		return nil, errors.New("--link, --parents, --exclude and heredocs are not supported")
	}
	root, ok := stages[c.From]
	if !ok {
		return nil, fmt.Errorf("no -stage %s=DIR given for --from=%s", c.From, c.From)
	}
	var uid, gid int
	if c.Chown != "" {
		u, g, _ := strings.Cut(c.Chown, ":")
		var err error
		if uid, err = strconv.Atoi(u); err == nil && g != "" {
			gid, err = strconv.Atoi(g)
		} else if err == nil {
			gid = uid
		}
		if err != nil {
			return nil, fmt.Errorf("--chown=%s: want numeric uid[:gid] (the image has no /etc/passwd)", c.Chown)
		}
	}
	var chmod int64 = -1
	if c.Chmod != "" {
		m, err := strconv.ParseInt(c.Chmod, 8, 32)
		if err != nil || m > 0o7777 {
			return nil, fmt.Errorf("--chmod=%s: want an octal mode", c.Chmod)
		}
		chmod = m
	}

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	mkdirs := func(dir string) error {
		var missing []string
		for d := dir; d != "/" && d != "." && !dirs[d]; d = path.Dir(d) {
			missing = append(missing, d)
		}
		for _, d := range slices.Backward(missing) {
			dirs[d] = true
			h := &tar.Header{Typeflag: tar.TypeDir, Name: strings.TrimPrefix(d, "/") + "/", Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		}
		return nil
	}
	dest := c.DestPath
	if !path.IsAbs(dest) {
		return nil, fmt.Errorf("destination %s: want an absolute path", dest)
	}
	intoDir := strings.HasSuffix(dest, "/") || len(c.SourcePaths) > 1
	for _, src := range c.SourcePaths {
		if strings.ContainsAny(src, "*?[") {
			return nil, fmt.Errorf("source %s: name files, not patterns", src)
		}
		p := filepath.Join(root, filepath.FromSlash(src))
		fi, err := os.Stat(p)
		if err != nil {
			return nil, fmt.Errorf("stage %s: %w", c.From, err)
		}
		if !fi.Mode().IsRegular() {
			return nil, fmt.Errorf("stage %s: %s is not a regular file (mkimage copies files only)", c.From, src)
		}
		dst := path.Clean(dest)
		if intoDir {
			dst = path.Join(dst, path.Base(src))
		}
		if err := mkdirs(path.Dir(dst)); err != nil {
			return nil, err
		}
		mode := int64(fi.Mode().Perm())
		if chmod >= 0 {
			mode = chmod
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		h := &tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(dst, "/"), Mode: mode, Uid: uid, Gid: gid,
			Size: int64(len(data)), ModTime: mtime, Format: tar.FormatPAX}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	b := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// writeLayoutArchive writes img to out as one tarball that is both an OCI
// image layout (oci-layout, index.json, blobs/sha256/...) and, through
// manifest.json pointing into the same blobs, a docker-archive: the shape
// `docker save` writes since Docker 25. containerd's import reads the OCI
// layout (the image keeps its manifest digest and its name, from the
// io.containerd.image.name annotation); `docker load` reads manifest.json.
// Every entry has the time mtime, so the tarball is reproducible.
func writeLayoutArchive(out string, ref name.Reference, img v1.Image, mtime time.Time) error {
	manifest, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	config, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	configName, err := img.ConfigName()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	annotations := map[string]string{"io.containerd.image.name": ref.Name()}
	var repoTags []string
	if tag, ok := ref.(name.Tag); ok {
		annotations["org.opencontainers.image.ref.name"] = tag.TagStr()
		repoTags = []string{tag.String()}
	}
	index, err := json.Marshal(v1.IndexManifest{
		SchemaVersion: 2,
		MediaType:     types.OCIImageIndex,
		Manifests: []v1.Descriptor{{
			MediaType:   types.OCIManifestSchema1,
			Size:        int64(len(manifest)),
			Digest:      digest,
			Annotations: annotations,
		}},
	})
	if err != nil {
		return err
	}
	docker := []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}{{Config: blob(configName), RepoTags: repoTags}}

	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	tw := tar.NewWriter(tmp)
	dir := func(name string) error {
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755, ModTime: mtime, Format: tar.FormatPAX})
	}
	file := func(name string, size int64, r io.Reader) error {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: size, ModTime: mtime, Format: tar.FormatPAX}); err != nil {
			return err
		}
		n, err := io.Copy(tw, r)
		if err == nil && n != size {
			err = fmt.Errorf("%s: wrote %d bytes, want %d", name, n, size)
		}
		return err
	}
	bytesFile := func(name string, b []byte) error { return file(name, int64(len(b)), bytes.NewReader(b)) }

	err = errors.Join(
		bytesFile("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)),
		dir("blobs/"), dir("blobs/sha256/"),
		bytesFile(blob(configName), config),
	)
	for _, l := range layers {
		if err != nil {
			break
		}
		var d v1.Hash
		var size int64
		var rc io.ReadCloser
		if d, err = l.Digest(); err != nil {
			break
		}
		if size, err = l.Size(); err != nil {
			break
		}
		if rc, err = l.Compressed(); err != nil {
			break
		}
		docker[0].Layers = append(docker[0].Layers, blob(d))
		err = file(blob(d), size, rc)
		rc.Close()
	}
	if err == nil {
		var dj []byte
		dj, err = json.Marshal(docker)
		if err == nil {
			err = errors.Join(bytesFile(blob(digest), manifest), bytesFile("index.json", index), bytesFile("manifest.json", dj), tw.Close())
		}
	}
	if err != nil {
		tmp.Close()
		return fmt.Errorf("write archive: %w", err)
	}
	if err := errors.Join(tmp.Chmod(0o644), tmp.Close()); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", out, ref.Name(), digest)
	return nil
}
