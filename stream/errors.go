package stream

import "errors"

var (
	// ErrNoGroup reports that the consumer group (or the stream that holds
	// it) does not exist. Redis calls this NOGROUP.
	ErrNoGroup = errors.New("stream: consumer group does not exist")
	// ErrNoStream reports that the stream key does not exist.
	ErrNoStream = errors.New("stream: stream does not exist")
)
