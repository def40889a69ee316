package matcher

// Target is one (app, rule) pair that an event matched, in dispatch order:
// apps in sorted name order, rules in declaration order
// (docs/delivery.md#from-entry-to-acknowledgement).
type Target struct {
	App     string
	Handler string
	// Rule is the rule's index in its app's events list.
	Rule int
}
