package main

import (
	"context"
	"fmt"

	"github.com/relaydev/relay"
)

// ValidateCmd is `relay validate`.
type ValidateCmd struct{}

// Run loads the apps root and prints every error as
// app/template.yaml:line:col: message.
func (c *ValidateCmd) Run(ctx context.Context, g *Globals) error {
	apps, err := relay.LoadApps(g.Apps)
	if err != nil {
		return err
	}
	errs := apps.Errors()
	for _, e := range errs {
		fmt.Fprintln(g.stdout, e.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%d template errors", len(errs))
	}
	fmt.Fprintf(g.stdout, "%d apps OK\n", len(apps.List()))
	return nil
}
