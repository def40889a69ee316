package main

import (
	"context"
	"fmt"
	"os"

	"github.com/relaydev/relay/app/template"
	"github.com/relaydev/relay/internal/plural"
	"github.com/relaydev/relay/internal/textsafe"
)

// ValidateCmd is `relay validate`.
type ValidateCmd struct {
	SecretsDir string `name:"secrets-dir" env:"RELAY_SECRETS_DIR" placeholder:"DIR" help:"Also check that every secret an app names is a file in DIR, the worker's secrets directory. Unset: secrets are checked by name only."`
}

// Run loads the apps root and prints every error as
// app/template.yaml:line:col: message.
func (c *ValidateCmd) Run(ctx context.Context, g *Globals) error {
	var opts []template.Option
	if c.SecretsDir != "" {
		if fi, err := os.Stat(c.SecretsDir); err != nil || !fi.IsDir() {
			return usagef("--secrets-dir (or RELAY_SECRETS_DIR) %s is not a directory", c.SecretsDir)
		}
		opts = append(opts, template.WithSecretsDir(c.SecretsDir))
	}
	apps, err := g.loadApps(opts...)
	if err != nil {
		return err
	}
	if len(apps.List()) == 0 {
		return errNoApps(g.Apps)
	}
	errs := apps.Errors()
	for _, e := range errs {
		// The app's directory name and the template's text are in it.
		fmt.Fprintln(g.stdout, textsafe.Escape(e.Error(), false))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s", plural.Of(len(errs), "template error"))
	}
	fmt.Fprintf(g.stdout, "%s OK\n", plural.Of(len(apps.List()), "app"))
	return nil
}

// Help is shown by relay validate --help.
func (c *ValidateCmd) Help() string {
	return `Prints every template error of every app as app/template.yaml:line:col: message and exits 1 if there is any (or if the apps root holds no app). It also checks each app's dependency manifest (requirements.txt; package.json with package-lock.json) and secret names, and with --secrets-dir that every secret exists. Needs neither Redis nor containerd.

Examples:

    relay validate --apps ./apps
    RELAY_APPS=/apps relay validate
    relay validate --apps ./apps --secrets-dir /var/lib/relay/secrets`
}
