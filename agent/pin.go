package agent

import (
	"fmt"
	"maps"
	"strings"

	"github.com/rollbox/rollbox/sandbox"
)

// Pinned keys of a trajectory: "seed" and "episode_id" identify the
// episode; "hostname" is the sandbox's host name; "env.NAME" is an
// environment variable the runtime set in the sandbox (unless the task set
// it itself).
const (
	PinSeed      = "seed"
	PinEpisodeID = "episode_id"
	PinHostname  = "hostname"
	PinEnvPrefix = "env."
)

// PinnedHostname is every sandbox's host name (a container's would
// otherwise be its random id, which commands print).
const PinnedHostname = "sandbox"

// PinnedEnv is the environment the runtime fixes in every sandbox, so that
// what a command prints does not depend on the machine, the day or the
// process: UTC, a UTF-8 C locale, Python's hash seed (set iteration order),
// SOURCE_DATE_EPOCH (2024-01-01T00:00:00Z) for tools that stamp a build
// time, and no Python bytecode cache: agents edit a file and rerun within a
// second, and a cache keyed on mtime (seconds) and size would run the old
// code. HOME and PATH are fixed by each backend. A task's own sandbox.env
// wins over these.
var PinnedEnv = map[string]string{
	"TZ":                      "UTC",
	"LANG":                    "C.UTF-8",
	"PYTHONHASHSEED":          "0",
	"SOURCE_DATE_EPOCH":       "1704067200",
	"PYTHONDONTWRITEBYTECODE": "1",
}

// Pins returns what an episode of t pins, fresh: its seed and id, and
// SandboxPins. Replay passes a trajectory's own instead (Config.Pinned).
func Pins(t *Task, seed int64, episodeID string) map[string]string {
	p := SandboxPins(t)
	p[PinSeed], p[PinEpisodeID] = fmt.Sprint(seed), episodeID
	return p
}

// SandboxPins are the pins of t that shape its sandbox, the same for every
// episode of it: the host name, and PinnedEnv less what the task's
// sandbox.env sets itself. EpisodeSpec of t and SandboxPins(t) is the
// sandbox every fresh episode of t asks for.
func SandboxPins(t *Task) map[string]string {
	p := map[string]string{PinHostname: PinnedHostname}
	for k, v := range PinnedEnv {
		if _, set := t.Sandbox.Env[k]; !set {
			p[PinEnvPrefix+k] = v
		}
	}
	return p
}

// applyPins puts the pinned hostname and environment into spec; the task's
// own env entries are kept.
func applyPins(spec *sandbox.Spec, pinned map[string]string) {
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	for k, v := range pinned {
		if name, ok := strings.CutPrefix(k, PinEnvPrefix); ok {
			if _, set := env[name]; !set {
				env[name] = v
			}
		}
	}
	spec.Env = env
	if h := pinned[PinHostname]; h != "" {
		spec.Hostname = h
	}
}
