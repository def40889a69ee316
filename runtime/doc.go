// Package runtime runs one attempt of one handler invocation: the value types
// of the relay.Runner contract (Spec, Request, Result, ExitError,
// ErrUnavailable) and the runners that need no container engine.
//
// The handler contract (docs/apps.md "The handler contract") is the same for every
// runner: the handler sees RELAY_HANDLER, RELAY_APP, RELAY_MESSAGE_ID and
// RELAY_ATTEMPT plus the app's env and the request's extra env (Environ), reads
// the event JSON on stdin followed by EOF, and succeeds by exiting 0. Its
// stdout and stderr are forwarded verbatim, each line prefixed
// "[<app>/<handler>] " (LineWriter). A timeout kills it and fails the
// attempt with an *ExitError whose TimedOut is true.
//
// Runners in this package:
//
//   - Func calls Go functions in-process, for library users and engine tests.
//   - Process runs the handler as a local process with no isolation; for
//     development only.
//
// The production runner, on containerd, lives in runtime/containerd so that
// users of Func do not link the containerd client.
//
// Every runner returns nil on success, an error wrapping *ExitError when the
// handler failed (an attempt is used) and any other error for an
// infrastructure failure, wrapping ErrUnavailable when the app cannot run
// right now. All runners are safe for concurrent use.
package runtime
