package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/relaydev/relay/internal/textsafe"
)

// table writes aligned text columns.
func table(w io.Writer, header []string, rows [][]string) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	cells := make([]string, 0, len(header))
	for _, c := range header {
		// relay app inspect's header holds the app's name.
		cells = append(cells, textsafe.Escape(c, false))
	}
	fmt.Fprintln(tw, strings.Join(cells, "\t"))
	for _, r := range rows {
		cells = cells[:0]
		for _, c := range r {
			cells = append(cells, textsafe.Escape(c, false))
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// oneLine shortens s to one line of at most n runes for a table cell.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > n {
		return string(r[:n-1]) + "…"
	}
	return s
}
