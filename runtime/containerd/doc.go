// Package containerd runs Relay handler invocations in containerd, one
// one-shot container per attempt (DESIGN.md "Handler contract", containerd
// runner). It is the production relay.Runner.
//
// Each Run creates a container from the app's image (or the default image of
// its language runtime) with the app directory bind-mounted read-only at
// /app as working directory, uid/gid 65534, a read-only root filesystem, a
// tmpfs /tmp, no capabilities, no new privileges, the default seccomp
// profile, memory/CPU/pids limits and an empty network namespace unless the
// app asks for the host network. The event goes to stdin followed by EOF;
// stdout and stderr are forwarded line by line with the "[<app>/<handler>] "
// prefix. The container, its task and its snapshot are always removed
// afterwards, under a context detached from the caller's, and Sweep removes
// what a crashed process of the same host left behind (label relay.host).
//
// Handlers run as uid 65534, so the app directory and its files must be
// readable by others (mode o+rx on directories, o+r on files).
//
// The package takes a ready containerd client and never closes it. It does
// not pull images (no registry is assumed): a missing image is an error
// wrapping runtime.ErrUnavailable that tells the operator how to import it.
// A Runner is safe for concurrent use.
package containerd
