package matcher_test

import (
	"fmt"
	"time"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

func ExampleSet() {
	parse := func(src string) *matcher.Pattern {
		p, err := yamlpattern.Parse("example.yaml", []byte(src))
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

// Compile rules, match an event, then explain why each rule did or did not
// match it, condition by condition (what relay match --explain prints).
func ExampleSet_Explain() {
	parse := func(src string) *matcher.Pattern {
		p, err := yamlpattern.Parse("orders/template.yaml", []byte(src))
		if err != nil {
			panic(err)
		}
		return p
	}
	set := matcher.NewSet([]matcher.Rule{
		{App: "orders", Handler: "invoices.charge", Pattern: parse(`
event_name: [INSERT]
new_image:
  amount: [{gte: 100}]
  currency: [EUR, USD]
`)},
		{App: "orders", Handler: "audit.log", Pattern: parse(`
event_name: [{exists: true}]
deleted_at: [{exists: false}]
`)},
	})

	raw := []byte(`{"event_name":"INSERT","new_image":{"amount":42.5,"currency":"EUR"}}`)
	targets, err := set.Match(raw)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("matched:", targets)

	event, err := matcher.DecodeEvent(raw)
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, e := range set.Explain(event, time.Now()) {
		fmt.Printf("%s/%s matched=%t\n", e.Target.App, e.Target.Handler, e.Matched)
		for _, c := range e.Conditions {
			fmt.Printf("  [%t] %s\n", c.Matched, c)
		}
	}
	// Output:
	// matched: [{orders audit.log 1}]
	// orders/invoices.charge matched=false
	//   [true] event_name: "INSERT" is one of [INSERT]
	//   [false] new_image.amount: 42.5 is not >= 100
	//   [true] new_image.currency: "EUR" is one of [EUR, USD]
	// orders/audit.log matched=true
	//   [true] event_name: present (exists: true)
	//   [true] deleted_at: missing (exists: false)
}
