package producer_test

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/internal/redistest"
	"github.com/relaydev/relay/producer"
	"github.com/relaydev/relay/relaytest"
	"github.com/relaydev/relay/stream/redisstream"
)

var (
	_ producer.BatchStream = (*producer.RedisStream)(nil)
	_ producer.Stream      = (*relaytest.Stream)(nil)
	_ producer.Stream      = (*relaytest.Consumer)(nil)
	_ producer.Stream      = (*redisstream.Source)(nil)
)

// placeOrders is a service's own publishing code: it knows a Producer,
// not where the Producer writes.
func placeOrders(ctx context.Context, p *producer.Producer) error {
	type order struct {
		Type  string `json:"type"`
		Total int    `json:"total"`
	}
	if _, err := p.Publish(ctx, order{"orders.placed", 42}); err != nil {
		return err
	}
	if _, err := p.PublishJSON(ctx, []byte(`{"type":"orders.charge","total":1200}`)); err != nil {
		return err
	}
	_, err := p.PublishBatch(ctx, [][]byte{[]byte(`{"type":"a"}`), []byte(`{"type":"b"}`)})
	return err
}

// TestSamePublishCodeOnFakeAndRedis: the same publishing code, given a
// Producer on a relaytest.Stream or on a Redis stream, writes the same
// entries, trace context included (docs/producing.md#go).
func TestSamePublishCodeOnFakeAndRedis(t *testing.T) {
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ctx := traceCtx(t, tp)

	fake := relaytest.NewStream()
	onFake, err := producer.New(fake)
	if err != nil {
		t.Fatal(err)
	}
	if err := placeOrders(ctx, onFake); err != nil {
		t.Fatalf("on the fake: %v", err)
	}
	msgs, err := fake.Consumer("test").Read(t.Context(), 10)
	if err != nil {
		t.Fatal(err)
	}
	var fromFake []map[string]string
	for _, m := range msgs {
		fromFake = append(fromFake, m.Fields)
	}

	c := redistest.Client(t)
	name := redistest.Name(t, "orders")
	onRedis, err := producer.New(producer.Redis(c, name))
	if err != nil {
		t.Fatal(err)
	}
	if err := placeOrders(ctx, onRedis); err != nil {
		t.Fatalf("on Redis: %v", err)
	}
	var fromRedis []map[string]string
	for _, e := range entries(t, c, name) {
		fromRedis = append(fromRedis, e.FieldValues)
	}

	if len(fromFake) != 4 || fromFake[0]["traceparent"] != tp {
		t.Fatalf("on the fake: %v, want 4 entries carrying traceparent %s", fromFake, tp)
	}
	if diff := cmp.Diff(fromRedis, fromFake); diff != "" {
		t.Errorf("entries on the fake differ from those on Redis (-redis +fake):\n%s", diff)
	}
}

// failingStream fails its second Publish.
type failingStream struct{ n int }

func (f *failingStream) Publish(context.Context, map[string]string) (string, error) {
	if f.n++; f.n == 2 {
		return "", errors.New("stream down")
	}
	return "1-0", nil
}

// TestPublishBatchWithoutBatchStream: a Stream without PublishBatch gets
// one Publish per event, and an error returns the ids written before it.
func TestPublishBatchWithoutBatchStream(t *testing.T) {
	p, err := producer.New(&failingStream{})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := p.PublishBatch(t.Context(), [][]byte{[]byte(`{}`), []byte(`{}`), []byte(`{}`)})
	if err == nil || err.Error() != "producer: stream down" || len(ids) != 1 {
		t.Errorf("PublishBatch = %v, %v; want the first id and the second Publish's error", ids, err)
	}
}
