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
package audit
