package matcher

import "strconv"

// decimal is an exact decimal number, kept as its significant digits so that
// 35, 35.0 and 3.5e1 are equal and 9007199254740993 differs from
// 9007199254740992, which float64 cannot tell apart.
//
// The digits are hi followed by lo (the integer and fraction digits of the
// source text, so parsing does not allocate), with leading zeros removed
// from the front and trailing zeros from the back of the concatenation. The
// value is 0.d1d2d3... × 10^exp. Zero has no digits and is never negative.
type decimal struct {
	neg    bool
	hi, lo string
	exp    int64
}

// maxExp bounds decimal exponents. Numbers beyond it are kept at the bound:
// nothing in an event or a pattern is that large or that small in practice,
// and the bound keeps the arithmetic free of overflow.
const maxExp = 1 << 50

// parseDecimal parses a JSON number. With yamlForms it also accepts the
// forms a YAML 1.2 float may take on top of JSON's: a leading "+", leading
// zeros are still refused (YAML 1.1 reads them as octal), but ".5" and "5."
// are accepted.
func parseDecimal(s string, yamlForms bool) (decimal, bool) {
	neg, intPart, frac, i, ok := parseMantissa(s, yamlForms)
	if !ok {
		return decimal{}, false
	}
	e10, ok := parseExponent(s, i)
	if !ok {
		return decimal{}, false
	}
	d := normalise(intPart, frac, e10)
	d.neg = neg
	if d.ndigits() == 0 {
		return decimal{}, true
	}
	return d, true
}

// parseMantissa reads the sign, integer part and fraction of a number
// (parseDecimal's forms) and returns them with the index after them.
func parseMantissa(s string, yamlForms bool) (neg bool, intPart, frac string, i int, ok bool) {
	if i < len(s) && (s[i] == '-' || (yamlForms && s[i] == '+')) {
		neg = s[i] == '-'
		i++
	}
	start := i
	for i < len(s) && isDigit(s[i]) {
		i++
	}
	intPart = s[start:i]
	if len(intPart) > 1 && intPart[0] == '0' {
		return false, "", "", 0, false // leading zeros: not JSON, and octal in YAML 1.1
	}
	if i < len(s) && s[i] == '.' {
		i++
		start = i
		for i < len(s) && isDigit(s[i]) {
			i++
		}
		frac = s[start:i]
		if frac == "" && !yamlForms {
			return false, "", "", 0, false
		}
	}
	if intPart == "" && (frac == "" || !yamlForms) {
		return false, "", "", 0, false
	}
	return neg, intPart, frac, i, true
}

// parseExponent reads the optional exponent s[i:] ("e-7"), which must end
// s, bounded to maxExp.
func parseExponent(s string, i int) (int64, bool) {
	if i == len(s) {
		return 0, true
	}
	if s[i] != 'e' && s[i] != 'E' {
		return 0, false
	}
	i++
	eneg := false
	if i < len(s) && (s[i] == '+' || s[i] == '-') {
		eneg = s[i] == '-'
		i++
	}
	if i == len(s) {
		return 0, false
	}
	var e10 int64
	for ; i < len(s); i++ {
		if !isDigit(s[i]) {
			return 0, false
		}
		if e10 < maxExp {
			e10 = e10*10 + int64(s[i]-'0')
		}
	}
	e10 = min(e10, maxExp)
	if eneg {
		e10 = -e10
	}
	return e10, true
}

// normalise returns the decimal intPart.frac × 10^e10 without leading or
// trailing zeros, its exponent bounded; the sign is the caller's.
func normalise(intPart, frac string, e10 int64) decimal {
	var d decimal
	for intPart != "" && intPart[0] == '0' {
		intPart = intPart[1:]
	}
	if intPart == "" {
		n := 0
		for n < len(frac) && frac[n] == '0' {
			n++
		}
		frac = frac[n:]
		d.exp = e10 - int64(n)
	} else {
		d.exp = e10 + int64(len(intPart))
	}
	for frac != "" && frac[len(frac)-1] == '0' {
		frac = frac[:len(frac)-1]
	}
	if frac == "" {
		for intPart != "" && intPart[len(intPart)-1] == '0' {
			intPart = intPart[:len(intPart)-1]
		}
	}
	d.hi, d.lo = intPart, frac
	// Bound the value's exponent, not only the literal's: String writes
	// d.ddd e(exp-1), whose literal must be within maxExp for the canonical
	// form to parse back to itself.
	d.exp = min(max(d.exp, 1-maxExp), maxExp+1)
	return d
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (d decimal) ndigits() int { return len(d.hi) + len(d.lo) }

func (d decimal) digit(i int) byte {
	if i < len(d.hi) {
		return d.hi[i]
	}
	return d.lo[i-len(d.hi)]
}

// cmp compares d and e exactly and returns -1, 0 or +1.
func (d decimal) cmp(e decimal) int {
	dz, ez := d.ndigits() == 0, e.ndigits() == 0
	switch {
	case dz && ez:
		return 0
	case dz:
		if e.neg {
			return 1
		}
		return -1
	case ez:
		if d.neg {
			return -1
		}
		return 1
	case d.neg != e.neg:
		if d.neg {
			return -1
		}
		return 1
	}
	c := d.cmpAbs(e)
	if d.neg {
		return -c
	}
	return c
}

// cmpAbs compares the magnitudes of two non-zero decimals.
func (d decimal) cmpAbs(e decimal) int {
	if d.exp != e.exp {
		if d.exp < e.exp {
			return -1
		}
		return 1
	}
	n, m := d.ndigits(), e.ndigits()
	for i := range min(n, m) {
		a, b := d.digit(i), e.digit(i)
		if a != b {
			if a < b {
				return -1
			}
			return 1
		}
	}
	// Equal up to the shorter one; the longer one has more non-zero digits.
	switch {
	case n < m:
		return -1
	case n > m:
		return 1
	}
	return 0
}

// String formats d in canonical JSON form: an integer when it has no
// fraction and a modest exponent, else d.ddde±x.
func (d decimal) String() string {
	n := d.ndigits()
	if n == 0 {
		return "0"
	}
	var b []byte
	if d.neg {
		b = append(b, '-')
	}
	digits := make([]byte, 0, n)
	for i := range n {
		digits = append(digits, d.digit(i))
	}
	switch {
	case d.exp >= int64(n) && d.exp <= 21:
		// Integer: digits then zeros.
		b = append(b, digits...)
		for range d.exp - int64(n) {
			b = append(b, '0')
		}
	case d.exp > 0 && d.exp < int64(n):
		b = append(b, digits[:d.exp]...)
		b = append(b, '.')
		b = append(b, digits[d.exp:]...)
	case d.exp <= 0 && d.exp > -6:
		b = append(b, '0', '.')
		for range -d.exp {
			b = append(b, '0')
		}
		b = append(b, digits...)
	default:
		b = append(b, digits[0])
		if n > 1 {
			b = append(b, '.')
			b = append(b, digits[1:]...)
		}
		b = append(b, 'e')
		b = strconv.AppendInt(b, d.exp-1, 10)
	}
	return string(b)
}
