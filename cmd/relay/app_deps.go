package main

import (
	"context"
	"io"
	"time"

	"github.com/relaydev/relay/app"
	"github.com/relaydev/relay/runtime"
)

// depsJSON is an app's dependency manifest and image in relay app inspect
// (docs/runtimes.md#dependencies).
type depsJSON struct {
	Manifest     string  `json:"manifest"`
	Lockfile     string  `json:"lockfile,omitempty"`
	Digest       string  `json:"digest"`
	Image        string  `json:"image,omitempty"`
	Built        bool    `json:"built"`
	BuiltAt      string  `json:"built_at,omitempty"`
	BuildSeconds float64 `json:"build_seconds,omitempty"`
	SizeBytes    int64   `json:"size_bytes,omitempty"`
	// Error says why the image could not be looked up (containerd
	// unreachable, runtime image absent).
	Error string `json:"error,omitempty"`
}

// depsInfo describes a's dependencies and, when containerd can be reached,
// their image; nil when a has none.
func (c *AppInspectCmd) depsInfo(ctx context.Context, g *Globals, a *app.App) *depsJSON {
	d := a.Spec.Deps
	if d == nil {
		return nil
	}
	out := &depsJSON{Manifest: d.Manifest, Lockfile: d.Lockfile, Digest: d.Digest()}
	if c.Runner != "containerd" {
		out.Error = "the process runner does not build dependencies"
		return out
	}
	r, err := c.open(ctx, g.logger(), io.Discard, io.Discard, cliHostID())
	if err != nil {
		out.Error = err.Error()
		return out
	}
	defer r.Close()
	img, _, err := r.containerd.DepsImageOf(ctx, a.Spec)
	out.Image = img.Name
	if err != nil {
		out.Error = err.Error()
		return out
	}
	out.Built = img.Built
	if img.Built {
		out.BuiltAt = img.At.UTC().Format(time.RFC3339)
		out.BuildSeconds = img.Duration.Seconds()
		out.SizeBytes = img.Size
	}
	return out
}

// depsText is the Deps line of relay app inspect.
func depsText(d *depsJSON) string {
	if d == nil {
		return "-"
	}
	s := d.Manifest
	if d.Lockfile != "" {
		s += " + " + d.Lockfile
	}
	return s + " (sha256 " + d.Digest[:12] + ")"
}

// depsImageText is the Deps image line of relay app inspect.
func depsImageText(d *depsJSON) string {
	switch {
	case d == nil:
		return "-"
	case d.Error != "" && d.Image == "":
		return "unknown: " + d.Error
	case d.Error != "":
		return d.Image + " (unknown: " + d.Error + ")"
	case !d.Built:
		return d.Image + " (not built yet: the first start or invocation builds it)"
	}
	return d.Image + " (" + runtime.FormatSize(d.SizeBytes) + " compressed, built " + d.BuiltAt +
		" in " + (time.Duration(d.BuildSeconds * float64(time.Second))).Round(100*time.Millisecond).String() + ")"
}

// secretsText lists secret names; values are never read here.
func secretsText(names []string) string {
	if len(names) == 0 {
		return "-"
	}
	s := ""
	for i, n := range names {
		if i > 0 {
			s += ", "
		}
		s += n
	}
	return s + " (mounted at " + runtime.SecretsMountDir + "/NAME; values never shown)"
}
