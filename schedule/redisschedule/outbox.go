package redisschedule

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/relaydev/relay/schedule"
)

// OutboxDir is the directory under the state directory that holds the
// outbox (WithStateDir).
const OutboxDir = "schedule-outbox"

const (
	outboxExt   = ".json"
	corruptExt  = ".corrupt"
	tempPrefix  = ".tmp-"
	tempMaxAge  = time.Hour // a temporary file this old is a leftover of a crash
	outboxPerms = 0o700
)

// outbox keeps occurrences whose publish failed until they are published.
// With a directory, each occurrence is one file holding its envelope JSON,
// named after the occurrence so that storing it twice overwrites. Without
// one, it is a map that lives as long as the Scheduler.
//
// Several Schedulers may share a directory (an old and a new one while the
// engine swaps them): a record published twice is a duplicate the second
// time, and a record already removed is not an error.
type outbox struct {
	dir string // "" keeps records in mem

	mu  sync.Mutex
	mem map[string]schedule.Envelope
}

// record is one stored occurrence.
type record struct {
	name string // file name (or map key)
	env  schedule.Envelope
	at   time.Time
}

func newOutbox(stateDir string) *outbox {
	if stateDir == "" {
		return &outbox{mem: map[string]schedule.Envelope{}}
	}
	return &outbox{dir: filepath.Join(stateDir, OutboxDir)}
}

// durable reports whether records survive a restart.
func (o *outbox) durable() bool { return o.dir != "" }

// open creates the directory and proves it writable, so a misconfigured
// state directory stops Run at start instead of losing occurrences later.
func (o *outbox) open(stateDir string) error {
	if o.dir == "" {
		return nil
	}
	err := os.MkdirAll(o.dir, outboxPerms)
	if err == nil {
		var f *os.File
		if f, err = os.CreateTemp(o.dir, tempPrefix+"probe-*"); err == nil {
			name := f.Name()
			err = errors.Join(f.Close(), os.Remove(name))
		}
	}
	if err != nil {
		return fmt.Errorf("schedule: state directory %s cannot hold the schedule outbox (%s): %w; "+
			"point --state-dir or RELAY_STATE_DIR at a writable directory", stateDir, o.dir, err)
	}
	return nil
}

// CheckStateDir reports whether dir can hold the schedule outbox, as a
// Scheduler WithStateDir(dir) needs when it starts: it creates the outbox
// directory and proves it writable. The error names dir and what to set.
func CheckStateDir(dir string) error {
	return newOutbox(dir).open(dir)
}

// fileName names the record of one occurrence: app, schedule and instant,
// escaped so that '+' separates them unambiguously and nothing in a name
// can reach another directory.
func fileName(e schedule.Envelope, at time.Time) string {
	return escapeName(e.App) + "+" + escapeName(e.Schedule) + "+" + at.UTC().Format("20060102T150405Z") + outboxExt
}

func escapeName(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_':
			b.WriteByte(c)
		case c == '.' && i > 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// put stores e, replacing an earlier record of the same occurrence.
func (o *outbox) put(e schedule.Envelope) (string, error) {
	at, err := e.Time()
	if err != nil {
		return "", err
	}
	name := fileName(e, at)
	if o.dir == "" {
		o.mu.Lock()
		o.mem[name] = e
		o.mu.Unlock()
		return name, nil
	}
	path := filepath.Join(o.dir, name)
	if err := writeAtomic(o.dir, name, append(e.Marshal(), '\n')); err != nil {
		return path, fmt.Errorf("schedule: store %s in the outbox: %w", e.OccurrenceID, err)
	}
	return path, nil
}

// writeAtomic writes data to dir/name so that after a crash the file either
// does not exist or is complete: temporary file, fsync, rename over the
// name, fsync of the directory (which makes the rename itself durable).
func writeAtomic(dir, name string, data []byte) (err error) {
	f, err := os.CreateTemp(dir, tempPrefix+name+"-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			_ = os.Remove(tmp) // best effort: a leftover is swept by list
		}
	}()
	if _, err = f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Sync(); err != nil {
		_ = f.Close()
		return err
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	return errors.Join(d.Sync(), d.Close())
}

// problem is a file list could not use, for the caller to log.
type problem struct {
	path string
	err  error
	what string // what was done about it
}

// list returns the stored occurrences, oldest instant first. A file that
// does not hold a valid envelope is renamed to *.corrupt (so it is neither
// retried forever nor lost) and reported; temporary files older than
// tempMaxAge are leftovers of a crash mid-write and are removed.
func (o *outbox) list(now time.Time) ([]record, []problem, error) {
	var recs []record
	var probs []problem
	if o.dir == "" {
		o.mu.Lock()
		for name, e := range o.mem {
			at, _ := e.Time() // put checked it
			recs = append(recs, record{name: name, env: e, at: at})
		}
		o.mu.Unlock()
	} else {
		entries, err := os.ReadDir(o.dir)
		if err != nil {
			return nil, nil, fmt.Errorf("schedule: read the outbox %s: %w", o.dir, err)
		}
		for _, de := range entries {
			name := de.Name()
			path := filepath.Join(o.dir, name)
			switch {
			case de.IsDir():
				continue
			case strings.HasPrefix(name, tempPrefix):
				if info, err := de.Info(); err == nil && now.Sub(info.ModTime()) > tempMaxAge {
					if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
						probs = append(probs, problem{path, err, "could not remove a leftover temporary file"})
					}
				}
				continue
			case !strings.HasSuffix(name, outboxExt):
				continue
			}
			data, err := os.ReadFile(path)
			if errors.Is(err, fs.ErrNotExist) {
				continue // published and removed by another Scheduler meanwhile
			}
			if err != nil {
				probs = append(probs, problem{path, err, "could not read it; will try again"})
				continue
			}
			e, err := schedule.DecodeEnvelope(data)
			var at time.Time
			if err == nil {
				at, err = e.Time()
			}
			if err != nil {
				if rerr := os.Rename(path, path+corruptExt); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
					probs = append(probs, problem{path, errors.Join(err, rerr), "corrupt, and could not be moved aside"})
				} else {
					probs = append(probs, problem{path, err, "corrupt; moved aside to " + path + corruptExt})
				}
				continue
			}
			recs = append(recs, record{name: name, env: e, at: at})
		}
	}
	slices.SortFunc(recs, func(a, b record) int {
		if c := a.at.Compare(b.at); c != 0 {
			return c
		}
		return strings.Compare(a.name, b.name)
	})
	return recs, probs, nil
}

// remove deletes a record once its occurrence is in the stream. A record
// already gone is fine. The directory is not fsynced: if the removal is
// lost in a crash, the record is retried and found to be a duplicate.
func (o *outbox) remove(r record) error {
	if o.dir == "" {
		o.mu.Lock()
		delete(o.mem, r.name)
		o.mu.Unlock()
		return nil
	}
	err := os.Remove(filepath.Join(o.dir, r.name))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("schedule: remove %s from the outbox: %w", r.env.OccurrenceID, err)
	}
	return nil
}
