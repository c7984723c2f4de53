package sandbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"sort"
	"strings"
	"time"
)

// Runtimes a container Spec may name.
const (
	RuntimeRunc  = "runc"
	RuntimeRunsc = "runsc"
)

// Network modes. NetworkNone is the default; anything else loosens isolation
// and must be asked for by name.
const (
	NetworkNone   = "none"
	NetworkBridge = "bridge"
)

// Labels of a sandbox made for an episode (Spec.Labels, EpisodeLabels): a
// container, an audit record names its episode and rollout by them.
const (
	LabelEpisode = "rollbox.episode"
	LabelRollout = "rollbox.rollout"
	// LabelRole is "verifier" on the fresh sandbox an episode's tests
	// reward runs in (absent on the episode's own).
	LabelRole    = "rollbox.role"
	RoleVerifier = "verifier"
)

// EpisodeLabels are the labels of a sandbox made for an episode. A warm
// pool's sandboxes carry none: they are made before their episode is known.
func EpisodeLabels(episodeID, rolloutID string) map[string]string {
	return map[string]string{LabelEpisode: episodeID, LabelRollout: rolloutID}
}

// Defaults applied by Spec.WithDefaults.
const (
	DefaultCPUs        = 1.0
	DefaultMemoryMB    = 512
	DefaultPIDs        = 256
	DefaultDiskMB      = 256
	DefaultTmpMB       = 64
	DefaultExecTimeout = 60 * time.Second
	DefaultOutputBytes = 1 << 20
	DefaultWorkdir     = "/work"
	// MaxFileBytes caps one file moved in or out of a sandbox.
	MaxFileBytes = 64 << 20
)

// reservedDirs are where the runtime mounts what a sandbox needs (the
// guest at /.rollbox/guest and, under containerd, its channel at
// /.rollbox/channel; /proc; /dev; the cgroups the guest reads its OOM
// verdicts from under /sys): a workdir (a tmpfs mounted after them) there
// would hide them or be refused by the runtime, failing the create as
// infrastructure for what is the task's bad input.
var reservedDirs = []string{"/.rollbox", "/proc", "/dev", "/sys"}

