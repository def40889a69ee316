package app

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode"
)

// FieldPath names one value inside an event object by the keys leading to
// it, separated by dots: new_image.customer_id is the field customer_id of
// the object in the event's field new_image, as a pattern's nested map
// new_image: {customer_id: ...} names it (docs/flow-control.md#field-paths).
// A key that contains a dot or a backslash writes it escaped with a
// backslash: a\.b is the one key "a.b", a\\b the key `a\b`. No other
// escape exists, and operator names need none: a path has no operators,
// so prefix is the key "prefix" (a pattern writes it \prefix).
//
// Each key is non-empty and holds no whitespace or control character. The
// zero FieldPath is the empty path: no key, every event in one group.
// ParseFieldPath checks one; FieldPathOf builds one from keys.
type FieldPath string

// ParseFieldPath returns s as a FieldPath, or an error that says what is
// wrong with it and how to write it.
func ParseFieldPath(s string) (FieldPath, error) {
	if s == "" {
		return "", errors.New("field path is empty; write the keys to the value separated by dots, like new_image.customer_id")
	}
	n, empty := 1, true // the key being read and whether it has a byte yet
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 == len(s) || (s[i+1] != '.' && s[i+1] != '\\') {
				return "", fmt.Errorf(`field path %q: a backslash escapes only a dot (\.) or a backslash (\\) inside a key; operator names need no backslash in a path`, s)
			}
			i++
			empty = false
		case '.':
			if empty {
				return "", emptyKey(s, n)
			}
			n, empty = n+1, true
		default:
			empty = false
		}
	}
	if empty {
		return "", emptyKey(s, n)
	}
	if i := strings.IndexFunc(s, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }); i >= 0 {
		return "", fmt.Errorf("field path %q: contains whitespace or a control character at byte %d; a path names keys without spaces", s, i)
	}
	return FieldPath(s), nil
}

func emptyKey(s string, n int) error {
	return fmt.Errorf("field path %q: key %d is empty; write the keys separated by single dots, like new_image.customer_id (a key with a dot is written a\\.b)", s, n)
}

// FieldPathOf returns the path of the given keys, escaping the dots and
// backslashes in them: FieldPathOf("meta", "a.b") is meta.a\.b. It does
// not check the keys (ParseFieldPath of the result does).
func FieldPathOf(keys ...string) FieldPath {
	var b strings.Builder
	for i, k := range keys {
		if i > 0 {
			b.WriteByte('.')
		}
		for j := 0; j < len(k); j++ {
			if k[j] == '.' || k[j] == '\\' {
				b.WriteByte('\\')
			}
			b.WriteByte(k[j])
		}
	}
	return FieldPath(b.String())
}

// Keys returns the keys of p, unescaped: new_image.customer_id gives
// [new_image customer_id], a\.b gives [a.b]. The empty path has none.
func (p FieldPath) Keys() []string {
	s := string(p)
	switch {
	case s == "":
		return nil
	case strings.IndexByte(s, '\\') < 0:
		return strings.Split(s, ".")
	}
	var keys []string
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\' && i+1 < len(s):
			i++
			b.WriteByte(s[i])
		case c == '.':
			keys = append(keys, b.String())
			b.Reset()
		default:
			b.WriteByte(c)
		}
	}
	return append(keys, b.String())
}

// String returns the path as written, escapes included.
func (p FieldPath) String() string { return string(p) }

// MaxKeyBytes is the longest limit key KeyOf returns as the value's own
// text; longer values are replaced by their hash.
const MaxKeyBytes = 128

// HashedKeyPrefix starts a limit key that stands for a longer value
// (KeyOf).
const HashedKeyPrefix = "sha256:"

