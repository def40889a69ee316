package benchkit

import (
	"slices"
	"testing"
)

func TestAckedIDsFindsEntryIDsInKeysAndArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"XACK", "s", "g", "1733000000000-0", "1733000000001-12"}, []string{"1733000000000-0", "1733000000001-12"}},
		{[]string{"EVALSHA", "abc", "2", "relay:invocation:s:g:1733000000000-3", "relay:{s}", "7", "1733000000000-4"}, []string{"1733000000000-3", "1733000000000-4"}},
		// Not ids: a digit run with no '-', a range of three parts, a negative number.
		{[]string{"EVALSHA", "abc", "0", "12", "1-2-3", "-5", "x1-"}, nil},
		{[]string{"XREADGROUP", "GROUP", "g", "c", "STREAMS", "s", "1733000000000-0"}, nil},
		{[]string{"HSET", "relay:invocation:s:g:1-1", "a", "b"}, nil},
	} {
		if got := ackedIDs(tc.args); !slices.Equal(got, tc.want) {
			t.Errorf("ackedIDs(%q) = %q, want %q", tc.args, got, tc.want)
		}
	}
}
