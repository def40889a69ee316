package matcher

import "encoding/json"

// DecodeReferenced decodes event as Set.Match does: only the values under
// the field paths s's rules reference. ok is false when the decoder finds
// event malformed.
func (s *Set) DecodeReferenced(event []byte) (obj map[string]any, ok bool) {
	var sc scanner
	obj, ok = sc.decode(event, s.fields)
	return asDecoded(obj), ok
}

// asDecoded returns v as DecodeEvent would build it: *string and *json.Number
// (see eventString) replaced by the values they point to, and without the
// scanner's memory.
func asDecoded[T any](v T) T {
	var walk func(v any) any
	walk = func(v any) any {
		switch v := v.(type) {
		case map[string]any:
			if v == nil {
				return v
			}
			out := make(map[string]any, len(v))
			for k, e := range v {
				out[k] = walk(e)
			}
			return out
		case []any:
			out := make([]any, len(v))
			for i, e := range v {
				out[i] = walk(e)
			}
			return out
		case *string:
			return *v
		case *json.Number:
			return *v
		}
		return v
	}
	return walk(v).(T)
}

// ReferencedPaths lists the field paths s decodes, each from the top of the
// event, parents before children.
func (s *Set) ReferencedPaths() [][]string {
	var out [][]string
	var walk func(n *pathNode, prefix []string)
	walk = func(n *pathNode, prefix []string) {
		for i, name := range n.names {
			p := append(prefix[:len(prefix):len(prefix)], name)
			out = append(out, p)
			walk(n.kids[i], p)
		}
	}
	walk(s.fields, nil)
	return out
}

// DecodePaths decodes event as Set.Match does for rules referencing paths
// (and their parents).
func DecodePaths(event []byte, paths [][]string) (obj map[string]any, ok bool) {
	root := new(pathNode)
	for _, p := range paths {
		n := root
		for _, name := range p {
			n = n.add(name)
		}
	}
	var sc scanner
	obj, ok = sc.decode(event, root)
	return asDecoded(obj), ok
}

// ScanLoop runs the decoder of Set.Match n times on event, with its pooled
// memory as Set.Match does, for benchmarks; with validateOnly it builds
// nothing. It reports whether the event was well-formed every time.
func (s *Set) ScanLoop(event []byte, validateOnly bool, n int) bool {
	root := s.fields
	if validateOnly {
		root = &pathNode{}
	}
	sc := s.scratch.Get().(*scratch)
	defer s.scratch.Put(sc)
	for range n {
		_, ok := sc.scan.decode(event, root)
		sc.scan.reset()
		if !ok {
			return false
		}
	}
	return true
}
