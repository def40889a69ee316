package containerd_test

import (
	"context"
	"io"
	"testing"

	"github.com/relaydev/relay/internal/containerdtest"
	"github.com/relaydev/relay/runtime/containerd"
)

// BenchmarkRun measures one complete busybox invocation: create container
// and snapshot, start, feed stdin, wait, delete everything.
func BenchmarkRun(b *testing.B) {
	f := newFixture(b)
	r, err := containerd.New(f.client,
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("bench"),
		containerd.WithOutput(io.Discard, io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	req := f.request("events.created")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := r.Run(b.Context(), req); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	// Its prepared containers go at Close.
	if err := r.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	containerdtest.AssertClean(b, f.client)
}

// BenchmarkRunParallel runs invocations from several goroutines at once,
// as the Engine does up to its concurrency limit.
func BenchmarkRunParallel(b *testing.B) {
	f := newFixture(b)
	r, err := containerd.New(f.client,
		containerd.WithExecHelper(testExecHelper),
		containerd.WithNamespace(f.client.DefaultNamespace()),
		containerd.WithHostID("bench"),
		containerd.WithOutput(io.Discard, io.Discard))
	if err != nil {
		b.Fatal(err)
	}
	req := f.request("events.created")
	b.SetParallelism(2) // 2 × GOMAXPROCS goroutines
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := r.Run(b.Context(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	// Its prepared containers go at Close.
	if err := r.Close(context.Background()); err != nil {
		b.Fatal(err)
	}
	containerdtest.AssertClean(b, f.client)
}

// BenchmarkPreparePresentImage measures Prepare of an app whose image is
// present and that has no dependencies or secrets, what a worker does for
// each such app at start and when a reload finds it new or changed.
func BenchmarkPreparePresentImage(b *testing.B) {
	f := newFixture(b) // pulling off: an absent image would fail
	spec := f.request("events.created").Spec
	b.ReportAllocs()
	for b.Loop() {
		if err := f.runner.Prepare(b.Context(), "users", spec); err != nil {
			b.Fatal(err)
		}
	}
}
