package yamlpattern

import (
	"fmt"
	"io"
	"strings"

	"github.com/goccy/go-yaml/scanner"
	"github.com/goccy/go-yaml/token"
)

// Limits of the YAML that Parse and the template loader give the parser
// (docs/apps.md#templateyaml): it takes about 500 bytes of memory per
// token, and memory that grows with the square of the nesting.
const (
	// MaxTokens bounds the tokens, as counted by CheckBounds.
	MaxTokens = 100_000
	// MaxFlowDepth bounds the nesting of [ and {.
	MaxFlowDepth = 64
	// MaxIndent bounds the column of a block collection's "-" or "?".
	MaxIndent = 256
)

// CheckBounds reports where src goes beyond MaxTokens, MaxFlowDepth or
// MaxIndent, as the YAML scanner reads it: an apostrophe in a plain scalar
// (it's) starts no quote, and compact block sequences (- - - x) nest on
// one line. It first bounds the number of tokens without allocating, so
// that the scanner itself holds a bounded number of them. msg says what is
// wrong with src ("nests [ and { more than 64 deep"), or is empty when src
// is within the limits; a syntax error is left to the parser.
func CheckBounds(src []byte) (line, col int, msg string) {
	if n := tokenBound(src); n > MaxTokens {
		return 1, 1, fmt.Sprintf("has more than %d YAML tokens (counting every bracket, comma, colon, dash, other indicator and word)", MaxTokens)
	}
	var s scanner.Scanner
	s.Init(strings.TrimPrefix(string(src), "\xef\xbb\xbf"))
	depth := 0
	// The parser's lexer scans on after an error until the end, so this
	// does too; each scan reads at least one character.
	for range len(src) + 1 {
		toks, err := s.Scan()
		for _, tk := range toks {
			switch tk.Type {
			case token.SequenceStartType, token.MappingStartType:
				if depth++; depth > MaxFlowDepth {
					return tk.Position.Line, tk.Position.Column, fmt.Sprintf("nests [ and { more than %d deep", MaxFlowDepth)
				}
			case token.SequenceEndType, token.MappingEndType:
				depth = max(depth-1, 0)
			case token.SequenceEntryType, token.MappingKeyType:
				// A block collection nests inside another on the same
				// line only after the other's "-" or "?".
				if depth == 0 && tk.Position.Column > MaxIndent {
					return tk.Position.Line, tk.Position.Column, fmt.Sprintf("is indented more than %d columns", MaxIndent)
				}
			}
		}
		if err == io.EOF {
			break
		}
	}
	return 0, 0, ""
}

// tokenBound returns at least the number of tokens the YAML scanner reads in
// src, without allocating: it counts every indicator that can be a token of
// its own or start one (an anchor, an alias and a tag are two tokens) and
// every other character that follows one or a space.
func tokenBound(src []byte) int {
	n := 0
	prev := byte('\n')
	for _, c := range src {
		switch {
		case isIndicator(c):
			n++
		case isBlank(c):
		case isBlank(prev) || isIndicator(prev):
			n++
		}
		prev = c
	}
	return n
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func isIndicator(c byte) bool { return strings.IndexByte("[]{},:?-&*!|>", c) >= 0 }
