package worker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"syscall"
	"time"

	"github.com/redis/rueidis"
)

// Start-up wait (docs/operations.md#starting-before-redis): tries of a
// Redis that does not answer yet are spaced from startupFirstTry,
// doubling up to startupMaxTry, and logged once per startupLogEvery.
// A try ends after startupTryTimeout: the client retries a command
// while it reconnects, and stops with the connection's own error when the
// deadline comes.
const (
	startupFirstTry   = 100 * time.Millisecond
	startupMaxTry     = 2 * time.Second
	startupLogEvery   = 10 * time.Second
	startupTryTimeout = 2 * time.Second
)

// ErrRedisUnreachable is wrapped by the error of Connect and Worker.Run
// when Redis did not answer within the start-up wait.
var ErrRedisUnreachable = errors.New("worker: Redis did not answer")

// Connect makes a Redis client with connect, retrying while Redis cannot
// be reached (connection refused, reset or timed out, a name that does not
// resolve yet, a server still loading its data) until wait has passed or
// ctx ends, so that a service started before its Redis waits for it
// rather than crash-looping (docs/embedding.md#starting-before-redis).
// rueidis.NewClient dials at once, so this is how a service makes the
// client it gives Config.Redis. The tries are spaced from 100 ms, doubling
// up to 2 s; log gets one WARN line when Redis first does not answer and
// one per 10 s after that, not one per try, and an INFO line when it
// answers. Any other error of connect (refused credentials, bad options)
// is returned at once, and so is the first error with a wait <= 0. After
// the wait the error wraps ErrRedisUnreachable and the last error.
func Connect(ctx context.Context, connect func(context.Context) (rueidis.Client, error), wait time.Duration, log *slog.Logger) (rueidis.Client, error) {
	var c rueidis.Client
	err := waitForRedis(ctx, wait, log, func(ctx context.Context) error {
		var err error
		c, err = connect(ctx)
		return err
	})
	return c, err
}

// waitForRedis calls try until it returns nil or an error that is not
// Redis being unreachable, or wait has passed, spacing and logging the
// tries as Connect says.
func waitForRedis(ctx context.Context, wait time.Duration, log *slog.Logger, try func(context.Context) error) error {
	if log == nil {
		log = slog.Default()
	}
	start := time.Now()
	deadline := start.Add(wait)
	delay := startupFirstTry
	var logged time.Time
	for tries := 1; ; tries++ {
		tctx, cancel := context.WithTimeout(ctx, startupTryTimeout)
		err := try(tctx)
		cancel()
		if err == nil {
			if tries > 1 {
				log.LogAttrs(ctx, slog.LevelInfo, "Redis answers; starting", slog.Int("tries", tries), slog.Duration("waited", time.Since(start).Round(time.Millisecond)))
			}
			return nil
		}
		if !unreachable(err) || wait <= 0 || ctx.Err() != nil {
			return err
		}
		now := time.Now()
		if !now.Before(deadline) {
			return fmt.Errorf("%w within the start-up wait of %s (%d tries): %w", ErrRedisUnreachable, wait, tries, err)
		}
		if logged.IsZero() || now.Sub(logged) >= startupLogEvery {
			logged = now
			log.LogAttrs(ctx, slog.LevelWarn, "Redis does not answer yet; waiting for it", slog.Int("tries", tries),
				slog.Duration("waited", now.Sub(start).Round(time.Millisecond)), slog.Duration("wait", wait), slog.Any("error", err))
		}
		t := time.NewTimer(min(delay, deadline.Sub(now)))
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: stopped while waiting (%d tries): %w", ErrRedisUnreachable, tries, err)
		case <-t.C:
		}
		delay = min(2*delay, startupMaxTry)
	}
}

// unreachable reports whether err says that Redis cannot be reached now
// but may be soon: a connection refused, reset, timed out or cut, a host
// name that does not resolve yet (a Kubernetes Service starting), a try
// that got no answer in time (a server paused), or a server loading its
// data set or without its master.
func unreachable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var ne net.Error
	var dns *net.DNSError
	if re, ok := rueidis.IsRedisErr(err); ok {
		return re.IsLoading() || re.IsTryAgain() || re.IsClusterDown()
	}
	return errors.As(err, &ne) || errors.As(err, &dns) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// waitForRedis waits for w's Redis client to answer a PING, for at most
// Config.StartupWait; without one, the first PING that gets no answer
// fails Run at once.
func (w *Worker) waitForRedis(ctx context.Context) error {
	err := waitForRedis(ctx, w.cfg.StartupWait, w.log, func(ctx context.Context) error {
		return w.cfg.Redis.Do(ctx, w.cfg.Redis.B().Ping().Build()).Error()
	})
	if err != nil && !errors.Is(err, ErrRedisUnreachable) && unreachable(err) {
		return fmt.Errorf("%w (Config.StartupWait is 0: no wait): %w", ErrRedisUnreachable, err)
	}
	if err != nil {
		return fmt.Errorf("worker: %w", err)
	}
	return nil
}
