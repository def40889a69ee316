// Package plural counts things in the messages Relay prints: "1 entry",
// "3 entries".
package plural

import "strconv"

// Of returns n and noun, an English singular noun, as "1 attempt" or "2
// attempts". A noun that ends in a consonant and y takes "ies" ("entry",
// "entries"); every other noun takes "s".
func Of(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + Noun(noun)
}

// Noun returns the plural of noun by the rule of Of.
func Noun(noun string) string {
	if l := len(noun); l >= 2 && noun[l-1] == 'y' && !isVowel(noun[l-2]) {
		return noun[:l-1] + "ies"
	}
	return noun + "s"
}

func isVowel(c byte) bool {
	switch c {
	case 'a', 'e', 'i', 'o', 'u':
		return true
	}
	return false
}
