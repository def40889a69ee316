package stream_test

import (
	"github.com/relaydev/relay"
	"github.com/relaydev/relay/stream"
)

var (
	_ relay.StreamSource    = (*stream.Source)(nil)
	_ relay.GroupEnsurer    = (*stream.Source)(nil)
	_ relay.PendingReporter = (*stream.Source)(nil)
	_ relay.Pinger          = (*stream.Source)(nil)
)
