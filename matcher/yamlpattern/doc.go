// Package yamlpattern reads event patterns written in YAML: the pattern:
// value of a rule in template.yaml (docs/apps.md#patterns), or pattern text
// such as a program that embeds the engine writes
// (docs/embedding.md#worker). It turns the YAML into the syntax tree of
// package matcher (matcher.Node) and leaves the language itself, what is
// accepted and every error message, to matcher.ParseTree.
//
// The YAML reader (github.com/goccy/go-yaml) is imported here rather than
// in matcher, so that a program that imports the root package or matcher
// but reads no YAML does not link it.
//
// Parse reads pattern text; ParseNode reads the node of a pattern inside a
// larger YAML file, so errors carry that file's line and column; NodePos is
// the position convention both use, which the template loader shares.
package yamlpattern
