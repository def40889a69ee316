package plural

import "testing"

func TestOf(t *testing.T) {
	for _, c := range []struct {
		n    int
		noun string
		want string
	}{
		{1, "attempt", "1 attempt"},
		{0, "attempt", "0 attempts"},
		{2, "entry", "2 entries"},
		{1, "entry", "1 entry"},
		{3, "key", "3 keys"},
		{4, "day", "4 days"},
		{5, "template error", "5 template errors"},
		{-1, "y", "-1 ys"},
	} {
		if got := Of(c.n, c.noun); got != c.want {
			t.Errorf("Of(%d, %q) = %q, want %q", c.n, c.noun, got, c.want)
		}
	}
}
