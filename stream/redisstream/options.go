package redisstream

import (
	"fmt"
	"log/slog"
	"time"
)

const (
	// DefaultBlock is how long Read waits in XREADGROUP BLOCK for new
	// entries before it returns (nil, nil), so the caller's loop sees its
	// context at least this often
	// (docs/delivery.md#from-entry-to-acknowledgement: at most 2 s per call).
	DefaultBlock = 2 * time.Second
	// DefaultReclaimCount is the XAUTOCLAIM COUNT of one call in Reclaim.
	DefaultReclaimCount = 100
)

// maxReclaimCalls bounds the XAUTOCLAIM calls of one Reclaim. A pass that
// reaches it stops and the next Reclaim continues from the cursor it left.
const maxReclaimCalls = 100

// Option configures a Source.
type Option func(*options) error

type options struct {
	block        time.Duration
	reclaimCount int64
	trimLimit    int64
	logger       *slog.Logger
}

// WithLogger sets where Read reports that it recreated a missing consumer
// group, which redelivers every entry still in the stream (a WARN record).
// Default: slog.Default().
func WithLogger(l *slog.Logger) Option {
	return func(o *options) error {
		if l == nil {
			return fmt.Errorf("WithLogger: nil logger")
		}
		o.logger = l
		return nil
	}
}

// WithBlock sets the longest time Read blocks waiting for new entries.
// d must be at least one millisecond and should be a few seconds at most.
// Default: DefaultBlock.
func WithBlock(d time.Duration) Option {
	return func(o *options) error {
		if d < time.Millisecond {
			return fmt.Errorf("WithBlock: must be >= 1ms, got %s", d)
		}
		o.block = d
		return nil
	}
}

// WithReclaimCount sets the XAUTOCLAIM COUNT of each call Reclaim makes
// (Redis scans at most ten times as many PEL entries per call). n must be
// > 0. Default: DefaultReclaimCount.
func WithReclaimCount(n int) Option {
	return func(o *options) error {
		if n <= 0 {
			return fmt.Errorf("WithReclaimCount: must be > 0, got %d", n)
		}
		o.reclaimCount = int64(n)
		return nil
	}
}

// WithTrimLimit sets the most entries one Trim removes as whole stream
// nodes; a Trim that may have reached it skips the exact step and reports
// stream.TrimResult.More. The exact step trusts that a node pass removing at most
// n/2 entries stopped at the node holding the bound, so n must stay far
// above the entries of one stream node (Redis' stream-node-max-entries,
// 100 by default): n must be >= 1000. Default: DefaultTrimLimit.
func WithTrimLimit(n int) Option {
	return func(o *options) error {
		if n < 1000 {
			return fmt.Errorf("WithTrimLimit: must be >= 1000, got %d", n)
		}
		o.trimLimit = int64(n)
		return nil
	}
}
