// Command mkimage builds Relay's offline images without a registry, as a
// tarball that `ctr images import`, the containerd client's Import and
// `docker load` accept. It has three modes.
//
// It belongs to the repository's tools module (tools/go.mod), whose
// dependencies the library does not carry, so from the repository root it
// runs with `go -C tools`; relative paths are then relative to tools/.
//
// By default it builds the small test image of the containerd runner tests
// and examples: one layer holding a static busybox, a symlink per busybox
// applet, a minimal /etc (passwd and group with nobody, 65534) and empty
// mount points (/app, /tmp, ...):
//
//	go -C tools run ./mkimage -o "$PWD/busybox.tar" [-ref relay.local/busybox:latest] [-busybox /bin/busybox]
//
// With -rootfs it packs a prepared root filesystem, such as a debootstrap
// tree (scripts/runtime-images.sh), into a one-layer image; the contents of
// dev, proc and sys and any device node, FIFO or socket are left out, since
// the container runtime provides them:
//
//	go -C tools run ./mkimage -o "$PWD/python3.tar" -ref relay.local/python3:bookworm \
//		-rootfs /tmp/rootfs -env LANG=C.UTF-8 -cmd '["python3"]'
//
// With -containerfile it builds the final stage of a Containerfile, which
// must be FROM scratch and copy files from an earlier stage, whose output
// -stage NAME=DIR names on disk (make image, scripts/image.sh: the relay
// image of deploy/Containerfile). This mode writes an OCI image layout
// that is also a docker-archive, and honours SOURCE_DATE_EPOCH:
//
//	go -C tools run ./mkimage -o "$PWD/relay.tar" -ref relay.local/relay:dev \
//		-containerfile "$PWD/deploy/Containerfile" -stage build=/tmp/stage [-label KEY=VALUE]
//
// The first two modes write a docker-archive.
//
// The output is reproducible: file times and the image creation time are
// fixed, so the same input always gives the same image digest.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// epoch is the fixed timestamp of every file and of the image config.
var epoch = time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)

// defaultRootfsPath is the PATH of -rootfs images when -env sets none.
const defaultRootfsPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// listFlag collects a repeatable flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var (
		out                 = flag.String("o", "", "output archive path (required)")
		ref                 = flag.String("ref", "relay.local/busybox:latest", "image reference stored in the archive")
		busybox             = flag.String("busybox", "/bin/busybox", "path of a statically linked busybox binary")
		rootfsDir           = flag.String("rootfs", "", "pack this root filesystem directory instead of building the busybox image")
		cmdJSON             = flag.String("cmd", "", `image command as a JSON array, e.g. '["python3"]' (-rootfs only)`)
		description         = flag.String("description", "", "org.opencontainers.image.description label (-rootfs only)")
		containerfile       = flag.String("containerfile", "", "build the final stage of this Containerfile (FROM scratch, COPY --from=<stage>)")
		env, stages, labels listFlag
	)
	flag.Var(&env, "env", "NAME=VALUE in the image config, repeatable (-rootfs only; default PATH is the Debian one)")
	flag.Var(&stages, "stage", "NAME=DIR: the filesystem of stage NAME for COPY --from=NAME, repeatable (-containerfile only)")
	flag.Var(&labels, "label", "KEY=VALUE label added to the Containerfile's, repeatable (-containerfile only)")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	var err error
	switch {
	case *containerfile != "":
		o := buildOptions{out: *out, ref: *ref, containerfile: *containerfile, stages: map[string]string{}, labels: labels}
		for _, s := range stages {
			k, v, ok := strings.Cut(s, "=")
			if !ok || k == "" || v == "" {
				fmt.Fprintf(os.Stderr, "mkimage: -stage %q: want NAME=DIR\n", s)
				os.Exit(2)
			}
			o.stages[k] = v
		}
		err = runContainerfile(o)
	case *rootfsDir != "":
		err = runRootfs(*out, *ref, *rootfsDir, env, *cmdJSON, *description)
	default:
		err = run(*out, *ref, *busybox)
	}
	if err != nil {
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
	return writeImage(out, ref, layer, []string{"PATH=/bin"}, []string{"/bin/sh"}, "relay test image: static busybox")
}

// writeImage builds a linux/amd64 image of the single layer with a fixed
// creation time, env, cmd, working directory / and, when description is
// set, an image description label, and writes it with writeArchive.
func writeImage(out string, ref name.Reference, layer v1.Layer, env, cmd []string, description string) error {
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
	cfg.Config.Env = env
	cfg.Config.Cmd = cmd
	cfg.Config.WorkingDir = "/"
	if description != "" {
		cfg.Config.Labels = map[string]string{"org.opencontainers.image.description": description}
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return err
	}
	return writeArchive(out, ref, img)
}

