package redisstream_test

import (
	"github.com/relaydev/relay"
	"github.com/relaydev/relay/stream/redisstream"
)

var (
	_ relay.StreamSource    = (*redisstream.Source)(nil)
	_ relay.GroupEnsurer    = (*redisstream.Source)(nil)
	_ relay.PendingReporter = (*redisstream.Source)(nil)
	_ relay.Pinger          = (*redisstream.Source)(nil)
)
