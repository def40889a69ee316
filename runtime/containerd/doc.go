// Package containerd runs Relay handler invocations in containerd, one
// one-shot container per attempt (docs/apps.md "The handler contract",
// docs/runtimes.md). It is the production relay.Runner.
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
// what a crashed process of the same host id left behind (label relay.host),
// and what one of another host id left once its presence label on the
// namespace went stale (LabelPresencePrefix, WithOrphanTimeout).
//
// Handlers run as uid 65534, so the app directory and its files must be
// readable by others (mode o+rx on directories, o+r on files).
//
// Apps with `runtime: python3` or `runtime: node` run the bootstrap that
// package runtime embeds: the Runner writes it once to its state directory
// (WithStateDir), named by content hash, bind-mounts it read-only at
// /relay/bootstrap.py or /relay/bootstrap.cjs and runs it with the image's
// python3 or node. Their image defaults to DefaultPython3Image or
// DefaultNodeImage (WithDefaultImages); `image:` in the template overrides
// it. docs/runtimes.md describes the bootstraps and how to build an image.
//
// Apps with `warm: true` (runtime.Spec.Warm) run in long-lived containers
// of the same sandbox instead, one invocation at a time each, the bootstrap
// serving requests in a loop: see Runner.Run, the WithWarm options and
// Close, and docs/runtimes.md "Warm containers".
//
// An app with a dependency manifest (runtime.Spec.Deps) runs in a
// dependency image: the runtime image plus one layer that a build container
// filled with pip or npm, captured with the diff service and cached by the
// hash of the manifest and the runtime image (Runner.Prepare,
// WithMaxConcurrentBuilds, WithBuildEnv, WithBuildCAFile; docs/runtimes.md
// "Dependencies"). The secrets an app names (runtime.Spec.Secrets) are
// copied from WithSecretsDir for each invocation and mounted read-only at
// /run/secrets (docs/apps.md "Secrets").
//
// An image that is not in the namespace is pulled from its registry,
// anonymously, once for all concurrent callers, with its progress logged
// (WithPull, WithPullTimeout): by Runner.Prepare, which a worker.Worker
// calls before a version of an app serves, or else by the first Run that
// needs it (docs/runtimes.md "Images"). A failed pull is an error wrapping
// runtime.ErrUnavailable that names the image and says how to provide it,
// and it is not tried again for the retry interval (WithPullRetryInterval).
// The log reports the failure once, at WARN; the retries while it lasts,
// and what containerd's client logs about them, are at DEBUG, and an INFO
// line ("image ready") says when the image is present at last
// (docs/runtimes.md "Images").
//
// The package takes a ready containerd client and never closes it. A Runner
// is safe for concurrent use.
package containerd