// writeArchive writes img as a docker-archive tarball to out, atomically,
// and prints the path, reference and digest.
func writeArchive(out string, ref name.Reference, img v1.Image) error {
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

// runRootfs packs the directory dir into a one-layer image.
func runRootfs(out, refStr, dir string, env []string, cmdJSON, description string) error {
	ref, err := name.ParseReference(refStr, name.WeakValidation)
	if err != nil {
		return fmt.Errorf("parse -ref: %w", err)
	}
	var cmd []string
	if cmdJSON != "" {
		if err := json.Unmarshal([]byte(cmdJSON), &cmd); err != nil {
			return fmt.Errorf("parse -cmd (want a JSON array of strings): %w", err)
		}
	}
	for _, e := range env {
		if k, _, ok := strings.Cut(e, "="); !ok || k == "" {
			return fmt.Errorf("-env %q: want NAME=VALUE", e)
		}
	}
	if !slices.ContainsFunc(env, func(e string) bool { return strings.HasPrefix(e, "PATH=") }) {
		env = append([]string{defaultRootfsPath}, env...)
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("-rootfs %s is not a directory", dir)
	}

	// The layer goes through a gzip file on disk: a Debian tree is a few
	// hundred MB, and compressing it once here spares go-containerregistry
	// from compressing it again for each digest it computes.
	gz, err := os.CreateTemp(filepath.Dir(out), ".mkimage-layer-*")
	if err != nil {
		return err
	}
	defer os.Remove(gz.Name())
	skipped, err := packTree(gz, dir)
	if cerr := gz.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pack %s: %w", dir, err)
	}
	if skipped > 0 {
		fmt.Fprintf(os.Stderr, "mkimage: left out %d device nodes, FIFOs or sockets\n", skipped)
	}
	layer, err := tarball.LayerFromFile(gz.Name())
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}
	return writeImage(out, ref, layer, env, cmd, description)
}

// virtualDirs are provided by the container runtime; only the empty
// directories go into the layer, as mount points.
var virtualDirs = []string{"dev", "proc", "sys"}

// packTree writes dir as a gzip-compressed tar layer to w, in lexical
// order with fixed times, numeric owners and hard links kept. It returns
// how many special files (devices, FIFOs, sockets) it left out.
func packTree(w io.Writer, dir string) (skipped int, err error) {
	zw, err := gzip.NewWriterLevel(w, gzip.DefaultCompression)
	if err != nil {
		return 0, err
	}
	tw := tar.NewWriter(zw)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		if top, rest, _ := strings.Cut(rel, "/"); rest != "" && slices.Contains(virtualDirs, top) {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat data", path)
		}
		h := &tar.Header{
			Name:    rel,
			Mode:    int64(fi.Mode().Perm()),
			Uid:     int(st.Uid),
			Gid:     int(st.Gid),
			ModTime: epoch,
			Format:  tar.FormatPAX,
		}
		if fi.Mode()&fs.ModeSetuid != 0 {
			h.Mode |= 0o4000
		}
		if fi.Mode()&fs.ModeSetgid != 0 {
			h.Mode |= 0o2000
		}
		if fi.Mode()&fs.ModeSticky != 0 {
			h.Mode |= 0o1000
		}
		switch {
		case fi.Mode().IsDir():
			h.Typeflag, h.Name = tar.TypeDir, rel+"/"
			return tw.WriteHeader(h)
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			h.Typeflag, h.Linkname = tar.TypeSymlink, target
			return tw.WriteHeader(h)
		case fi.Mode().IsRegular():
			if st.Nlink > 1 {
				key := inode{uint64(st.Dev), st.Ino}
				if first, ok := links[key]; ok {
					h.Typeflag, h.Linkname = tar.TypeLink, first
					return tw.WriteHeader(h)
				}
				links[key] = rel
			}
			h.Typeflag, h.Size = tar.TypeReg, fi.Size()
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			n, err := io.Copy(tw, f)
			if err == nil && n != fi.Size() {
				err = fmt.Errorf("%s changed size while being packed", path)
			}
			return err
		default:
			skipped++
			return nil
		}
	})
	if err != nil {
		return skipped, err
	}
	return skipped, errors.Join(tw.Close(), zw.Close())
}
