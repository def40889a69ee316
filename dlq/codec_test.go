package dlq_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/dlq"
	"github.com/relaydev/relay/dlq/internal/dlqfixture"
)

func TestEncode(t *testing.T) {
	want := map[string]string{
		"original_stream":  "events",
		"original_id":      "1700000000000-3",
		"group":            "relay",
		"consumer":         "worker-1",
		"event":            `{"event_name":"INSERT","table_name":"users"}`,
		"reason":           "exit code 3",
		"app":              "billing",
		"handler":          "events.created.handler",
		"deliveries":       "7",
		"handler_attempts": "5",
		"timestamp":        "2026-03-04T05:06:07.089Z",
		"trace":            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
	}
	if diff := cmp.Diff(want, dlq.Encode(dlqfixture.Full())); diff != "" {
		t.Errorf("Encode (-want +got):\n%s", diff)
	}

	// A non-UTC timestamp is written in UTC; an empty trace is omitted.
	e := dlqfixture.Malformed()
	e.Timestamp = dlqfixture.Timestamp.In(time.FixedZone("CET", 3600))
	got := dlq.Encode(e)
	if got["timestamp"] != "2026-03-04T05:06:07.089Z" {
		t.Errorf("timestamp = %q", got["timestamp"])
	}
	if _, ok := got["trace"]; ok {
		t.Errorf("empty trace encoded: %v", got)
	}
	if got["app"] != "-" || got["handler"] != "-" || got["handler_attempts"] != "0" {
		t.Errorf("malformed entry encoded as %v", got)
	}
}

func TestDecode(t *testing.T) {
	const id = "1700000000001-0"
	withID := func(e dlq.Entry) dlq.Entry { e.ID = id; return e }
	minimal := map[string]string{"original_id": "1-0", "app": "a", "handler": "h"}
	with := func(k, v string) map[string]string {
		m := map[string]string{}
		for mk, mv := range minimal {
			m[mk] = mv
		}
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name     string
		fields   map[string]string
		want     dlq.Entry
		badField string // non-empty: Decode fails naming this field
	}{
		{name: "full round trip", fields: dlq.Encode(dlqfixture.Full()), want: withID(dlqfixture.Full())},
		{name: "malformed round trip", fields: dlq.Encode(dlqfixture.Malformed()), want: withID(dlqfixture.Malformed())},
		{name: "only required fields", fields: minimal, want: dlq.Entry{ID: id, OriginalID: "1-0", App: "a", Handler: "h"}},
		{name: "unknown field ignored", fields: with("extra", "x"), want: dlq.Entry{ID: id, OriginalID: "1-0", App: "a", Handler: "h"}},
		{
			name:   "timestamp without fraction and with offset",
			fields: with("timestamp", "2026-03-04T06:06:07+01:00"),
			want:   dlq.Entry{ID: id, OriginalID: "1-0", App: "a", Handler: "h", Timestamp: time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)},
		},
		{name: "missing app", fields: map[string]string{"original_id": "1-0", "handler": "h"}, badField: "app"},
		{name: "missing handler", fields: map[string]string{"original_id": "1-0", "app": "a"}, badField: "handler"},
		{name: "missing original_id", fields: map[string]string{"app": "a", "handler": "h"}, badField: "original_id"},
		{name: "nil fields", fields: nil, badField: "original_id"},
		{name: "bad deliveries", fields: with("deliveries", "many"), badField: "deliveries"},
		{name: "negative deliveries", fields: with("deliveries", "-1"), badField: "deliveries"},
		{name: "bad handler_attempts", fields: with("handler_attempts", "1.5"), badField: "handler_attempts"},
		{name: "empty handler_attempts", fields: with("handler_attempts", ""), badField: "handler_attempts"},
		{name: "bad timestamp", fields: with("timestamp", "yesterday"), badField: "timestamp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := dlq.Decode(id, tc.fields)
			if tc.badField != "" {
				var fe *dlq.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.badField || fe.ID != id || !errors.Is(err, dlq.ErrInvalidEntry) {
					t.Fatalf("Decode error = %v; want a FieldError for %q of %s", err, tc.badField, id)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Decode (-want +got):\n%s", diff)
			}
		})
	}
}

func TestFieldErrorMessage(t *testing.T) {
	_, err := dlq.Decode("5-1", map[string]string{"original_id": "1-0", "app": "a", "handler": "h", "deliveries": "x"})
	if got, want := err.Error(), `dlq: entry 5-1: field "deliveries": not a non-negative integer: "x"`; got != want {
		t.Errorf("error = %q, want %q", got, want)
	}
}
