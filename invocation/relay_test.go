package invocation_test

import (
	"github.com/relaydev/relay"
	"github.com/relaydev/relay/invocation"
)

var (
	_ relay.StateStore  = (*invocation.Store)(nil)
	_ relay.ClaimVoider = (*invocation.Store)(nil)
)
