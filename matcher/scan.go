package matcher

import (
	"encoding/binary"
	"encoding/json"
	"math/bits"
	"unicode/utf16"
	"unicode/utf8"
)

// This file is the decoder of Set.Match: one pass over the event's bytes
// that accepts exactly the texts DecodeEvent accepts (one JSON object,
// surrounded by optional whitespace, valid UTF-8, at most MaxEventDepth
// deep) but builds only the values under the field paths some rule
// references. Everything else is validated and skipped. The values it does
// build equal DecodeEvent's: strings unescaped the same way, numbers as
// json.Number with their text, the last of duplicate keys winning. So the
// matching code, which only ever looks up referenced paths, decides the
// same on the partial object as on the whole one.

// pathNode is one field of the paths that a Set's rules reference: a
// trie of field names whose root stands for the event itself.
type pathNode struct {
	// names and kids are the children, in parallel; byName indexes them
	// once there are many.
	names  []string
	kids   []*pathNode
	byName map[string]int
	// lens has bit min(len(name), 63) set for every child's name, so that
	// most keys no rule references are passed over without a comparison.
	lens uint64
	// strs holds, as values ready to store in an object, the strings that
	// rules compare this field with for equality: an event value equal to
	// one of them is taken from here instead of being allocated.
	strs map[string]any
}

// linearChildren is the number of children up to which child compares
// names one by one; beyond it a map lookup is faster.
const linearChildren = 8

// addFields adds the paths of fields, and of the nested maps among their
// alternatives, under n.
func (n *pathNode) addFields(fields []field) {
	for i := range fields {
		f := &fields[i]
		c := n.add(f.name)
		for j := range f.alts {
			switch a := &f.alts[j]; {
			case a.op == opNested:
				c.addFields(a.fields)
			case a.op == opEqual && a.lit.kind == litString:
				if c.strs == nil {
					c.strs = make(map[string]any)
				}
				c.strs[a.lit.str] = a.lit.str
			}
		}
	}
}

// add returns the child called name, adding it if need be.
func (n *pathNode) add(name string) *pathNode {
	if _, c := n.lookup(name); c != nil {
		return c
	}
	c := new(pathNode)
	n.names = append(n.names, name)
	n.kids = append(n.kids, c)
	n.lens |= lenBit(len(name))
	if len(n.names) > linearChildren {
		if n.byName == nil {
			n.byName = make(map[string]int, len(n.names))
			for i, s := range n.names {
				n.byName[s] = i
			}
		}
		n.byName[name] = len(n.names) - 1
	}
	return c
}

func lenBit(n int) uint64 { return 1 << min(n, 63) }

// lookup returns the child called name and its name as the rules spell
// it, or nil.
func (n *pathNode) lookup(name string) (string, *pathNode) {
	return n.child([]byte(name))
}

// child is lookup for a key's unescaped bytes. It does not allocate.
func (n *pathNode) child(key []byte) (string, *pathNode) {
	if n.lens&lenBit(len(key)) == 0 {
		return "", nil
	}
	if n.byName != nil {
		if i, ok := n.byName[string(key)]; ok {
			return n.names[i], n.kids[i]
		}
		return "", nil
	}
	for i, s := range n.names {
		if s == string(key) {
			return s, n.kids[i]
		}
	}
	return "", nil
}

// scanner decodes one event. The zero value is ready; reset readies a used
// one for another event, keeping its memory. Its parsing methods take the
// offset of what they parse in b and return the offset after it, or -1 when
// the text there is not well-formed.
type scanner struct {
	b []byte
	// maps are the objects handed out for this event, reused across
	// events: a match keeps no value of the event beyond its own call.
	maps  []map[string]any
	nmaps int
	// elems holds the elements of the arrays being built, innermost last.
	elems []any
	// buf holds the unescaped text of the string being read.
	buf []byte
}

// decode decodes b, building only the values under the paths of root, and
// reports whether b is a well-formed event (DecodeEvent's rules). The
// result is valid until s is reset.
func (s *scanner) decode(b []byte, root *pathNode) (map[string]any, bool) {
	s.b = b
	i := space(b, 0)
	if i == len(b) || b[i] != '{' {
		return nil, false
	}
	obj, i := s.object(root, 1, i)
	if i < 0 || space(b, i) != len(b) {
		return nil, false
	}
	return obj, true
}

// reset forgets the last event, so that s keeps no reference to it. It
// keeps the memory a usual event needs, not what an unusually big one
// took.
func (s *scanner) reset() {
	for _, m := range s.maps[:s.nmaps] {
		clear(m)
	}
	s.maps = s.maps[:min(len(s.maps), keepMaps)]
	s.nmaps = 0
	clear(s.elems[:cap(s.elems)])
	s.elems = s.elems[:0]
	if cap(s.elems) > keepElems {
		s.elems = nil
	}
	if cap(s.buf) > keepBuf {
		s.buf = nil
	}
	s.b = nil
}

