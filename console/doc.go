// Package console is relay console: a small web application for the
// on-call engineer, served from the same library code the relay CLI uses
// (docs/console.md).
//
// Pages: an overview of every stream and group (lag, pending, consumers,
// dead letters, the cluster-wide counters with their rates), the apps with
// their rules, schedules and template errors, the pending messages and
// the state of each invocation, the dead-letter queue (filter, inspect,
// replay, remove: the semantics of relay dlq replay and rm), a pattern
// playground (matcher.Explain) and a live tail of outcomes (server-sent
// events from the feed of package stats).
//
// Pages are rendered on the server with html/template; the stylesheet and
// one small script are embedded. Every request gets a strict
// Content-Security-Policy; every POST needs the CSRF token of its form;
// with Config.Token every request needs the token. Pages read bounded
// ranges (XRANGE, XPENDING with COUNT and a cursor): none loads a whole
// stream.
package console
