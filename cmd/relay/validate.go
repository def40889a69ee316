package main

import (
	"context"
	"fmt"
)

// ValidateCmd is `relay validate`.
type ValidateCmd struct{}

// Run loads the apps root and prints every error as
// app/template.yaml:line:col: message.
func (c *ValidateCmd) Run(ctx context.Context, g *Globals) error {
	apps, err := g.loadApps()
	if err != nil {
		return err
	}
	if len(apps.List()) == 0 {
		return errNoApps(g.Apps)
	}
	errs := apps.Errors()
	for _, e := range errs {
		fmt.Fprintln(g.stdout, e.Error())
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", plural(len(errs), "template error"))
	}
	fmt.Fprintf(g.stdout, "%s OK\n", plural(len(apps.List()), "app"))
	return nil
}
