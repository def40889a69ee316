package app

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseSize parses a size written as a positive whole number with a unit,
// "<n>KiB", "<n>MiB" or "<n>GiB", into bytes: the form of resources.memory
// and resources.tmp in a template and of MAX_EVENT_BYTES. what names the
// setting in errors.
func ParseSize(what, s string) (int64, error) {
	units := []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}}
	for _, u := range units {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			v, err := strconv.ParseInt(num, 10, 64)
			if err != nil || v <= 0 {
				break
			}
			if v > math.MaxInt64/u.mult {
				return 0, fmt.Errorf("%s %q is too large", what, s)
			}
			return v * u.mult, nil
		}
	}
	return 0, fmt.Errorf("%s %q must be a positive whole number with a unit KiB, MiB or GiB, such as 256MiB", what, s)
}
