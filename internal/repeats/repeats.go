// Package repeats keeps a failure that hits message after message alike
// (Redis refusing writes when out of memory, a full disk under containerd)
// from writing a warning or an error per message (docs/operations.md#logs):
// Log decides the level of each line, Cause tells one failure's cause from
// another's. Safe for concurrent use.
package repeats

import (
	"errors"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Window is how long a failure line repeated by message after message is
// logged at DEBUG after it was logged at its level.
const Window = 10 * time.Second

// MaxKeys bounds the lines a Log remembers; past it, the ones whose
// window has passed are forgotten.
const MaxKeys = 1024

// Log remembers the failure lines logged at their level: the first line of
// a message and cause is logged at its level, the same line again within
// Window at DEBUG, and the next one at its level after that says how many
// went to DEBUG in between. A nil *Log changes nothing.
type Log struct {
	mu   sync.Mutex
	seen map[string]*repeat
}

type repeat struct {
	until time.Time // the end of the window of the line last logged at its level
	n     int       // lines logged at DEBUG since
}

// New returns an empty Log.
func New() *Log { return &Log{seen: map[string]*repeat{}} }

// Level returns the level to log the line msg with cause (Cause of its
// error) at, given its own level, and how many of its repeats were logged
// at DEBUG since it was last logged at that level. Lines below WARN are
// left alone.
func (r *Log) Level(level slog.Level, msg, cause string, now time.Time) (slog.Level, int) {
	if r == nil || level < slog.LevelWarn {
		return level, 0
	}
	key := msg + "\x00" + cause
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
	} else if len(r.seen) >= MaxKeys {
		for k, q := range r.seen {
			if !now.Before(q.until) {
				delete(r.seen, k)
			}
		}
	}
	r.seen[key] = &repeat{until: now.Add(Window)}
	return level, n
}

// Len returns how many lines r remembers.
func (r *Log) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// Attr appends the attribute that counts the n repeats logged at DEBUG
// before a line, if any.
func Attr(attrs []slog.Attr, n int) []slog.Attr {
	if n == 0 {
		return attrs
	}
	return append(attrs, slog.Int("repeated", n))
}

// exhausted are the errors of a full or read-only filesystem and of
// exhausted file descriptors: every operation that meets one fails alike,
// whichever file it names (a container's snapshot, a temporary directory
// containerd or runc just made), so the errno is the whole cause.
var exhausted = []syscall.Errno{syscall.ENOSPC, syscall.EDQUOT, syscall.EROFS, syscall.EMFILE, syscall.ENFILE}

// ids matches what makes the text of one cause differ from failure to
// failure: generated ids (a container's 16 hex digits, digests), stream
// entry ids and other long numbers.
var ids = regexp.MustCompile(`[0-9a-f]{16,}|[0-9]{10,}(-[0-9]+)?`)

// paths matches a file path; digitRuns, the numbers in one, which name
// temporary files and directories (os.MkdirTemp's suffix is a random
// number of up to 10 digits), snapshots and other generated entries.
var (
	paths     = regexp.MustCompile(`/[^\s:"'()\[\]{},;]*`)
	digitRuns = regexp.MustCompile(`[0-9]+`)
)

// Cause is the text that tells one failure's cause from another's: the
// errno's text alone for a full or read-only filesystem or exhausted file
// descriptors, whether err wraps the errno or only says it (an error that
// came through containerd's API is text), else err's text without the ids
// and path numbers that differ per attempt, so that an unreachable daemon
// reads alike whichever container or message met it.
func Cause(err error) string {
	text := err.Error()
	for _, e := range exhausted {
		if errors.Is(err, e) || strings.Contains(text, e.Error()) {
			return e.Error()
		}
	}
	text = paths.ReplaceAllStringFunc(text, func(p string) string { return digitRuns.ReplaceAllLiteralString(p, "…") })
	return ids.ReplaceAllLiteralString(text, "…")
}