// The most objects, array elements and bytes of unescaped text a scanner
// keeps for the next event.
const (
	keepMaps  = 64
	keepElems = 1024
	keepBuf   = 64 << 10
)

// emptyObject stands for an object at a path that no rule looks into
// (only at the object itself, as a value): nothing ever writes to it.
var emptyObject = map[string]any{}

func (s *scanner) newMap() map[string]any {
	if s.nmaps < len(s.maps) {
		s.nmaps++
		return s.maps[s.nmaps-1]
	}
	m := make(map[string]any)
	s.maps = append(s.maps, m)
	s.nmaps++
	return m
}

// space returns the offset of the first byte at or after i that is not
// JSON whitespace.
func space(b []byte, i int) int {
	for ; i < len(b); i++ {
		if c := b[i]; c > ' ' || (c != ' ' && c != '\t' && c != '\n' && c != '\r') {
			break
		}
	}
	return i
}

// value builds the value at i for the paths under n, or only validates it
// when n is nil (the result is then nil). depth is the nesting of the
// enclosing object or array.
func (s *scanner) value(n *pathNode, depth, i int) (any, int) {
	b := s.b
	if i >= len(b) {
		return nil, -1
	}
	switch c := b[i]; c {
	case '{':
		switch {
		case n == nil:
			return nil, s.skipObject(depth+1, i)
		case len(n.names) == 0:
			return emptyObject, s.skipObject(depth+1, i)
		}
		return s.object(n, depth+1, i)
	case '[':
		if n == nil {
			return nil, s.skipArray(depth+1, i)
		}
		return s.array(n, depth+1, i)
	case '"':
		end, escaped := str(b, i)
		if end < 0 || n == nil {
			return nil, end
		}
		raw := b[i+1 : end-1]
		if escaped {
			s.buf = unescape(s.buf[:0], raw)
			raw = s.buf
		}
		if v, ok := n.strs[string(raw)]; ok {
			return v, end
		}
		return string(raw), end
	case 't':
		return true, word(b, i, "true")
	case 'f':
		return false, word(b, i, "false")
	case 'n':
		return nil, word(b, i, "null")
	default:
		end := number(b, i)
		if end < 0 || n == nil {
			return nil, end
		}
		return json.Number(b[i:end]), end
	}
}

// object builds the object at i, which starts with '{', keeping the keys
// that are children of n.
func (s *scanner) object(n *pathNode, depth, i int) (map[string]any, int) {
	if depth > MaxEventDepth {
		return nil, -1
	}
	b := s.b
	obj := s.newMap()
	i = space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return obj, i + 1
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return nil, -1
		}
		end, escaped := str(b, i)
		if end < 0 {
			return nil, -1
		}
		key := b[i+1 : end-1]
		if escaped {
			s.buf = unescape(s.buf[:0], key)
			key = s.buf
		}
		name, c := n.child(key)
		if i = colon(b, end); i < 0 {
			return nil, -1
		}
		var v any
		if v, i = s.value(c, depth, i); i < 0 {
			return nil, -1
		}
		if c != nil {
			obj[name] = v // a later duplicate replaces it, as in DecodeEvent
		}
		i = space(b, i)
		if i >= len(b) {
			return nil, -1
		}
		switch b[i] {
		case ',':
			i = space(b, i+1)
		case '}':
			return obj, i + 1
		default:
			return nil, -1
		}
	}
}

// array builds the array at i, which starts with '[', its elements for
// the paths under n: DecodeEvent's arrays hold objects, arrays and
// scalars at the same path as the array itself.
func (s *scanner) array(n *pathNode, depth, i int) ([]any, int) {
	if depth > MaxEventDepth {
		return nil, -1
	}
	b := s.b
	i = space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return []any{}, i + 1
	}
	base := len(s.elems)
	for {
		var v any
		if v, i = s.value(n, depth, i); i < 0 {
			return nil, -1
		}
		s.elems = append(s.elems, v)
		i = space(b, i)
		if i >= len(b) {
			return nil, -1
		}
		if b[i] == ',' {
			i = space(b, i+1)
			continue
		}
		if b[i] != ']' {
			return nil, -1
		}
		arr := make([]any, len(s.elems)-base)
		copy(arr, s.elems[base:])
		clear(s.elems[base:])
		s.elems = s.elems[:base]
		return arr, i + 1
	}
}

