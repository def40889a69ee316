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
// build equal DecodeEvent's (strings unescaped the same way, numbers as
// json.Number with their text, the last of duplicate keys winning), except
// that strings and numbers are held through pointers: a *string or a
// *json.Number fits in an interface without an allocation of its own (see
// eventString). The matching code only ever looks up referenced paths, so
// it decides the same on the partial object as on the whole one.
//
// The memory of the objects, arrays and values built is reused from one
// event to the next (scanner.reset), which is safe because matching keeps
// nothing of the event. What remains allocated per event is one string
// holding the text of every string and number built, and the header of
// each array built.

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
			if f.alts[j].op == opNested {
				c.addFields(f.alts[j].fields)
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
	// slab, strs and nums hold the arrays, strings and numbers built,
	// reused across events: an object holds a *string pointing into strs
	// rather than a string, which would take an allocation to put in an
	// interface (see eventString).
	slab []any
	strs []string
	nums []json.Number
	// text collects the (unescaped) text of the strings and numbers built,
	// in order, and pending their places; decode makes all of it one string
	// at the end and sets each of them to its part.
	text    []byte
	pending []pending
	// buf holds the unescaped text of the key being read.
	buf []byte
}

// pending is a string or number value whose text ends at text[end].
type pending struct {
	str *string
	num *json.Number
	end int
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
	all, start := string(s.text), 0
	for _, p := range s.pending {
		if p.str != nil {
			*p.str = all[start:p.end]
		} else {
			*p.num = json.Number(all[start:p.end])
		}
		start = p.end
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
	clear(s.elems) // left over only when the event was malformed
	s.elems = s.elems[:0]
	if cap(s.elems) > keepElems {
		s.elems = nil
	}
	s.slab = resetSlab(s.slab)
	s.strs = resetSlab(s.strs)
	s.nums = resetSlab(s.nums)
	clear(s.pending)
	s.pending = s.pending[:0]
	if cap(s.pending) > keepElems {
		s.pending = nil
	}
	s.text = s.text[:0]
	if cap(s.text) > keepBuf {
		s.text = nil
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

// resetSlab empties slab, dropping it when it has grown past keepElems.
func resetSlab[T any](slab []T) []T {
	if cap(slab) > keepElems {
		return nil
	}
	clear(slab)
	return slab[:0]
}

// slabSize is the number of values a slab of a scanner holds at first.
const slabSize = 64

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

// value builds the value at i for the paths under n (not nil). depth is
// the nesting of the enclosing object or array.
func (s *scanner) value(n *pathNode, depth, i int) (any, int) {
	b := s.b
	if i >= len(b) {
		return nil, -1
	}
	switch c := b[i]; c {
	case '{':
		if len(n.names) == 0 {
			return emptyObject, skipObject(b, depth+1, i)
		}
		return s.object(n, depth+1, i)
	case '[':
		return s.array(n, depth+1, i)
	case '"':
		end, escaped := str(b, i)
		if end < 0 {
			return nil, -1
		}
		if escaped {
			s.text = unescape(s.text, b[i+1:end-1])
		} else {
			s.text = append(s.text, b[i+1:end-1]...)
		}
		if len(s.strs) == cap(s.strs) {
			s.strs = make([]string, 0, slabSize)
		}
		s.strs = s.strs[:len(s.strs)+1]
		p := &s.strs[len(s.strs)-1]
		s.pending = append(s.pending, pending{str: p, end: len(s.text)})
		return p, end
	case 't':
		return true, word(b, i, "true")
	case 'f':
		return false, word(b, i, "false")
	case 'n':
		return nil, word(b, i, "null")
	default:
		end := number(b, i)
		if end < 0 {
			return nil, -1
		}
		s.text = append(s.text, b[i:end]...)
		if len(s.nums) == cap(s.nums) {
			s.nums = make([]json.Number, 0, slabSize)
		}
		s.nums = s.nums[:len(s.nums)+1]
		p := &s.nums[len(s.nums)-1]
		s.pending = append(s.pending, pending{num: p, end: len(s.text)})
		return p, end
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
		if c == nil {
			if i = skip(b, depth, i); i < 0 {
				return nil, -1
			}
		} else {
			var v any
			if v, i = s.value(c, depth, i); i < 0 {
				return nil, -1
			}
			obj[name] = v // a later duplicate replaces it, as in DecodeEvent
		}
		var more bool
		if i, more = next(b, i, '}'); !more {
			if i < 0 {
				return nil, -1
			}
			return obj, i
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
		k := len(s.elems) - base
		if cap(s.slab)-len(s.slab) < k {
			s.slab = make([]any, 0, max(slabSize, k))
		}
		arr := s.slab[len(s.slab) : len(s.slab)+k : len(s.slab)+k]
		s.slab = s.slab[:len(s.slab)+k]
		copy(arr, s.elems[base:])
		clear(s.elems[base:])
		s.elems = s.elems[:base]
		return arr, i + 1
	}
}

// skip validates the value at i. depth is the nesting of the enclosing
// object or array.
func skip(b []byte, depth, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '{':
		return skipObject(b, depth+1, i)
	case '[':
		return skipArray(b, depth+1, i)
	case '"':
		end, _ := str(b, i)
		return end
	case 't':
		return word(b, i, "true")
	case 'f':
		return word(b, i, "false")
	case 'n':
		return word(b, i, "null")
	}
	return number(b, i)
}

// skipObject validates the object at i, which starts with '{'.
func skipObject(b []byte, depth, i int) int {
	if depth > MaxEventDepth {
		return -1
	}
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
		if i = skip(b, depth, i); i < 0 {
			return -1
		}
		var more bool
		if i, more = next(b, i, '}'); !more {
			return i
		}
	}
}

// next reads what follows a member of an object or an element of an
// array at i: a ',' and the space after it (more is true, i is the next
// member), or the closing end (i is just past it). -1 when neither.
func next(b []byte, i int, end byte) (_ int, more bool) {
	i = space(b, i)
	switch {
	case i >= len(b):
		return -1, false
	case b[i] == ',':
		return space(b, i+1), true
	case b[i] == end:
		return i + 1, false
	}
	return -1, false
}

// skipArray validates the array at i, which starts with '['.
func skipArray(b []byte, depth, i int) int {
	if depth > MaxEventDepth {
		return -1
	}
	i = space(b, i+1)
	if i < len(b) && b[i] == ']' {
		return i + 1
	}
	for {
		if i = skip(b, depth, i); i < 0 {
			return -1
		}
		var more bool
		if i, more = next(b, i, ']'); !more {
			return i
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
