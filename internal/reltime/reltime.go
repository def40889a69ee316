// Package reltime renders durations the way Relay's tables and pages show
// how long ago something happened or how soon it will: "45s", "12m", "3h",
// "2d". The CLI and the console share it, so that one entry reads the same
// in both.
package reltime

import (
	"fmt"
	"time"
)

// Age renders d, truncated to its largest unit: whole seconds under a
// minute, minutes under an hour, hours under two days, days beyond. A
// negative d renders as a negative count of seconds; callers that cannot
// mean one (a clock skew) clamp it first.
func Age(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}
