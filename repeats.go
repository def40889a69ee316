package relay

import (
	"context"
	"log/slog"
	"regexp"
	"sync"
	"time"
)

// repeatWindow is how long a failure line repeated by message after
// message is logged at DEBUG after it was logged at its level
// (docs/operations.md#logs).
const repeatWindow = 10 * time.Second

// maxRepeatKeys bounds the lines a repeats remembers; past it, the ones
// whose window has passed are forgotten.
const maxRepeatKeys = 1024

// repeats keeps a failure that hits every message alike (Redis refusing
// writes when out of memory, a read-only replica after a failover) from
// writing a warning or an error per message and per reclaim pass: the
// first line of a message and error is logged at its level, the same line
// again within repeatWindow at DEBUG, and the next one at its level after
// that says how many went to DEBUG in between (repeated). Safe for
// concurrent use; a nil *repeats changes nothing.
type repeats struct {
	mu   sync.Mutex
	seen map[string]*repeat
}

type repeat struct {
	until time.Time // the end of the window of the line last logged at its level
	n     int       // lines logged at DEBUG since
}

func newRepeats() *repeats { return &repeats{seen: map[string]*repeat{}} }

// level returns the level to log the line msg with error text errText at,
// given its own level, and how many of its repeats were logged at DEBUG
// since it was last logged at that level. Lines below WARN are left alone.
func (r *repeats) level(level slog.Level, msg, errText string, now time.Time) (slog.Level, int) {
	if r == nil || level < slog.LevelWarn {
		return level, 0
	}
	key := msg + "\x00" + errText
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.seen[key]
	if p != nil && now.Before(p.until) {
		p.n++
		return slog.LevelDebug, 0
	}
	n := 0
	if p != nil {
		n = p.n
	} else if len(r.seen) >= maxRepeatKeys {
		for k, q := range r.seen {
			if !now.Before(q.until) {
				delete(r.seen, k)
			}
		}
	}
	r.seen[key] = &repeat{until: now.Add(repeatWindow)}
	return level, n
}

// ids matches what makes the text of one cause differ from failure to
// failure: generated ids (a container's 16 hex digits, digests), stream
// entry ids and other long numbers (a temporary file's suffix).
var ids = regexp.MustCompile(`[0-9a-f]{16,}|[0-9]{10,}(-[0-9]+)?`)

// cause is the text that tells one failure's cause from another's for
// repeats: err's text without the ids that differ per attempt, so that a
// full disk or an unreachable daemon reads alike whichever container or
// message met it (docs/operations.md#logs).
func cause(err error) string { return ids.ReplaceAllLiteralString(err.Error(), "…") }

// repeatedAttr is the attribute that counts the repeats logged at DEBUG
// before a line, if any.
func repeatedAttr(attrs []slog.Attr, n int) []slog.Attr {
	if n == 0 {
		return attrs
	}
	return append(attrs, slog.Int("repeated", n))
}

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
