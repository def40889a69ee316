package relay

import (
	"context"
	"log/slog"
	"time"

	irepeats "github.com/relaydev/relay/internal/repeats"
)

// repeatWindow is how long a failure line repeated by message after
// message is logged at DEBUG after it was logged at its level
// (docs/operations.md#logs).
const repeatWindow = irepeats.Window

// repeats keeps a failure that hits every message alike (Redis refusing
// writes when out of memory, a read-only replica after a failover) from
// writing a warning or an error per message and per reclaim pass: the
// first line of a message and error is logged at its level, the same line
// again within repeatWindow at DEBUG, and the next one at its level after
// that says how many went to DEBUG in between (repeated). Package
// internal/repeats holds the logic, which the containerd runner shares.
// Safe for concurrent use; a nil *repeats changes nothing.
type repeats struct{ log *irepeats.Log }

func newRepeats() *repeats { return &repeats{irepeats.New()} }

// level returns the level to log the line msg with error text errText at,
// given its own level, and how many of its repeats were logged at DEBUG
// since it was last logged at that level. Lines below WARN are left alone.
func (r *repeats) level(level slog.Level, msg, errText string, now time.Time) (slog.Level, int) {
	if r == nil {
		return level, 0
	}
	return r.log.Level(level, msg, errText, now)
}

// cause is the text that tells one failure's cause from another's for
// repeats (irepeats.Cause): a full disk or an unreachable daemon reads
// alike whichever container, temporary directory or message met it
// (docs/operations.md#logs).
func cause(err error) string { return irepeats.Cause(err) }

// repeatedAttr is the attribute that counts the repeats logged at DEBUG
// before a line, if any.
func repeatedAttr(attrs []slog.Attr, n int) []slog.Attr { return irepeats.Attr(attrs, n) }

// loopLog writes the failure lines of a background loop (the read and the
// reclaim loops): at ERROR once per repeatWindow for the same error, at
// DEBUG in between, the next ERROR line counting those, and a line when
// the loop works again (docs/operations.md#logs). Safe for concurrent use.
type loopLog struct {
	log     *slog.Logger
	repeats *repeats
}

// failed logs the fails-th failure in a row, err.
func (l *loopLog) failed(ctx context.Context, msg string, fails int, err error) {
	level, n := l.repeats.level(slog.LevelError, msg, cause(err), time.Now())
	l.log.LogAttrs(ctx, level, msg, repeatedAttr([]slog.Attr{slog.Int("failures", fails), slog.Any("error", err)}, n)...)
}

// recovered says that the loop works again after fails failures in a row,
// so an outage's end is in the log as well as its start.
func (l *loopLog) recovered(ctx context.Context, msg string, fails int) {
	if fails > 0 {
		l.log.LogAttrs(ctx, slog.LevelInfo, msg, slog.Int("failures", fails))
	}
}
