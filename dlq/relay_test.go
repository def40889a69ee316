package dlq_test

import (
	"github.com/relaydev/relay"
	"github.com/relaydev/relay/dlq"
)

var (
	_ relay.DLQWriter = (*dlq.Writer)(nil)
	_ relay.DLQWriter = (*dlq.Store)(nil)
)
