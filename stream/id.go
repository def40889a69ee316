package stream

import (
	"cmp"
	"fmt"
	"strconv"
	"strings"
)

// ParseID splits a stream entry id "<ms>-<seq>" into its parts.
func ParseID(id string) (ms, seq uint64, err error) {
	a, b, ok := strings.Cut(id, "-")
	if !ok {
		return 0, 0, fmt.Errorf("stream: bad entry id %q: want <ms>-<seq>", id)
	}
	if ms, err = strconv.ParseUint(a, 10, 64); err == nil {
		seq, err = strconv.ParseUint(b, 10, 64)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("stream: bad entry id %q: want <ms>-<seq>", id)
	}
	return ms, seq, nil
}

// IsID reports whether id is a full stream entry id "<ms>-<seq>", the
// form XPENDING, XRANGE and XDEL accept as an exact id.
func IsID(id string) bool {
	_, _, err := ParseID(id)
	return err == nil
}

// CompareID orders two valid stream entry ids as Redis does: -1 if a is
// older than b, 0 if equal, +1 if newer. An invalid id sorts first.
func CompareID(a, b string) int {
	am, as, aerr := ParseID(a)
	bm, bs, berr := ParseID(b)
	switch {
	case aerr != nil || berr != nil:
		return cmp.Compare(boolInt(aerr == nil), boolInt(berr == nil))
	case am != bm:
		return cmp.Compare(am, bm)
	}
	return cmp.Compare(as, bs)
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}
