package main

import (
	"context"
	"strconv"
	"time"

	"github.com/relaydev/relay/dlq"
)

// DLQCmd groups the dead-letter queue commands.
type DLQCmd struct {
	Ls DLQLsCmd `cmd:"" help:"List dead-letter entries, oldest first."`
}

// DLQLsCmd is `relay dlq ls`.
type DLQLsCmd struct {
	App     string `help:"Only entries of this app."`
	Handler string `help:"Only entries of this handler."`
	Limit   int    `default:"100" help:"At most this many entries (0: all)."`
	JSON    bool   `name:"json" help:"Print JSON instead of a table."`
}

type dlqJSON struct {
	ID              string `json:"id"`
	OriginalStream  string `json:"original_stream"`
	OriginalID      string `json:"original_id"`
	Group           string `json:"group"`
	Consumer        string `json:"consumer"`
	App             string `json:"app"`
	Handler         string `json:"handler"`
	HandlerAttempts int    `json:"handler_attempts"`
	Deliveries      int64  `json:"deliveries"`
	Reason          string `json:"reason"`
	Timestamp       string `json:"timestamp"`
	Event           string `json:"event"`
	Trace           string `json:"trace,omitempty"`
}

// Run lists entries as ID ORIGINAL APP HANDLER ATTEMPTS AGE REASON.
func (c *DLQLsCmd) Run(ctx context.Context, g *Globals) error {
	if err := g.requireStream(false); err != nil {
		return err
	}
	if c.Limit < 0 {
		return usagef("--limit must be >= 0")
	}
	rc, err := g.redisClient()
	if err != nil {
		return err
	}
	defer rc.Close()
	entries, err := dlq.NewStore(rc, g.RedisStream).List(ctx, dlq.Filter{App: c.App, Handler: c.Handler, Limit: c.Limit})
	if err != nil {
		return err
	}
	if c.JSON {
		out := make([]dlqJSON, 0, len(entries))
		for _, e := range entries {
			out = append(out, dlqJSON{ID: e.ID, OriginalStream: e.OriginalStream, OriginalID: e.OriginalID, Group: e.Group,
				Consumer: e.Consumer, App: e.App, Handler: e.Handler, HandlerAttempts: e.HandlerAttempts,
				Deliveries: e.Deliveries, Reason: e.Reason, Timestamp: e.Timestamp.UTC().Format(time.RFC3339Nano),
				Event: e.Event, Trace: e.Trace})
		}
		return writeJSON(g.stdout, out)
	}
	rows := make([][]string, 0, len(entries))
	for _, e := range entries {
		rows = append(rows, []string{e.ID, e.OriginalID, e.App, e.Handler, strconv.Itoa(e.HandlerAttempts),
			age(time.Since(e.Timestamp)), oneLine(e.Reason, 60)})
	}
	return table(g.stdout, []string{"ID", "ORIGINAL", "APP", "HANDLER", "ATTEMPTS", "AGE", "REASON"}, rows)
}
