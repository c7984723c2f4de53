package sandbox

import (
	"context"
	"time"
)

// Inspector is an optional capability of a Backend (find it through
// wrappers with Find): the host's own view of the backend's sandboxes —
// the engine's, the kernel's — which no command in a sandbox can
// misreport. Audits judge isolation by it; a backend that has a host side
// to show implements it.
type Inspector interface {
	// Inspect says how the host sees the sandbox whose Info().ID is id, now.
	Inspect(ctx context.Context, id string) (HostState, error)
	// HostFiles lists the host files no sandbox of the backend may change:
	// the runtime's binaries and what the backend mounts into sandboxes.
	HostFiles() []string
	// HostAddrs lists host addresses a sandbox without network must not
	// reach (a container engine's bridge gateway).
	HostAddrs(ctx context.Context) ([]string, error)
	// TaskLimit is the most tasks (processes and threads) the host lets a
	// sandbox of spec hold: the spec's pids and the backend's own helpers.
	TaskLimit(spec Spec) int
}

// HostState is a sandbox as the host sees it.
type HostState struct {
	// Runtime is the OCI runtime the host started it with ("" when none).
	Runtime string
	// Running is false once the sandbox as a whole stopped (a container
	// whose first process died).
	Running bool
	// OOMKilled is set when the host killed the whole sandbox for memory
	// (not one command in it).
	OOMKilled bool
	// CPU is the CPU time the host charged the sandbox so far; CPUScope
	// says what it charged ("the container's cgroup").
	CPU      time.Duration
	CPUScope string
	// CPUQuota is the CPU limit the host enforces on the sandbox, in CPUs,
	// as the engine's configuration of it says: 0 when there is none, nil
	// when the backend cannot tell. Unlike a measurement it does not
	// depend on how loaded the host is.
	CPUQuota *float64
}

// Confiner is implemented by backends that run commands in host processes
// they confine themselves (the WASM backend's helpers): ConfinementChecks
// starts such a process confined as it would be and reports what it tried
// on the host and whether it was refused, for the audit.
type Confiner interface {
	ConfinementChecks(ctx context.Context) ([]ConfinementCheck, error)
}

// ConfinementCheck is one thing a confined process tried. OK means it was
// refused (or, for what it must be able to do, allowed).
type ConfinementCheck struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail,omitempty"`
}
