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

// Help is shown by relay validate --help.
func (c *ValidateCmd) Help() string {
	return `Prints every template error of every app as app/template.yaml:line:col: message and exits 1 if there is any (or if the apps root holds no app). Needs neither Redis nor containerd.

Examples:

    relay validate --apps ./apps
    RELAY_APPS=/apps relay validate`
}
