// Package template loads apps from an apps root: every direct child
// directory holding template.yaml is an app named after the directory
// (docs/apps.md).
//
// A template is read by walking go-yaml's syntax tree rather than by
// decoding into structs, so that every error names file:line:column and
// unknown keys are refused instead of silently ignored. An invalid template
// never fails a load: its app comes back unavailable, carrying its
// position-sorted errors, and the other apps load normally; rules whose own
// pattern parsed still take part in matching, so their messages stay
// pending rather than pass as unmatched. Hostile input is bounded: files
// over 1 MiB, deep nesting, YAML aliases and merge keys, special files and
// symbolic links that leave the app directory are refused with a position.
//
// The package reads files only; it starts no goroutines and keeps no state.
package template
