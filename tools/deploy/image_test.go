package deploy_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/moby/buildkit/frontend/dockerfile/instructions"
	"github.com/moby/buildkit/frontend/dockerfile/parser"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// The relay image as make image builds it (scripts/image.sh,
// docs/deployment.md "Container image"), built once per test binary under
// the reference imageRef, and shared by the tests that need it.
const imageRef = "relay.local/relay:test"

var built struct {
	once            sync.Once
	dir             string
	archive, digest string
	err             error
}

func TestMain(m *testing.M) {
	// The tests read the files of deploy/ by their paths there, and the
	// image script of the checkout at "..".
	if err := os.Chdir(filepath.Join("..", "..", "deploy")); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	if built.dir != "" {
		os.RemoveAll(built.dir)
	}
	os.Exit(code)
}

// requireImageTools skips (fails under RELAY_TEST_REQUIRE=1) when what
// scripts/image.sh needs is missing.
func requireImageTools(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("image build skipped with -short")
	}
	var missing []string
	for _, tool := range []string{"bash", "go", "git"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if _, err := os.Stat("/etc/ssl/certs/ca-certificates.crt"); err != nil {
		missing = append(missing, "ca-certificates (the CA bundle)")
	}
	if len(missing) == 0 {
		return
	}
	msg := fmt.Sprintf("the image build needs %s (scripts/setup.sh installs them)", strings.Join(missing, ", "))
	if os.Getenv("RELAY_TEST_REQUIRE") == "1" {
		t.Fatal(msg)
	}
	t.Skip(msg)
}

// runImageScript runs scripts/image.sh of the checkout at repo and returns
// the archive's path and the digest it printed.
func runImageScript(repo, out string, env ...string) (string, string, error) {
	cmd := exec.Command("bash", filepath.Join(repo, "scripts", "image.sh"), out, imageRef)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("scripts/image.sh: %v\n%s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	f := strings.Fields(lines[len(lines)-1])
	if len(f) != 3 || f[0] != out || f[1] != imageRef || !strings.HasPrefix(f[2], "sha256:") {
		return "", "", fmt.Errorf("scripts/image.sh printed %q, want %q", stdout.String(), out+" "+imageRef+" sha256:...")
	}
	return f[0], f[2], nil
}

// relayImage builds the image once and returns the archive and its digest.
func relayImage(t *testing.T) (archive, digest string) {
	t.Helper()
	requireImageTools(t)
	built.once.Do(func() {
		built.dir, built.err = os.MkdirTemp("", "relay-image-")
		if built.err == nil {
			built.archive, built.digest, built.err = runImageScript("..", filepath.Join(built.dir, "relay.tar"))
		}
	})
	if built.err != nil {
		t.Fatal(built.err)
	}
	return built.archive, built.digest
}

// archiveFiles reads every regular file of a tarball (gzip-compressed
// when gz) into a map by cleaned name, with its header.
func archiveFiles(t *testing.T, r io.Reader, gz bool) (map[string][]byte, map[string]*tar.Header) {
	t.Helper()
	if gz {
		zr, err := gzip.NewReader(r)
		if err != nil {
			t.Fatal(err)
		}
		r = zr
	}
	files, headers := map[string][]byte{}, map[string]*tar.Header{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files, headers
		}
		if err != nil {
			t.Fatal(err)
		}
		name := path.Clean(h.Name)
		headers[name] = h
		if h.Typeflag == tar.TypeReg {
			b, err := io.ReadAll(tr)
			if err != nil {
				t.Fatal(err)
			}
			files[name] = b
		}
	}
}

func sha256Hex(b []byte) string {
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:])
}

// containerfileStage is what the final stage of deploy/Containerfile
// declares: the image's files (path -> source path in the build stage)
// and its config.
type containerfileStage struct {
	base   string
	files  map[string]string
	config ocispec.ImageConfig
}

