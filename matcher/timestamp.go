package matcher

import "time"

// parseTimestamp parses an RFC 3339 date-time (RFC 3339 §5.6):
// YYYY-MM-DDTHH:MM:SS, optional fraction, then "Z" or ±HH:MM; "T" and "Z"
// may be lower case. The syntax is checked strictly first, because
// time.Parse also takes forms RFC 3339 does not allow (a comma before the
// fraction, for one, or offset +24:00). Dates that do not exist (February
// 30, hour 24) and leap seconds are rejected. Fraction digits beyond the
// ninth are dropped.
func parseTimestamp(s string) (time.Time, bool) {
	if !isRFC3339(s) {
		return time.Time{}, false
	}
	b := []byte(s)
	b[10] = 'T'
	if c := b[len(b)-1]; c == 'z' {
		b[len(b)-1] = 'Z'
	}
	t, err := time.Parse(time.RFC3339Nano, string(b))
	if err != nil {
		return time.Time{}, false
	}
	return t, true
}

// isRFC3339 checks the RFC 3339 date-time syntax, not the ranges.
func isRFC3339(s string) bool {
	// 2006-01-02T15:04:05 is 19 bytes; then fraction and offset.
	if len(s) < 20 {
		return false
	}
	for i, c := range []byte(s[:19]) {
		switch i {
		case 4, 7:
			if c != '-' {
				return false
			}
		case 10:
			if c != 'T' && c != 't' {
				return false
			}
		case 13, 16:
			if c != ':' {
				return false
			}
		default:
			if !isDigit(c) {
				return false
			}
		}
	}
	rest := s[19:]
	if rest[0] == '.' {
		n := 1
		for n < len(rest) && isDigit(rest[n]) {
			n++
		}
		if n == 1 {
			return false
		}
		rest = rest[n:]
	}
	switch {
	case rest == "Z" || rest == "z":
		return true
	case len(rest) == 6 && (rest[0] == '+' || rest[0] == '-') && rest[3] == ':':
		// time-numoffset: hour 00-23, minute 00-59 (time.Parse allows more).
		return isDigit(rest[1]) && isDigit(rest[2]) && isDigit(rest[4]) && isDigit(rest[5]) &&
			(rest[1] < '2' || rest[1] == '2' && rest[2] <= '3') && rest[4] <= '5'
	}
	return false
}
