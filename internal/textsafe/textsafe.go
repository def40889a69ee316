// Package textsafe escapes stored text (events, reasons, a handler's
// output) before it is shown to an operator, in a terminal or on a page.
package textsafe

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Escape escapes what must not reach an operator's terminal as it
// is: bytes that are not UTF-8 become \xNN, and control characters and
// bidirectional controls (U+202E turns the rest of a line around) \xNN or
// \uNNNN, so stored data (a malformed event, a handler's stderr line)
// can neither send escape sequences to the terminal, nor disguise text,
// nor break a table's columns. Newlines and tabs stay when keepLines is set (a pretty-printed
// body), and are escaped otherwise (a table cell).
func Escape(s string, keepLines bool) string {
	clean := true
	for _, r := range s {
		if r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size <= 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case keepLines && (r == '\n' || r == '\t'):
			b.WriteRune(r)
		case r < 0x80 && unicode.IsControl(r):
			fmt.Fprintf(&b, `\x%02x`, r)
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	return b.String()
}
