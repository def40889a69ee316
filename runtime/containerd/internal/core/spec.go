package core

import (
	"context"
	"strconv"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/containerd/containerd/v2/core/containers"
	"github.com/containerd/containerd/v2/pkg/oci"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/relaydev/relay/runtime"
)

// cpuPeriod is the CFS period (µs) against which Spec.CPUs sets the quota.
const cpuPeriod = 100_000

// minCPUQuota is the smallest CFS quota (µs) the kernel accepts.
const minCPUQuota = 1000

// Limits of a container whose Spec leaves them at 0, and the user it runs
// as (docs/apps.md "template.yaml"; the public names are in package
// runtime/containerd).
const (
	DefaultMemoryBytes = 128 << 20
	DefaultCPUs        = 1.0
	DefaultPIDs        = 128
	// DefaultTmpBytes is the size of the tmpfs at /tmp, capped at half
	// the memory limit (its files count against it).
	DefaultTmpBytes = 64 << 20
	// HandlerUID and HandlerGID are the ids handlers run as (nobody/nogroup).
	HandlerUID = 65534
	HandlerGID = 65534
)

// DefaultPath is used when the image config sets no PATH.
const DefaultPath = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// SpecOpts builds the OCI runtime spec of one invocation's container on top
// of containerd's default Linux spec (own PID, IPC, UTS, mount and network
// namespaces; masked /proc paths). appDir is absolute; argv nil runs the
// image's entrypoint and cmd; extra are further mounts (the bootstrap).
func SpecOpts(req runtime.Request, img ocispec.Image, appDir string, argv []string, extra []specs.Mount) []oci.SpecOpts {
	s := req.Spec
	mem := memoryLimit(s)
	cpus := s.CPUs
	if cpus <= 0 {
		cpus = DefaultCPUs
	}
	pids := s.PIDs
	if pids <= 0 {
		pids = DefaultPIDs
	}
	if len(argv) == 0 {
		argv = append(append([]string(nil), img.Config.Entrypoint...), img.Config.Cmd...)
	}
	imageEnv := img.Config.Env
	if len(imageEnv) == 0 {
		imageEnv = []string{DefaultPath}
	}

	opts := []oci.SpecOpts{
		oci.WithProcessArgs(argv...),
		oci.WithProcessCwd("/app"),
		oci.WithEnv(imageEnv),
		oci.WithEnv(runtime.Environ(req)), // overrides the image's values
		oci.WithHostname(sanitizeID(req.App)),
		oci.WithUIDGID(HandlerUID, HandlerGID),
		oci.WithRootFSReadonly(),
		oci.WithNoNewPrivileges,
		oci.WithCapabilities(nil),
		WithNoAmbientCapabilities,
		seccomp.WithDefaultProfile(), // after the capabilities, which it reads
		oci.WithMounts(append([]specs.Mount{
			{
				Destination: "/app",
				Type:        "bind",
				Source:      appDir,
				Options:     []string{"rbind", "ro", "nosuid", "nodev"},
			},
			{
				// tmpfs pages are charged to the container's memory cgroup:
				// the size, below the memory limit, makes a full /tmp an
				// ENOSPC for the handler's write rather than an OOM kill.
				// runc gives the mount the mode of the image's /tmp
				// directory (0755 in some images), whatever mode= says:
				// owned by the handler user, it stays writable for it.
				Destination: "/tmp",
				Type:        "tmpfs",
				Source:      "tmpfs",
				Options: []string{"nosuid", "nodev", "mode=1777", "size=" + strconv.FormatInt(tmpSize(s, mem), 10),
					"uid=" + strconv.Itoa(HandlerUID), "gid=" + strconv.Itoa(HandlerGID)},
			},
		}, extra...)),
		oci.WithMemoryLimit(uint64(mem)),
		oci.WithCPUCFS(max(int64(cpus*cpuPeriod), minCPUQuota), cpuPeriod),
		oci.WithPidsLimit(pids),
	}
	if s.Network == "host" {
		opts = append(opts,
			oci.WithHostNamespace(specs.NetworkNamespace),
			oci.WithHostResolvconf,
			oci.WithHostHostsFile,
		)
	}
	return opts
}

// memoryLimit returns spec's memory limit in bytes.
func memoryLimit(spec runtime.Spec) int64 {
	if spec.MemoryBytes > 0 {
		return spec.MemoryBytes
	}
	return DefaultMemoryBytes
}

// TmpBytes returns the size in bytes of the tmpfs at /tmp of spec's
// containers: resources.tmp, or DefaultTmpBytes but at most half the
// memory limit (docs/apps.md#templateyaml).
func TmpBytes(spec runtime.Spec) int64 { return tmpSize(spec, memoryLimit(spec)) }

// tmpSize returns the size of spec's /tmp in bytes: Spec.TmpBytes, or
// DefaultTmpBytes but at most half of mem, and never more than mem.
func tmpSize(spec runtime.Spec, mem int64) int64 {
	if spec.TmpBytes > 0 {
		return min(spec.TmpBytes, mem)
	}
	return min(DefaultTmpBytes, mem/2)
}

// WithNoAmbientCapabilities clears the ambient and inheritable
// capabilities that containerd's default spec leaves, so that an
// unprivileged process cannot gain any by executing another.
func WithNoAmbientCapabilities(_ context.Context, _ oci.Client, _ *containers.Container, s *oci.Spec) error {
	if s.Process != nil && s.Process.Capabilities != nil {
		s.Process.Capabilities.Ambient = nil
		s.Process.Capabilities.Inheritable = nil
	}
	return nil
}
