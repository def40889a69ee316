package matcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"
)

// DecodeEvent decodes the JSON text of one external event. The result holds
// map[string]any, []any, string, json.Number (so numbers keep their exact
// digits), bool and nil values. The error wraps ErrMalformed unless b is
// exactly one JSON object (RFC 8259 syntax), optionally surrounded by JSON
// whitespace (space, tab, CR, LF). When a key repeats, the last value wins
// whole, as in encoding/json. Strings are unescaped as encoding/json does:
// a \u escape of a UTF-16 surrogate that does not pair with the \u escape
// right after it stands for U+FFFD and is not an error.
//
// Text that handlers' JSON parsers would refuse is malformed too, so it is
// dead-lettered once instead of failing every attempt: invalid UTF-8
// anywhere in b (Go would silently replace it) and nesting of objects and
// arrays deeper than MaxEventDepth (Python's parser gives up near 1000
// levels).
//
// Set.Match decodes events by these same rules, with the same errors, but
// builds only what its rules look at; DecodeEvent is the reference it is
// tested against.
func DecodeEvent(b []byte) (map[string]any, error) {
	if !utf8.Valid(b) {
		return nil, fmt.Errorf("%w: not valid UTF-8 (first invalid byte at offset %d)", ErrMalformed, invalidUTF8At(b))
	}
	if depth(b) > MaxEventDepth {
		return nil, fmt.Errorf("%w: nested deeper than %d levels", ErrMalformed, MaxEventDepth)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: empty input", ErrMalformed)
		}
		return nil, fmt.Errorf("%w: not valid JSON: %v", ErrMalformed, err)
	}
	obj, ok := v.(map[string]any)
	if !ok {
		return nil, fmt.Errorf("%w: want a JSON object, got %s", ErrMalformed, jsonKind(v))
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: data after the JSON object at offset %d", ErrMalformed, dec.InputOffset())
	}
	return obj, nil
}

// MaxEventDepth is the deepest nesting of objects and arrays an event may
// have; the event object itself is level 1.
const MaxEventDepth = 512

func invalidUTF8At(b []byte) int {
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n <= 1 {
			return i
		}
		i += n
	}
	return len(b)
}

// depth returns the deepest nesting of [ and { outside strings; it scans
// the text once, so a deep event costs nothing to reject.
func depth(b []byte) int {
	d, deepest, inString, escaped := 0, 0, false, false
	for _, c := range b {
		switch {
		case inString:
			switch {
			case escaped:
				escaped = false
			case c == '\\':
				escaped = true
			case c == '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '[' || c == '{':
			d++
			deepest = max(deepest, d)
		case c == ']' || c == '}':
			d--
		}
	}
	return deepest
}

func jsonKind(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case []any:
		return "an array"
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return fmt.Sprintf("%T", v)
}
