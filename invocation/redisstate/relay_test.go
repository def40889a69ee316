package redisstate_test

import (
	"github.com/relaydev/relay"
	"github.com/relaydev/relay/invocation/redisstate"
)

var (
	_ relay.StateStore  = (*redisstate.Store)(nil)
	_ relay.ClaimVoider = (*redisstate.Store)(nil)
)
