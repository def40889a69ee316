package manual_test

import (
	"context"
	"testing"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/runtime"
)

func TestMain(m *testing.M) { redistest.Main(m) }

type runnerFunc func(context.Context, runtime.Request) (runtime.Result, error)

func (f runnerFunc) Run(ctx context.Context, req runtime.Request) (runtime.Result, error) {
	return f(ctx, req)
}
