// Package audit proves a sandbox configuration's isolation with probes: it
// creates a sandbox from a spec, copies the probe program (images/probe)
// into it, runs one probe per exec (network egress, capabilities, seccomp,
// no-new-privileges, mounts, /proc/sys writes, escape syscalls, the guest
// agent's isolation, a fork bomb, a memory balloon, a disk fill, a CPU spin,
// an output flood, the /proc/self/exe overwrite, a symlink copy-out), and
// judges each with evidence, adding what only the host can see: the
// engine's view of the container, the cgroup's CPU time, a listener on the
// host's bridge address, the hashes of the runtime binaries, reads through
// planted symlinks. `rollbox audit` prints its Report; SECURITY.md explains
// each probe.
//
// The runner (audit.go) knows no backend: what only the host can see comes
// from the backend's sandbox.Inspector, found through its wrappers (the
// docker backend implements it; a backend without one is judged by its
// sandbox alone, and the WASM backend, which runs in this process, by the
// process's own accounting). The probes are in probe.go (running the probe
// program), isolation.go and limits.go.
package audit
