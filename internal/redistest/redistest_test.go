package redistest

import (
	"context"
	"testing"
)

func TestMain(m *testing.M) { Main(m) }

func TestSharedAndPrivate(t *testing.T) {
	ctx := context.Background()
	c := Client(t)
	k := Name(t, "k")
	if err := c.Do(ctx, c.B().Set().Key(k).Value("v").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s := Start(t, Options{AppendOnly: true})
	pc := Connect(t, s.Addr)
	if err := pc.Do(ctx, pc.B().Set().Key(k).Value("kept").Build()).Error(); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	s.Restart(t)
	got, err := pc.Do(ctx, pc.B().Get().Key(k).Build()).ToString()
	if err != nil || got != "kept" {
		t.Fatalf("after restart got %q, %v; want kept", got, err)
	}
}