// Spec describes a sandbox. The zero value plus an Image is a valid, hardened
// spec: no network, default limits, workdir /work.
type Spec struct {
	// Image names a recipe from images/ ("base", "python"), a local container
	// image as "docker:NAME:TAG", or for the WASM backend may be empty.
	Image string `json:"image,omitempty"`
	// Runtime is the OCI runtime for container backends: runc (default) or runsc (gVisor).
	Runtime string `json:"runtime,omitempty"`
	Limits  Limits `json:"limits"`
	// Network is "none" (default) or "bridge". Anything but none is a
	// deliberate loosening and is reported as such.
	Network string            `json:"network,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	// Workdir is the writable, size-limited working directory (default /work).
	Workdir string `json:"workdir,omitempty"`
	// Hostname is the sandbox's host name, where the backend has one to set
	// (a container's is otherwise its random id).
	Hostname string `json:"hostname,omitempty"`
	// Labels are attached to whatever the backend creates (containers, temp
	// dirs), so leftovers of a crashed process can be found by owner.
	Labels map[string]string `json:"labels,omitempty"`
}

// Limits bound what one sandbox may use.
type Limits struct {
	CPUs     float64 `json:"cpus,omitempty"`
	MemoryMB int     `json:"memory_mb,omitempty"`
	PIDs     int     `json:"pids,omitempty"`
	// DiskMB is the size of the writable workdir.
	DiskMB int `json:"disk_mb,omitempty"`
	// TmpMB is the size of the writable /tmp.
	TmpMB int `json:"tmp_mb,omitempty"`
	// ExecTimeout is the default wall-clock limit of one Exec.
	ExecTimeout time.Duration `json:"exec_timeout,omitempty"`
	// OutputBytes caps each of stdout and stderr of one Exec.
	OutputBytes int `json:"output_bytes,omitempty"`
}

// WithDefaults returns s with every unset field given its hardened default.
func (s Spec) WithDefaults() Spec {
	if s.Runtime == "" {
		s.Runtime = RuntimeRunc
	}
	if s.Network == "" {
		s.Network = NetworkNone
	}
	if s.Workdir == "" {
		s.Workdir = DefaultWorkdir
	}
	l := &s.Limits
	if l.CPUs == 0 {
		l.CPUs = DefaultCPUs
	}
	if l.MemoryMB == 0 {
		l.MemoryMB = DefaultMemoryMB
	}
	if l.PIDs == 0 {
		l.PIDs = DefaultPIDs
	}
	if l.DiskMB == 0 {
		l.DiskMB = DefaultDiskMB
	}
	if l.TmpMB == 0 {
		l.TmpMB = DefaultTmpMB
	}
	if l.ExecTimeout == 0 {
		l.ExecTimeout = DefaultExecTimeout
	}
	if l.OutputBytes == 0 {
		l.OutputBytes = DefaultOutputBytes
	}
	return s
}

// Validate refuses a spec before anything starts. The error is a *FieldError
// (errors.Is ErrInvalidSpec) naming the first offending field.
func (s Spec) Validate() error {
	switch s.Runtime {
	case "", RuntimeRunc, RuntimeRunsc:
	default:
		return fieldErr("runtime", "%q is not one of runc, runsc", s.Runtime)
	}
	switch s.Network {
	case "", NetworkNone, NetworkBridge:
	default:
		return fieldErr("network", "%q is not one of none, bridge", s.Network)
	}
	if strings.ContainsAny(s.Image, " \t\n") {
		return fieldErr("image", "%q contains whitespace", s.Image)
	}
	if strings.HasPrefix(s.Image, "docker:") && len(s.Image) == len("docker:") {
		return fieldErr("image", "%q names no image after docker:", s.Image)
	}
	l := s.Limits
	switch {
	case l.CPUs < 0 || l.CPUs > 256:
		return fieldErr("limits.cpus", "%v is outside 0..256", l.CPUs)
	case l.MemoryMB < 0 || (l.MemoryMB > 0 && l.MemoryMB < 6):
		return fieldErr("limits.memory_mb", "%d is below the 6 MB minimum", l.MemoryMB)
	case l.MemoryMB > 1<<20:
		return fieldErr("limits.memory_mb", "%d is above 1 TiB", l.MemoryMB)
	case l.PIDs < 0 || (l.PIDs > 0 && l.PIDs < 8):
		return fieldErr("limits.pids", "%d is below the minimum of 8", l.PIDs)
	case l.DiskMB < 0:
		return fieldErr("limits.disk_mb", "%d is negative", l.DiskMB)
	case l.TmpMB < 0:
		return fieldErr("limits.tmp_mb", "%d is negative", l.TmpMB)
	case l.ExecTimeout < 0:
		return fieldErr("limits.exec_timeout", "%v is negative", l.ExecTimeout)
	case l.OutputBytes < 0:
		return fieldErr("limits.output_bytes", "%d is negative", l.OutputBytes)
	}
	if s.Workdir != "" && (!path.IsAbs(s.Workdir) || path.Clean(s.Workdir) != s.Workdir || s.Workdir == "/") {
		return fieldErr("workdir", "%q must be a clean absolute path other than /", s.Workdir)
	}
	for _, r := range reservedDirs {
		if s.Workdir == r || strings.HasPrefix(s.Workdir, r+"/") {
			return fieldErr("workdir", "%q is at or under %s, which the sandbox's runtime mounts (the guest and its channel, /proc, /dev, /sys and the cgroups): choose another directory", s.Workdir, r)
		}
	}
	if s.Hostname != "" && !validHostname(s.Hostname) {
		return fieldErr("hostname", "%q is not a host name (letters, digits, '-' and '.', at most 63)", s.Hostname)
	}
	for k := range s.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fieldErr("env", "variable name %q is empty or contains = or NUL", k)
		}
	}
	for k, v := range s.Env {
		if strings.ContainsRune(v, 0) {
			return fieldErr("env."+k, "value contains NUL")
		}
	}
	return nil
}

func validHostname(h string) bool {
	if len(h) > 63 || h[0] == '-' || h[0] == '.' {
		return false
	}
	for _, c := range h {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.') {
			return false
		}
	}
	return true
}

// Loosened lists the ways s is less isolated than the hardened default, so
// reports can say so explicitly. Empty means fully hardened.
func (s Spec) Loosened() []string {
	var out []string
	if s.Network != "" && s.Network != NetworkNone {
		out = append(out, "network="+s.Network)
	}
	return out
}

// Key is a stable digest of the spec, used to group interchangeable
// sandboxes (in a Pool, for instance).
func (s Spec) Key() string {
	s = s.WithDefaults()
	b, _ := json.Marshal(s) // maps marshal with sorted keys
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:8])
}

// ExecRequest is one command. Exactly one of Argv and Shell is set.
type ExecRequest struct {
	// Argv is run directly, Argv[0] looked up in PATH.
	Argv []string `json:"argv,omitempty"`
	// Shell is a shell line, run by the sandbox's shell (sh -c).
	Shell string            `json:"shell,omitempty"`
	Stdin []byte            `json:"stdin,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	// Workdir defaults to the Spec's.
	Workdir string `json:"workdir,omitempty"`
	// Timeout defaults to the Spec's Limits.ExecTimeout.
	Timeout time.Duration `json:"timeout,omitempty"`
	// IdleTimeout, when set, stops a command that writes nothing for that
	// long, like a timeout, keeping what it printed before.
	IdleTimeout time.Duration `json:"idle_timeout,omitempty"`
	// OutputCap caps each of stdout and stderr; defaults to the Spec's.
	OutputCap int `json:"output_cap,omitempty"`
}

