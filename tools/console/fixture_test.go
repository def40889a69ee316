package console_test

import (
	"testing"

	"github.com/relaydev/relay/internal/redistest"
)

// The browser tests of package console are in the tools module, so that
// chromedp stays out of the library's go.mod. They cannot use the helpers
// of console's own tests, which are _test.go files: the fixture they share
// with them is internal/consoletest.

func TestMain(m *testing.M) { redistest.Main(m) }