// KeyOf returns the limit key of event, the JSON text of an event object,
// at path: the value that decides which concurrency slots, rate limit or
// debounce group an invocation of the event belongs to
// (docs/flow-control.md#limit-keys).
//
//   - A string gives its text, unescaped.
//   - A number gives its JSON text as written: 7 and 7.0 are two keys, and
//     the number 7 and the string "7" one.
//   - true and false give "true" and "false".
//   - A missing field, null, an object, an array, a path that meets a
//     value that is not an object before its last key, and the empty path
//     give "": those events all share one key, as do events whose value is
//     the empty string.
//   - A key longer than MaxKeyBytes, or one that starts with
//     HashedKeyPrefix, is replaced by HashedKeyPrefix and the hex SHA-256
//     of the text, so keys stay short and a hashed key never equals a
//     value's own text.
//
// When an object repeats a key, the last occurrence wins whole, as in the
// matcher (matcher.DecodeEvent) and in handlers' JSON parsers. KeyOf reads
// the text once without decoding what the path does not lead to (about
// 1.7 ms for a 1 MiB event on the project's 2-core machine, 2 µs for 1
// KiB: BenchmarkKeyOf) and allocates only the path's keys and the key. Given text that
// is not a JSON object (which the matcher would have refused), it returns
// some key without panicking, usually "".
func KeyOf(event []byte, path FieldPath) string {
	keys := path.Keys()
	if len(keys) == 0 {
		return ""
	}
	i := space(event, 0)
	if i >= len(event) || event[i] != '{' {
		return ""
	}
	start, end, next := find(event, i, keys)
	if start < 0 || next < 0 {
		return ""
	}
	var text string
	switch v := event[start:end]; v[0] {
	case '"':
		s, ok := jsonString(v)
		if !ok {
			return ""
		}
		text = s
	case '{', '[', 'n':
		return ""
	default: // a number, true or false
		if c := v[0]; c != '-' && (c < '0' || c > '9') && string(v) != "true" && string(v) != "false" {
			return "" // not JSON
		}
		text = string(v)
	}
	if len(text) > MaxKeyBytes || strings.HasPrefix(text, HashedKeyPrefix) {
		sum := sha256.Sum256([]byte(text))
		return HashedKeyPrefix + hex.EncodeToString(sum[:])
	}
	return text
}

// find looks for keys in the object that starts at b[i] ('{'). It returns
// the span of the value they name, or start -1 when there is none, and the
// index after the object (-1 when the text ends first or is malformed).
// Every occurrence of a repeated key is looked at, so the last one wins.
func find(b []byte, i int, keys []string) (start, end, next int) {
	start, end = -1, -1
	i = space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return start, end, i + 1
	}
	for i < len(b) {
		if b[i] != '"' {
			return start, end, -1
		}
		kEnd := skipString(b, i)
		if kEnd < 0 {
			return start, end, -1
		}
		match := keyIs(b[i:kEnd], keys[0])
		i = space(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return start, end, -1
		}
		i = space(b, i+1)
		if i >= len(b) {
			return start, end, -1
		}
		var vEnd int
		switch {
		case !match:
			vEnd = skipValue(b, i)
		case len(keys) == 1:
			vEnd = skipValue(b, i)
			start, end = i, vEnd
		case b[i] == '{':
			start, end, vEnd = find(b, i, keys[1:])
		default: // not an object: it has no keys
			vEnd = skipValue(b, i)
			start, end = -1, -1
		}
		if vEnd < 0 {
			return -1, -1, -1
		}
		i = space(b, vEnd)
		if i >= len(b) {
			break
		}
		switch b[i] {
		case '}':
			return start, end, i + 1
		case ',':
			i = space(b, i+1)
		default:
			return start, end, -1
		}
	}
	return start, end, -1
}

// keyIs reports whether the quoted JSON string q is k.
func keyIs(q []byte, k string) bool {
	raw := q[1 : len(q)-1]
	if len(raw) == len(k) && string(raw) == k {
		return true // the common case: no escapes
	}
	if bytes.IndexByte(raw, '\\') < 0 {
		return false
	}
	s, ok := jsonString(q)
	return ok && s == k
}

// jsonString unquotes the JSON string q as encoding/json does.
func jsonString(q []byte) (string, bool) {
	raw := q[1 : len(q)-1]
	if bytes.IndexByte(raw, '\\') < 0 {
		return string(raw), true
	}
	var s string
	err := json.Unmarshal(q, &s)
	return s, err == nil
}

// space returns the index of the first byte at or after i that is not
// JSON whitespace.
func space(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// skipString returns the index after the JSON string that starts at b[i]
// ('"'), or -1.
func skipString(b []byte, i int) int {
	for j := i + 1; ; {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return -1
		}
		j += k
		// The quote ends the string unless an odd number of backslashes
		// escapes it.
		n := 0
		for p := j - 1; p > i && b[p] == '\\'; p-- {
			n++
		}
		if n%2 == 0 {
			return j + 1
		}
		j++
	}
}

// skipValue returns the index after the JSON value that starts at b[i],
// or -1. It checks the nesting of brackets and the ends of strings, not
// the rest of the syntax.
func skipValue(b []byte, i int) int {
	switch b[i] {
	case '"':
		return skipString(b, i)
	case '{', '[':
		var stack [64]byte
		open := stack[:0]
		for j := i; j < len(b); j++ {
			switch c := b[j]; c {
			case '"':
				if j = skipString(b, j); j < 0 {
					return -1
				}
				j--
			case '{', '[':
				open = append(open, c)
			case '}', ']':
				if open[len(open)-1] != c-2 { // '{'+2 == '}', '['+2 == ']'
					return -1
				}
				if open = open[:len(open)-1]; len(open) == 0 {
					return j + 1
				}
			}
		}
		return -1
	case '}', ']', ',', ':':
		return -1
	}
	// A number, true, false or null.
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}
