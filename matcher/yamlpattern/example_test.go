package yamlpattern_test

import (
	"fmt"
	"time"

	"github.com/relaydev/relay/matcher"
	"github.com/relaydev/relay/matcher/yamlpattern"
)

func ExampleParse() {
	p, err := yamlpattern.Parse("orders/template.yaml", []byte(`
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
	_, err := yamlpattern.Parse("orders/template.yaml", []byte(`
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
