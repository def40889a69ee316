package dlq

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ParseAge reads an age filter of Filter.Since or PageQuery.Before, as
// relay dlq ls --since and the console take it: a duration before now in
// Go syntax, with "d" for days ("30m", "12h", "7d"), or an RFC 3339 time.
// "" is the zero time, no filter. A negative or unreadable age is an error
// that quotes s.
func ParseAge(s string, now time.Time) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		var n float64
		n, err = strconv.ParseFloat(days, 64)
		d = time.Duration(n * float64(24*time.Hour))
	}
	if err != nil || d < 0 {
		return time.Time{}, fmt.Errorf("%q: want an age such as 30m, 12h or 7d, or an RFC 3339 time such as 2026-09-12T10:00:00Z", s)
	}
	return now.Add(-d), nil
}
