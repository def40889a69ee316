package testutil

import (
	"strconv"
	"strings"
)

// LogLevels returns the level (DEBUG, INFO, WARN, ERROR) of each line of
// logs, in slog's text format, whose message is msg, in order.
func LogLevels(logs, msg string) []string {
	var out []string
	for line := range strings.Lines(logs) {
		if !hasMsg(line, msg) {
			continue
		}
		_, rest, _ := strings.Cut(line, " level=")
		level, _, _ := strings.Cut(rest, " ")
		out = append(out, level)
	}
	return out
}

// LogLine returns the first line of logs, in slog's text format, at level
// whose message is msg, or "".
func LogLine(logs, level, msg string) string {
	for line := range strings.Lines(logs) {
		if strings.Contains(line, " level="+level+" ") && hasMsg(line, msg) {
			return line
		}
	}
	return ""
}

// hasMsg reports whether line, in slog's text format, has message msg,
// quoted or not.
func hasMsg(line, msg string) bool {
	return strings.Contains(line, " msg="+strconv.Quote(msg)+" ") || strings.Contains(line, " msg="+strconv.Quote(msg)+"\n") ||
		strings.Contains(line, " msg="+msg+" ") || strings.HasSuffix(line, " msg="+msg+"\n")
}
