package containerd

import (
	"github.com/relaydev/relay/runtime/containerd/internal/core"
	"github.com/relaydev/relay/runtime/containerd/internal/deps"
	"github.com/relaydev/relay/runtime/containerd/internal/oneshot"
	"github.com/relaydev/relay/runtime/containerd/internal/presence"
	"github.com/relaydev/relay/runtime/containerd/internal/warm"
)

// The labels of the containerd objects a Runner makes, by which Sweep and
// other Runners of the namespace tell them apart. Their values are part of
// the contract between Relay versions sharing a containerd; each is
// defined beside the code that sets it.

// Labels set on every container and snapshot the Runner creates.
const (
	LabelHost    = core.LabelHost    // "relay.host"
	LabelApp     = core.LabelApp     // "relay.app"
	LabelHandler = core.LabelHandler // "relay.handler"
	// LabelWarm ("relay.warm") is "true" on warm containers, which serve
	// many invocations (their relay.handler label is empty).
	LabelWarm = warm.LabelWarm
	// LabelOwner ("relay.owner") names the Runner that created the object,
	// "<pid>-<start time>-<random>":
	// Sweep spares another live process's objects under its own host id (two
	// workers given one consumer name), and sweeps at once those of a
	// process that is gone (a restart after a crash).
	LabelOwner = core.LabelOwner
)

// LabelPrepared ("relay.prepared") is "true" on a container prepared ahead
// of demand that no attempt has taken yet; its relay.handler label is
// empty until then.
const LabelPrepared = oneshot.LabelPrepared

// LabelPresencePrefix ("relay.presence/") + host id is a label of the
// containerd namespace whose value is "<Unix milliseconds> <owner>": when
// the Runner with that host id last said it was alive, and its LabelOwner
// value, so that a Runner notices another process writing the same label
// (two workers given one host id). Sweep removes the containers of a host
// whose presence is older than the orphan timeout (WithOrphanTimeout), so
// that a worker replaced under another host id (a Kubernetes pod of a new
// name, a killed CLI) does not leave warm containers or hung handlers
// running forever. The Runners sharing a namespace share a machine, hence
// a clock.
const LabelPresencePrefix = presence.LabelPrefix

// Labels of a dependency image.
const (
	LabelDepsApp      = deps.LabelApp      // "relay.deps.app": the app that built it first
	LabelDepsBase     = deps.LabelBase     // "relay.deps.base": the runtime image's reference
	LabelDepsBuilt    = deps.LabelBuilt    // "relay.deps.built": RFC 3339 time of the build
	LabelDepsDuration = deps.LabelDuration // "relay.deps.duration": build time, a Go duration
	LabelDepsSize     = deps.LabelSize     // "relay.deps.size": bytes of the layer, compressed
	LabelDepsUsed     = deps.LabelUsed     // "relay.deps.used": RFC 3339 time a Runner last used it (Sweep)
)
