package schedule

import (
	"encoding/json"
	"errors"
	"github.com/relaydev/relay/schedule/cron"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/relaydev/relay/internal/testutil"
)

func mustZone(t testing.TB, name string) *time.Location { return testutil.Zone(t, name) }

func mustTime(t testing.TB, s string) time.Time { return testutil.Time(t, s) }

func nightly(t testing.TB) Spec {
	return Spec{App: "billing", Name: "nightly", Handler: "invoice.run", Cron: cron.MustParse("30 2 * * *", mustZone(t, "America/New_York"))}
}

func TestOccurrenceID(t *testing.T) {
	at := time.Date(2026, 3, 8, 3, 0, 0, 999, mustZone(t, "America/New_York"))
	if got, want := OccurrenceID("billing", "nightly", at), "schedule:billing:nightly:2026-03-08T07:00:00Z"; got != want {
		t.Errorf("OccurrenceID = %q, want %q", got, want)
	}
}

func TestEnvelopeRoundTrip(t *testing.T) {
	s := nightly(t)
	at := mustTime(t, "2026-03-08T07:00:00Z") // the skipped 02:30, fired at the jump
	e := NewEnvelope(s, at)
	raw := e.Marshal()
	// Field names and order are the wire format of
	// docs/schedules.md#the-stream-entry.
	want := `{"source":"relay.schedule","app":"billing","schedule":"nightly","handler":"invoice.run",` +
		`"scheduled_at":"2026-03-08T07:00:00Z","occurrence_id":"schedule:billing:nightly:2026-03-08T07:00:00Z"}`
	if string(raw) != want {
		t.Fatalf("Marshal:\n got  %s\n want %s", raw, want)
	}
	if !IsEnvelope(raw) {
		t.Fatal("IsEnvelope(own envelope) = false")
	}
	got, err := DecodeEnvelope(raw)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(e, got); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if err := got.Validate(s); err != nil {
		t.Errorf("Validate: %v", err)
	}
	if at2, err := got.Time(); err != nil || !at2.Equal(at) {
		t.Errorf("Time = %v, %v; want %v", at2, err, at)
	}
	if in := string(got.Input()); in != `{"source":"relay.schedule","schedule":"nightly","scheduled_at":"2026-03-08T07:00:00Z"}` {
		t.Errorf("Input = %s", in)
	}
}

func TestIsEnvelope(t *testing.T) {
	for _, c := range []struct {
		event string
		want  bool
	}{
		{`{"source":"relay.schedule"}`, true},
		{` {"x":1, "source" : "relay.schedule", "y":[1]} `, true},
		{`{"source":"relay\u002eschedule"}`, true}, // escaped, still that string
		{`{"source":"orders"}`, false},
		{`{"Source":"relay.schedule"}`, false}, // keys match exactly
		{`{"data":{"source":"relay.schedule"}}`, false},
		{`{"source":["relay.schedule"]}`, false},
		{`["relay.schedule"]`, false},
		{`"relay.schedule"`, false},
		{`{"source":"relay.schedule"`, false}, // truncated
		{``, false},
	} {
		if got := IsEnvelope([]byte(c.event)); got != c.want {
			t.Errorf("IsEnvelope(%s) = %v, want %v", c.event, got, c.want)
		}
	}
}

func TestDecodeEnvelopeRejects(t *testing.T) {
	good := func() map[string]any {
		return map[string]any{
			"source": "relay.schedule", "app": "billing", "schedule": "nightly", "handler": "invoice.run",
			"scheduled_at": "2026-03-08T07:00:00Z", "occurrence_id": "schedule:billing:nightly:2026-03-08T07:00:00Z",
		}
	}
	type edit func(map[string]any)
	cases := []struct {
		name string
		edit edit
		want string
	}{
		{"wrong source", func(m map[string]any) { m["source"] = "orders" }, `field "source" is "orders", want "relay.schedule"`},
		{"offset instead of Z", func(m map[string]any) { m["scheduled_at"] = "2026-03-08T03:00:00-04:00" }, `field "scheduled_at" is "2026-03-08T03:00:00-04:00"`},
		{"fractional seconds", func(m map[string]any) { m["scheduled_at"] = "2026-03-08T07:00:00.5Z" }, `field "scheduled_at"`},
		{"not a time", func(m map[string]any) { m["scheduled_at"] = "yesterday" }, `want an RFC3339 UTC time with whole seconds`},
	}
	for _, f := range envelopeFields {
		cases = append(cases,
			struct {
				name string
				edit edit
				want string
			}{f + " missing", func(m map[string]any) { delete(m, f) }, `field "` + f + `" is missing`},
			struct {
				name string
				edit edit
				want string
			}{f + " a number", func(m map[string]any) { m[f] = 7 }, `field "` + f + `" must be a string, got a number`},
			struct {
				name string
				edit edit
				want string
			}{f + " null", func(m map[string]any) { m[f] = nil }, `field "` + f + `" must be a string, got null`},
			struct {
				name string
				edit edit
				want string
			}{f + " empty", func(m map[string]any) { m[f] = "" }, `field "` + f + `" is empty`},
		)
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m := good()
			c.edit(m)
			raw, err := json.Marshal(m)
			if err != nil {
				t.Fatal(err)
			}
			_, err = DecodeEnvelope(raw)
			if !errors.Is(err, ErrInvalidEnvelope) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("DecodeEnvelope(%s) = %v; want ErrInvalidEnvelope containing %q", raw, err, c.want)
			}
		})
	}
	for _, raw := range []string{`[]`, `"x"`, `null`, `{`, ``} {
		if _, err := DecodeEnvelope([]byte(raw)); !errors.Is(err, ErrInvalidEnvelope) || !strings.Contains(err.Error(), "not a JSON object") {
			t.Errorf("DecodeEnvelope(%s) = %v; want ErrInvalidEnvelope, not a JSON object", raw, err)
		}
	}
	// Unknown fields are tolerated (a newer publisher may add some).
	m := good()
	m["priority"] = 3
	raw, _ := json.Marshal(m)
	if _, err := DecodeEnvelope(raw); err != nil {
		t.Errorf("unknown field: %v", err)
	}
}

