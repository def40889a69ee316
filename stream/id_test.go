package stream

import "testing"

func TestCompareID(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"0-0", "1-0", -1},
		{"9-0", "10-0", -1}, // numeric, not lexicographic
		{"10-2", "10-10", -1},
		{"1700000000000-5", "1700000000000-5", 0},
		{"2-0", "1-99", 1},
		{"bad", "0-0", -1},
		{"0-0", "bad", 1},
	} {
		if got := CompareID(c.a, c.b); got != c.want {
			t.Errorf("CompareID(%q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
	if _, _, err := ParseID("12"); err == nil {
		t.Error("ParseID accepted an id without a sequence")
	}
}

func TestIsID(t *testing.T) {
	for id, want := range map[string]bool{"1-0": true, "1700000000000-12": true, "": false, "1": false, "1-": false, "-1": false, "a-1": false, "1-0-0": false, "*": false} {
		if got := IsID(id); got != want {
			t.Errorf("IsID(%q) = %v, want %v", id, got, want)
		}
	}
}
