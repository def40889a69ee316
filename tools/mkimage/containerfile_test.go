package main

import (
	"archive/tar"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// writeContainerfile writes src as a Containerfile and a build stage
// holding /out/app (mode 0700) and returns the options to build it.
func writeContainerfile(t *testing.T, src string) buildOptions {
	t.Helper()
	dir := t.TempDir()
	stage := filepath.Join(dir, "stage")
	if err := os.MkdirAll(filepath.Join(stage, "out"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(stage, "out", "app"), []byte("binary"), 0o700); err != nil {
		t.Fatal(err)
	}
	cf := filepath.Join(dir, "Containerfile")
	if err := os.WriteFile(cf, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return buildOptions{out: filepath.Join(dir, "image.tar"), ref: "relay.local/app:1", containerfile: cf, stages: map[string]string{"build": stage}}
}

// TestContainerfileRefuses: what mkimage cannot build the way Docker
// would is an error naming the instruction, not a different image.
func TestContainerfileRefuses(t *testing.T) {
	for name, tc := range map[string]struct{ src, want string }{
		"base image":    {"FROM debian:bookworm\nCOPY --from=build /out/app /app\n", "FROM scratch only"},
		"RUN":           {"FROM scratch\nRUN true\n", "RUN true"},
		"build context": {"FROM scratch\nCOPY app /app\n", "COPY --from=<stage>"},
		"unknown stage": {"FROM scratch\nCOPY --from=other /out/app /app\n", "no -stage other=DIR"},
		"missing file":  {"FROM scratch\nCOPY --from=build /out/none /app\n", "no such file"},
		"shell form":    {"FROM scratch\nENTRYPOINT /app\n", "exec form"},
		"named owner":   {"FROM scratch\nCOPY --from=build --chown=app /out/app /app\n", "numeric uid"},
	} {
		err := runContainerfile(writeContainerfile(t, tc.src))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one containing %q", name, err, tc.want)
		}
	}
}

// TestContainerfileBuilds: COPY --from with --chmod and --chown into a
// directory, ENV, USER, EXPOSE and ENTRYPOINT land in the image as Docker
// puts them, and the archive is an OCI layout with the time given by
// SOURCE_DATE_EPOCH.
func TestContainerfileBuilds(t *testing.T) {
	t.Setenv("SOURCE_DATE_EPOCH", "1700000000")
	o := writeContainerfile(t, "FROM scratch\nCOPY --from=build --chmod=0755 --chown=10:20 /out/app /usr/bin/\nENV A=1 B=2\nUSER 10:20\nEXPOSE 8080\nENTRYPOINT [\"/usr/bin/app\"]\n")
	if err := runContainerfile(o); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	f, err := os.Open(o.out)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err != nil {
			break
		}
		p := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatalf("not an OCI layout: %v", err)
	}
	m, err := idx.IndexManifest()
	if err != nil || len(m.Manifests) != 1 {
		t.Fatalf("index %+v: %v", m, err)
	}
	img, err := idx.Image(m.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Config
	if strings.Join(c.Env, " ") != "A=1 B=2" || c.User != "10:20" || len(c.ExposedPorts) != 1 || c.Entrypoint[0] != "/usr/bin/app" || cfg.Created.Unix() != 1700000000 {
		t.Errorf("config %+v, created %v", c, cfg.Created)
	}
	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers: %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var got []string
	lr := tar.NewReader(rc)
	for {
		h, err := lr.Next()
		if err != nil {
			break
		}
		got = append(got, fmt.Sprintf("%s %o %d:%d %d", h.Name, h.Mode, h.Uid, h.Gid, h.ModTime.Unix()))
	}
	want := []string{"usr/ 755 0:0 1700000000", "usr/bin/ 755 0:0 1700000000", "usr/bin/app 755 10:20 1700000000"}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("layer:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}
