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
	// SIGHUP too: a worker started by hand must not die with its terminal.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
