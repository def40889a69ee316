package relay

import (
	"context"
)

// isOccurrence reports whether a stream entry's event is a schedule
// occurrence envelope.
func isOccurrence(event string) bool { return false }

// occurrence dispatches one schedule occurrence to its schedule's handler.
func (e *Engine) occurrence(ctx, runCtx context.Context, d *delivery) {}
