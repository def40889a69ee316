package benchkit

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Table collects rows and prints them aligned, under a title line.
type Table struct {
	Title  string
	Header []string
	rows   [][]string
}

// Add appends a row; cells are formatted with %v.
func (t *Table) Add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		row[i] = fmt.Sprint(c)
	}
	t.rows = append(t.rows, row)
}

// Print writes the title, the header and the rows to w.
func (t *Table) Print(w io.Writer) error {
	if t.Title != "" {
		if _, err := fmt.Fprintf(w, "\n== %s ==\n", t.Title); err != nil {
			return err
		}
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, strings.Join(t.Header, "\t"))
	for _, r := range t.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t"))
	}
	return tw.Flush()
}