// Validate checks the request's shape.
func (r ExecRequest) Validate() error {
	switch {
	case len(r.Argv) == 0 && r.Shell == "":
		return fieldErr("exec", "neither argv nor shell is set")
	case len(r.Argv) > 0 && r.Shell != "":
		return fieldErr("exec", "both argv and shell are set")
	case len(r.Argv) > 0 && r.Argv[0] == "":
		return fieldErr("exec.argv[0]", "empty program name")
	case r.Timeout < 0:
		return fieldErr("exec.timeout", "%v is negative", r.Timeout)
	case r.IdleTimeout < 0:
		return fieldErr("exec.idle_timeout", "%v is negative", r.IdleTimeout)
	case r.OutputCap < 0:
		return fieldErr("exec.output_cap", "%d is negative", r.OutputCap)
	}
	for k := range r.Env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return fieldErr("exec.env", "variable name %q is empty or contains = or NUL", k)
		}
	}
	return nil
}

// Result is what one command did. A command that fails, times out, is
// killed or runs out of memory yields a Result, not an error.
type Result struct {
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command ("SIGKILL"), if any.
	Signal string `json:"signal,omitempty"`
	// Stdout and Stderr keep the head and the tail of each stream when it
	// exceeded the cap: the first cap-cap/2 bytes, then the last cap/2, with
	// the dropped bytes (counted in StdoutDropped/StderrDropped) between them.
	Stdout        []byte `json:"stdout"`
	Stderr        []byte `json:"stderr"`
	StdoutDropped int64  `json:"stdout_dropped,omitempty"`
	StderrDropped int64  `json:"stderr_dropped,omitempty"`
	TimedOut      bool   `json:"timed_out,omitempty"`
	// IdleTimedOut is set (with TimedOut) when the command was stopped for
	// printing nothing for the request's IdleTimeout.
	IdleTimedOut bool `json:"idle_timed_out,omitempty"`
	OOMKilled    bool `json:"oom_killed,omitempty"`
	// Trap describes a WebAssembly trap, for the WASM backend.
	Trap     string        `json:"trap,omitempty"`
	Duration time.Duration `json:"duration"`
}

// FileInfo describes one entry of ListFiles.
type FileInfo struct {
	Name    string      `json:"name"`
	Size    int64       `json:"size"`
	Mode    fs.FileMode `json:"mode"`
	IsDir   bool        `json:"is_dir"`
	ModTime time.Time   `json:"mod_time"`
	// Link is a symlink's target, when the entry is one.
	Link string `json:"link,omitempty"`
}

// SortFileInfos orders entries by name, as ListFiles returns them.
func SortFileInfos(fis []FileInfo) {
	sort.Slice(fis, func(i, j int) bool { return fis[i].Name < fis[j].Name })
}

// Info is the sandbox as it really runs, for trajectories and audits.
type Info struct {
	ID          string `json:"id"`
	Backend     string `json:"backend"`
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	Runtime     string `json:"runtime,omitempty"`
	Network     string `json:"network"`
	Limits      Limits `json:"limits"`
	Workdir     string `json:"workdir"`
}

// String is for messages.
func (i Info) String() string { return fmt.Sprintf("%s sandbox %s", i.Backend, i.ID) }