func readContainerfile(t *testing.T) containerfileStage {
	t.Helper()
	f, err := os.Open("Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	res, err := parser.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	stages, _, err := instructions.Parse(res.AST, nil)
	if err != nil {
		t.Fatal(err)
	}
	last := stages[len(stages)-1]
	st := containerfileStage{base: last.BaseName, files: map[string]string{}}
	for _, c := range last.Commands {
		switch c := c.(type) {
		case *instructions.CopyCommand:
			for _, src := range c.SourcePaths {
				dst := c.DestPath
				if strings.HasSuffix(dst, "/") {
					dst = path.Join(dst, path.Base(src))
				}
				st.files[strings.TrimPrefix(dst, "/")] = src
			}
		case *instructions.EnvCommand:
			for _, kv := range c.Env {
				st.config.Env = append(st.config.Env, kv.Key+"="+kv.Value)
			}
		case *instructions.UserCommand:
			st.config.User = c.User
		case *instructions.ExposeCommand:
			st.config.ExposedPorts = map[string]struct{}{}
			for _, p := range c.Ports {
				st.config.ExposedPorts[p+"/tcp"] = struct{}{}
			}
		case *instructions.EntrypointCommand:
			st.config.Entrypoint = c.CmdLine
		case *instructions.CmdCommand:
			st.config.Cmd = c.CmdLine
		default:
			t.Errorf("Containerfile: %s in the final stage: this test does not know what it adds to the image", c)
		}
	}
	return st
}

// TestImageContent: the archive is an OCI image layout and a
// docker-archive of one image, whose files are exactly what the
// Containerfile's final stage copies (static binaries, a CA bundle that
// parses) and whose config is the stage's.
func TestImageContent(t *testing.T) {
	archivePath, digest := relayImage(t)
	f, err := os.Open(archivePath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	entries, _ := archiveFiles(t, f, false)
	for name, b := range entries {
		if hexDigest, ok := strings.CutPrefix(name, "blobs/sha256/"); ok && sha256Hex(b) != hexDigest {
			t.Errorf("blob %s holds content of digest %s", name, sha256Hex(b))
		}
	}

	// OCI layout: the index names the image and points at its manifest.
	var layout ocispec.ImageLayout
	var index ocispec.Index
	if err := json.Unmarshal(entries["oci-layout"], &layout); err != nil || layout.Version != ocispec.ImageLayoutVersion {
		t.Fatalf("oci-layout %q: %v", entries["oci-layout"], err)
	}
	if err := json.Unmarshal(entries["index.json"], &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json %s: %v", entries["index.json"], err)
	}
	md := index.Manifests[0]
	if md.Digest.String() != digest || md.Annotations["io.containerd.image.name"] != imageRef || md.Annotations[ocispec.AnnotationRefName] != "test" {
		t.Errorf("index.json manifest %+v, want digest %s named %s", md, digest, imageRef)
	}
	var manifest ocispec.Manifest
	if err := json.Unmarshal(entries["blobs/"+strings.Replace(digest, ":", "/", 1)], &manifest); err != nil {
		t.Fatalf("manifest %s: %v", digest, err)
	}

	// docker-archive: manifest.json names the same config and layers, as
	// paths in the tarball, and tags the image.
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	if err := json.Unmarshal(entries["manifest.json"], &docker); err != nil || len(docker) != 1 {
		t.Fatalf("manifest.json %s: %v", entries["manifest.json"], err)
	}
	if want := "blobs/sha256/" + manifest.Config.Digest.Encoded(); docker[0].Config != want || !slices.Equal(docker[0].RepoTags, []string{imageRef}) {
		t.Errorf("manifest.json %+v, want config %s tagged %s", docker[0], want, imageRef)
	}
	var cfg ocispec.Image
	if err := json.Unmarshal(entries["blobs/sha256/"+manifest.Config.Digest.Encoded()], &cfg); err != nil {
		t.Fatal(err)
	}
	if len(docker[0].Layers) != len(manifest.Layers) || len(cfg.RootFS.DiffIDs) != len(manifest.Layers) {
		t.Fatalf("%d layers in manifest.json, %d in the manifest, %d diff ids", len(docker[0].Layers), len(manifest.Layers), len(cfg.RootFS.DiffIDs))
	}

	// The layers hold exactly the Containerfile's files. docker load checks
	// each layer's uncompressed digest against the config's diff ids.
	want := readContainerfile(t)
	if want.base != "scratch" {
		t.Errorf("the final stage is FROM %s, want scratch (nothing but the copied files)", want.base)
	}
	files := map[string][]byte{}
	for i, l := range manifest.Layers {
		if docker[0].Layers[i] != "blobs/sha256/"+l.Digest.Encoded() || l.MediaType != ocispec.MediaTypeImageLayerGzip {
			t.Errorf("layer %d: manifest.json %s, manifest %+v", i, docker[0].Layers[i], l)
		}
		zr, err := gzip.NewReader(bytes.NewReader(entries["blobs/sha256/"+l.Digest.Encoded()]))
		if err != nil {
			t.Fatal(err)
		}
		raw, err := io.ReadAll(zr)
		if err != nil {
			t.Fatal(err)
		}
		if "sha256:"+sha256Hex(raw) != cfg.RootFS.DiffIDs[i].String() {
			t.Errorf("layer %d: uncompressed digest %s, config says %s", i, sha256Hex(raw), cfg.RootFS.DiffIDs[i])
		}
		lf, headers := archiveFiles(t, bytes.NewReader(raw), false)
		for name, h := range headers {
			if h.Uid != 0 || h.Gid != 0 || (h.Typeflag != tar.TypeReg && h.Typeflag != tar.TypeDir) {
				t.Errorf("layer %d: %s owned by %d:%d, type %c: want root's files and directories only", i, name, h.Uid, h.Gid, h.Typeflag)
			}
			if h.Typeflag == tar.TypeReg && h.Mode&0o755 != h.Mode&0o777 {
				t.Errorf("layer %d: %s mode %o is writable by others than root", i, name, h.Mode)
			}
		}
		for name, b := range lf {
			files[name] = b
		}
	}
	for name := range want.files {
		if _, ok := files[name]; !ok {
			t.Errorf("the Containerfile copies /%s, the image lacks it", name)
		}
	}
	for name, b := range files {
		src, ok := want.files[name]
		if !ok {
			t.Errorf("the image holds /%s, which the Containerfile does not copy", name)
			continue
		}
		switch {
		case strings.HasSuffix(src, ".crt"):
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(b) {
				t.Errorf("/%s holds no PEM certificate", name)
			}
		case strings.HasPrefix(src, "/out/"):
			checkStatic(t, name, b)
		}
	}

	// Config: the stage's entrypoint, command, user, port and environment.
	c := cfg.Config
	if !slices.Equal(c.Entrypoint, want.config.Entrypoint) || !slices.Equal(c.Cmd, want.config.Cmd) || c.User != want.config.User ||
		!slices.Equal(c.Env, want.config.Env) || fmt.Sprint(c.ExposedPorts) != fmt.Sprint(want.config.ExposedPorts) {
		t.Errorf("image config %+v, Containerfile says %+v", c, want.config)
	}
	if cfg.OS != "linux" || cfg.Created == nil || cfg.Created.IsZero() {
		t.Errorf("image os %q, created %v", cfg.OS, cfg.Created)
	}
	t.Logf("%s %s: archive %d bytes, %d files, %d layers", imageRef, digest, fileSize(t, archivePath), len(files), len(manifest.Layers))
}

func fileSize(t *testing.T, p string) int64 {
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Size()
}

// checkStatic fails unless b is an ELF executable without an interpreter
// (statically linked, so the image needs no libc).
func checkStatic(t *testing.T, name string, b []byte) {
	t.Helper()
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		t.Errorf("/%s: not an ELF executable: %v", name, err)
		return
	}
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			t.Errorf("/%s is dynamically linked", name)
		}
	}
}

