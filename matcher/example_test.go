package matcher_test

import (
	"fmt"
	"time"

	"github.com/relaydev/relay/matcher"
)

func ExampleParse() {
	p, err := matcher.Parse("orders/template.yaml", []byte(`
event_name: [INSERT, MODIFY]
new_image:
  id: [{prefix: "user_"}]
  amount: [{gte: 100}]
  created_at: [{gt: "now()-5m"}]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	event, err := matcher.DecodeEvent([]byte(`{"event_name":"INSERT","new_image":{"id":"user_7","amount":250.00,"created_at":"2026-09-12T11:58:00+02:00"}}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	now := time.Date(2026, 9, 12, 10, 0, 0, 0, time.UTC)
	fmt.Println(p.MatchValue(event, now))
	fmt.Println(p.MatchValue(event, now.Add(time.Hour)))
	// Output:
	// true
	// false
}

func ExampleParse_errors() {
	_, err := matcher.Parse("orders/template.yaml", []byte(`
status: COMPLETED
id: [{prefx: "user_"}]
`))
	for _, e := range err.(matcher.ErrorList) {
		fmt.Println(e)
	}
	// Output:
	// orders/template.yaml:2:9: status: a condition is a list of alternatives, not a scalar: write status: [COMPLETED]
	// orders/template.yaml:3:7: id[0].prefx: unknown operator "prefx": did you mean "prefix"?
}

func ExampleSet() {
	parse := func(src string) *matcher.Pattern {
		p, err := matcher.Parse("example.yaml", []byte(src))
		if err != nil {
			panic(err)
		}
		return p
	}
	set := matcher.NewSet([]matcher.Rule{
		{App: "audit", Handler: "log.everything", Pattern: parse("event_name: [{exists: true}]")},
		{App: "users", Handler: "events.created", Pattern: parse("event_name: [INSERT]\ntable_name: [users]")},
		{App: "users", Handler: "events.deleted", Pattern: parse("event_name: [REMOVE]\ntable_name: [users]")},
	})
	targets, err := set.Match([]byte(`{"event_name":"INSERT","table_name":"users"}`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, t := range targets {
		fmt.Printf("%s/%s (rule %d)\n", t.App, t.Handler, t.Rule)
	}
	_, err = set.Match([]byte(`["not", "an", "object"]`))
	fmt.Println(err)
	// Output:
	// audit/log.everything (rule 0)
	// users/events.created (rule 0)
	// matcher: malformed event: want a JSON object, got an array
}
