// Command mkimage builds the small offline test image used by Relay's
// containerd runner tests and examples, without a registry: one layer holding
// a static busybox, a symlink per busybox applet, a minimal /etc (passwd and
// group with nobody, 65534) and empty mount points (/app, /tmp, ...). It
// writes a docker-archive tarball that `ctr images import` and the containerd
// client's Import accept.
//
// Usage:
//
//	go run ./internal/tools/mkimage -o busybox.tar [-ref relay.local/busybox:latest] [-busybox /bin/busybox]
//
// The output is reproducible: file times and the image creation time are
// fixed, so the same busybox binary always gives the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is the fixed timestamp of every file and of the image config.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

func main() {
	var (
		out     = flag.String("o", "", "output archive path (required)")
		ref     = flag.String("ref", "relay.local/busybox:latest", "image reference stored in the archive")
		busybox = flag.String("busybox", "/bin/busybox", "path of a statically linked busybox binary")
	)
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*out, *ref, *busybox); err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
}

func run(out, refStr, busyboxPath string) error {
	ref, err := name.ParseReference(refStr, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("parse -ref: %w", err)
	}
	bin, err := os.ReadFile(busyboxPath)
	if err != nil {
		return err
	}
	applets, err := listApplets(busyboxPath)
	if err != nil {
		return err
	}
	layerTar, err := rootfs(bin, applets)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	})
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = "amd64"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Env = []string{"PATH=/bin"}
	cfg.Config.Cmd = []string{"/bin/sh"}
	cfg.Config.WorkingDir = "/"
	cfg.Config.Labels = map[string]string{"org.opencontainers.image.description": "relay test image: static busybox"}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}

	tmp, err := os.CreateTemp(filepath.Dir(out), ".mkimage-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tarball.Write(ref, img, tmp); err != nil {
		tmp.Close()
		return fmt.Errorf("write archive: %w", err)
	}
	if err := tmp.Chmod(0o644); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), out); err != nil {
		return err
	}
	d, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s %s\n", out, ref.Name(), d)
	return nil
}

// listApplets asks busybox for the applets it was built with.
func listApplets(busybox string) ([]string, error) {
	out, err := exec.Command(busybox, "--list").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --list: %w", busybox, err)
	}
	var applets []string
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			applets = append(applets, a)
		}
	}
	slices.Sort(applets)
	if !slices.Contains(applets, "sh") {
		return nil, fmt.Errorf("%s has no sh applet", busybox)
	}
	return applets, nil
}

// rootfs returns the uncompressed layer tarball.
func rootfs(busybox []byte, applets []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Format = epoch, tar.FormatPAX
		return tw.WriteHeader(h)
	}
	dir := func(name string, mode int64) error {
		return hdr(&tar.Header{Typeflag: tar.TypeDir, Name: name + "/", Mode: mode})
	}
	file := func(name string, mode int64, data []byte) error {
		if err := hdr(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Size: int64(len(data))}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	link := func(name, target string) error {
		return hdr(&tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777})
	}

	steps := []func() error{
		func() error { return dir("bin", 0o755) },
		func() error { return file("bin/busybox", 0o755, busybox) },
		func() error {
			for _, a := range applets {
				if err := link("bin/"+a, "busybox"); err != nil {
					return err
				}
			}
			return nil
		},
		// merged /usr: shebangs like #!/usr/bin/env sh work
		func() error { return link("sbin", "bin") },
		func() error { return dir("usr", 0o755) },
		func() error { return link("usr/bin", "../bin") },
		func() error { return link("usr/sbin", "../bin") },
		func() error { return dir("etc", 0o755) },
		func() error {
			return file("etc/passwd", 0o644, []byte("root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"))
		},
		func() error { return file("etc/group", 0o644, []byte("root:x:0:\nnogroup:x:65534:\n")) },
		func() error { return file("etc/hosts", 0o644, []byte("127.0.0.1\tlocalhost\n::1\tlocalhost\n")) },
		func() error { return file("etc/resolv.conf", 0o644, nil) },
		func() error { return dir("root", 0o700) },
		func() error { return dir("tmp", 0o1777) },
		// mount points, so a read-only rootfs needs no mkdir at start
		func() error { return dir("app", 0o755) },
		func() error { return dir("dev", 0o755) },
		func() error { return dir("proc", 0o555) },
		func() error { return dir("run", 0o755) },
		func() error { return dir("sys", 0o555) },
	}
	for _, s := range steps {
		if err := s(); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