// TestImageReproducible: the same commit gives the same image, byte for
// byte, when built again as on another machine: from a copy of the
// checkout at another path (-trimpath: no path of the build machine in the
// binaries) with an empty Go build cache (every package compiled again),
// SOURCE_DATE_EPOCH and the revision label taken from the commit.
func TestImageReproducible(t *testing.T) {
	archive, digest := relayImage(t)
	git := func(args ...string) string {
		out, err := exec.Command("git", args...).Output()
		if err != nil {
			t.Fatalf("git %s: %v", strings.Join(args, " "), err)
		}
		return strings.TrimSpace(string(out))
	}
	top := git("rev-parse", "--show-toplevel")
	copyRoot := filepath.Join(t.TempDir(), "elsewhere")
	for _, rel := range strings.Split(git("-C", top, "ls-files", "-co", "--exclude-standard", "-z"), "\x00") {
		src, dst := filepath.Join(top, rel), filepath.Join(copyRoot, rel)
		fi, err := os.Lstat(src)
		if err != nil || !(fi.Mode().IsRegular() || fi.Mode()&os.ModeSymlink != 0) {
			continue // deleted in the working tree, or a submodule
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
			t.Fatal(err)
		}
		if fi.Mode().IsRegular() {
			var b []byte
			if b, err = os.ReadFile(src); err == nil {
				err = os.WriteFile(dst, b, fi.Mode().Perm())
			}
		} else {
			var target string
			if target, err = os.Readlink(src); err == nil {
				err = os.Symlink(target, dst)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	again, digest2, err := runImageScript(copyRoot, filepath.Join(t.TempDir(), "relay.tar"),
		"SOURCE_DATE_EPOCH="+git("log", "-1", "--format=%ct"), "IMAGE_REVISION="+git("rev-parse", "HEAD"),
		"GOCACHE="+filepath.Join(t.TempDir(), "gocache"))
	if err != nil {
		t.Fatal(err)
	}
	a, err := os.ReadFile(archive)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(again)
	if err != nil {
		t.Fatal(err)
	}
	if digest2 != digest || !bytes.Equal(a, b) {
		t.Errorf("built again from %s: digest %s, archive of %d bytes; first build %s, %d bytes", copyRoot, digest2, len(b), digest, len(a))
	}
}
