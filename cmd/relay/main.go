// Command relay is the reference worker and operator CLI of Relay
// (docs/operations.md#commands). It only parses flags and wires the
// library.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	// A closed stdout or stderr (a log shipper restarting, `| head`) must
	// not kill a worker mid-handler: writes then fail with EPIPE instead.
	signal.Ignore(syscall.SIGPIPE)
	// relay start handles SIGHUP itself (it reloads the apps); until then,
	// and for the other commands, a hangup must not kill a handler's run.
	signal.Ignore(syscall.SIGHUP)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
