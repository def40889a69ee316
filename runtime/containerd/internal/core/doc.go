// Package core is what every part of a containerd Runner shares: the
// client and its namespace, snapshotter and labels (Host), the set of
// containers a Runner holds live, the removal of containers with their
// tasks, snapshots and left-over shims, the OCI spec of the handler
// sandbox, container ids, and the classification of containerd's errors
// and of a handler's exit.
//
// It holds no policy of its own: one-shot runs, the warm pool and
// dependency builds (the packages beside it) decide when to create and
// remove containers, and the Runner of package runtime/containerd wires
// them together.
package core
