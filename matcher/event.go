package matcher

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// DecodeEvent decodes the JSON text of one external event. The result holds
// map[string]any, []any, string, json.Number (so numbers keep their exact
// digits), bool and nil values. The error wraps ErrMalformed unless b is
// exactly one JSON object, optionally surrounded by whitespace. When a key
// repeats, the last value wins, as in encoding/json.
func DecodeEvent(b []byte) (map[string]any, error) {
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
