package producer_test

import (
	"context"
	"fmt"

	"github.com/redis/rueidis"

	"github.com/relaydev/relay/producer"
)

// An orders service publishes an event for Relay's workers; the id is the
// new stream entry's.
func ExampleProducer_Publish() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"localhost:6379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	p, err := producer.New(producer.Redis(client, "events"))
	if err != nil {
		fmt.Println(err)
		return
	}
	type order struct {
		Type    string `json:"type"`
		OrderID int    `json:"order_id"`
		Amount  int    `json:"amount"`
	}
	id, err := p.Publish(context.Background(), order{Type: "orders.placed", OrderID: 7, Amount: 42})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("published", id)
}

// A payment service publishes "charge requested" once per order, however
// often its own request is retried: the idempotency key names the order,
// and a retry within the window (24h) gets the first entry's id back.
func ExampleProducer_PublishOnce() {
	client, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{"localhost:6379"}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer client.Close()
	p, err := producer.New(producer.Redis(client, "{payments}"))
	if err != nil {
		fmt.Println(err)
		return
	}
	type charge struct {
		Type    string `json:"type"`
		OrderID int    `json:"order_id"`
	}
	id, first, err := p.PublishOnce(context.Background(), "charge:order-7", charge{Type: "payments.charge", OrderID: 7})
	if err != nil {
		fmt.Println(err) // safe to retry with the same key
		return
	}
	if !first {
		fmt.Println("already published as", id)
		return
	}
	fmt.Println("published", id)
}