// skipObject validates the object at i, which starts with '{'.
func (s *scanner) skipObject(depth, i int) int {
	if depth > MaxEventDepth {
		return -1
	}
	b := s.b
	i = space(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return -1
		}
		if i, _ = str(b, i); i < 0 {
			return -1
		}
		if i = colon(b, i); i < 0 {
			return -1
		}
		if _, i = s.value(nil, depth, i); i < 0 {
			return -1
		}
		i = space(b, i)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = space(b, i+1)
		case '}':
			return i + 1
		default:
			return -1
		}
	}
}

// skipArray validates the array at i, which starts with '['.
func (s *scanner) skipArray(depth, i int) int {
	if depth > MaxEventDepth {
		return -1
	}
	b := s.b
	i = space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		if _, i = s.value(nil, depth, i); i < 0 {
			return -1
		}
		i = space(b, i)
		if i >= len(b) {
			return -1
		}
		switch b[i] {
		case ',':
			i = space(b, i+1)
		case ']':
			return i + 1
		default:
			return -1
		}
	}
}

// colon returns the offset after whitespace, a ':' and whitespace at i.
func colon(b []byte, i int) int {
	i = space(b, i)
	if i >= len(b) || b[i] != ':' {
		return -1
	}
	return space(b, i+1)
}

// word returns the offset after w at i: true, false or null.
func word(b []byte, i int, w string) int {
	if len(b)-i < len(w) || string(b[i:i+len(w)]) != w {
		return -1
	}
	return i + len(w)
}

// number validates the JSON number at i:
// -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func number(b []byte, i int) int {
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i >= len(b) || !isDigit(b[i]):
		return -1
	case b[i] == '0':
		i++
	default:
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || !isDigit(b[i]) {
			return -1
		}
		for i < len(b) && isDigit(b[i]) {
			i++
		}
	}
	return i
}

// ones has 1 in every byte.
const ones = 0x0101010101010101

// plain marks the bytes a string may hold as they are: not '"', '\\', a
// control character or the start of a multi-byte UTF-8 sequence.
var plain = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str validates the string at i, which starts with '"', and returns the
// offset after its closing quote. escaped reports whether it holds any
// escape.
func str(b []byte, i int) (end int, escaped bool) {
	i++
	for {
		// Eight bytes at a time: m has the top bit of every byte that is a
		// '"', a '\\', below 0x20 or above 0x7f set. (The subtractions
		// can also set it above such a byte, through the borrow, but never
		// below, so the lowest bit set is exact.)
		for len(b)-i >= 8 {
			w := binary.LittleEndian.Uint64(b[i:])
			q, bs := w^(ones*'"'), w^(ones*'\\')
			m := (w | (w - ones*0x20) | (q-ones)&^q | (bs-ones)&^bs) & (ones * 0x80)
			if m != 0 {
				i += bits.TrailingZeros64(m) >> 3
				goto special
			}
			i += 8
		}
		for i < len(b) && plain[b[i]] {
			i++
		}
	special:
		if i >= len(b) {
			return -1, false
		}
		switch c := b[i]; {
		case c == '"':
			return i + 1, escaped
		case c == '\\':
			escaped = true
			i++
			if i >= len(b) {
				return -1, false
			}
			switch b[i] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i++
			case 'u':
				if len(b)-i < 5 || hex4(b[i+1:i+5]) < 0 {
					return -1, false
				}
				i += 5
			default:
				return -1, false
			}
		case c < 0x20:
			return -1, false
		default: // c >= utf8.RuneSelf
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				return -1, false
			}
			i += size
		}
	}
}

// hex4 returns the value of four hex digits, or -1.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}

// unescape appends the text of raw, the validated inside of a JSON string,
// to dst, as encoding/json unescapes it: a \u escape of a surrogate that
// does not pair with the \u escape right after it becomes U+FFFD.
func unescape(dst, raw []byte) []byte {
	for i := 0; i < len(raw); {
		c := raw[i]
		if c != '\\' {
			dst = append(dst, c)
			i++
			continue
		}
		switch raw[i+1] {
		case 'b':
			dst = append(dst, '\b')
		case 'f':
			dst = append(dst, '\f')
		case 'n':
			dst = append(dst, '\n')
		case 'r':
			dst = append(dst, '\r')
		case 't':
			dst = append(dst, '\t')
		case 'u':
			r := hex4(raw[i+2 : i+6])
			i += 6
			if utf16.IsSurrogate(r) {
				r2 := rune(-1)
				if len(raw)-i >= 6 && raw[i] == '\\' && raw[i+1] == 'u' {
					r2 = hex4(raw[i+2 : i+6])
				}
				if pair := utf16.DecodeRune(r, r2); pair != utf8.RuneError {
					r = pair
					i += 6
				} else {
					r = utf8.RuneError
				}
			}
			dst = utf8.AppendRune(dst, r)
			continue
		default: // '"', '\\', '/'
			dst = append(dst, raw[i+1])
		}
		i += 2
	}
	return dst
}
