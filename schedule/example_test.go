package schedule_test

import (
	"fmt"
	"github.com/relaydev/relay/schedule/cron"
	"time"

	"github.com/relaydev/relay/schedule"
)

// A daily 02:30 in New York on the day clocks spring forward: 02:30 does
// not exist, so it fires once, at 03:00 EDT.
func ExampleSpec_Next() {
	ny, err := time.LoadLocation("America/New_York")
	if err != nil {
		panic(err)
	}
	s := schedule.Spec{App: "billing", Name: "nightly", Handler: "invoice.run", Cron: cron.MustParse("30 2 * * *", ny)}
	at := time.Date(2026, 3, 7, 12, 0, 0, 0, time.UTC)
	for range 3 {
		if at, err = s.Next(at); err != nil {
			panic(err)
		}
		fmt.Println(at.Format(time.RFC3339), at.In(ny).Format("15:04 MST"))
	}
	// Output:
	// 2026-03-08T07:00:00Z 03:00 EDT
	// 2026-03-09T06:30:00Z 02:30 EDT
	// 2026-03-10T06:30:00Z 02:30 EDT
}

// The consumer's side: recognise an occurrence, decode it, check it against
// the schedule's current definition, and build the handler's stdin.
func ExampleDecodeEnvelope() {
	s := schedule.Spec{App: "billing", Name: "nightly", Handler: "invoice.run", Cron: cron.MustParse("0 3 * * *", nil)}
	event := []byte(`{"source":"relay.schedule","app":"billing","schedule":"nightly","handler":"invoice.run",` +
		`"scheduled_at":"2026-03-08T03:00:00Z","occurrence_id":"schedule:billing:nightly:2026-03-08T03:00:00Z"}`)
	if !schedule.IsEnvelope(event) {
		return
	}
	e, err := schedule.DecodeEnvelope(event)
	if err == nil {
		err = e.Validate(s)
	}
	if err != nil {
		fmt.Println("dead-letter:", err)
		return
	}
	fmt.Println(string(e.Input()))
	// Output:
	// {"source":"relay.schedule","schedule":"nightly","scheduled_at":"2026-03-08T03:00:00Z"}
}