func TestValidateRejects(t *testing.T) {
	s := nightly(t)
	real := NewEnvelope(s, mustTime(t, "2026-03-09T06:30:00Z")) // 02:30 EDT
	for _, c := range []struct {
		name string
		edit func(*Envelope)
		want string
	}{
		{"forged occurrence_id", func(e *Envelope) { e.OccurrenceID = "schedule:billing:nightly:2026-03-10T06:30:00Z" },
			`field "occurrence_id" is "schedule:billing:nightly:2026-03-10T06:30:00Z", want "schedule:billing:nightly:2026-03-09T06:30:00Z"`},
		{"occurrence_id of another schedule", func(e *Envelope) {
			e.OccurrenceID = OccurrenceID("billing", "hourly", mustTime(t, "2026-03-09T06:30:00Z"))
		},
			`field "occurrence_id"`},
		{"scheduled_at that does not fire, with a matching id", func(e *Envelope) {
			at := mustTime(t, "2026-03-09T07:30:00Z") // 03:30 EDT
			e.ScheduledAt, e.OccurrenceID = FormatAt(at), OccurrenceID(e.App, e.Schedule, at)
		}, `field "scheduled_at" 2026-03-09T07:30:00Z is not a firing of cron "30 2 * * *" in America/New_York`},
		{"the repeated 01:30 EST is not a firing", func(e *Envelope) {
			at := mustTime(t, "2026-11-01T06:30:00Z")
			e.ScheduledAt, e.OccurrenceID = FormatAt(at), OccurrenceID(e.App, e.Schedule, at)
		}, `is not a firing`},
		{"other app", func(e *Envelope) { e.App = "shop" }, `field "app" is "shop", want "billing"`},
		{"other schedule", func(e *Envelope) { e.Schedule = "hourly" }, `field "schedule" is "hourly", want "nightly"`},
		{"wrong source", func(e *Envelope) { e.Source = "x" }, `field "source"`},
		{"malformed scheduled_at", func(e *Envelope) { e.ScheduledAt = "2026-03-09 06:30" }, `field "scheduled_at"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := real
			c.edit(&e)
			err := e.Validate(s)
			if !errors.Is(err, ErrInvalidEnvelope) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("Validate = %v; want ErrInvalidEnvelope containing %q", err, c.want)
			}
		})
	}
	// A changed handler is not the envelope's fault: the schedule's
	// configured handler is dispatched.
	e := real
	e.Handler = "old.handler"
	if err := e.Validate(s); err != nil {
		t.Errorf("Validate with another handler: %v", err)
	}
	// The cron is evaluated as it is now: after a cron change, an old
	// occurrence no longer validates.
	changed := s
	changed.Cron = cron.MustParse("0 4 * * *", s.Cron.Location())
	if err := real.Validate(changed); !errors.Is(err, ErrInvalidEnvelope) {
		t.Errorf("Validate after a cron change = %v, want ErrInvalidEnvelope", err)
	}
	// A spec that cannot be evaluated is reported as such, not blamed on
	// the envelope.
	broken := s
	broken.Cron = nil
	if err := real.Validate(broken); err == nil || errors.Is(err, ErrInvalidEnvelope) {
		t.Errorf("Validate against a spec without a cron = %v; want a non-envelope error", err)
	}
}
