// Package containerd is the container sandbox backend on containerd
// directly (github.com/containerd/containerd/v2/client), in a namespace of
// its own ("rollbox"; Docker's is "moby"): no dockerd in the path.
//
// Every sandbox is one container whose task's init process is the guest
// agent (images/guest), bind-mounted read-only at /.rollbox/guest, spoken to
// over the task's stdin and stdout (guesthost, the same protocol and code
// as the Docker backend). Containers are hardened as Docker's are: a new
// network namespace with no interface, no capabilities, no-new-privileges,
// containerd's default seccomp profile, a read-only root, size-limited
// tmpfs for the workdir and /tmp (1777), memory (swap equal to it), a CPU
// quota and a pids limit through the cgroup, user 65534:65534. Runtimes:
// runc and gVisor's runsc, both through containerd's runc shim
// (io.containerd.runc.v2), as dockerd runs them.
//
// Images come from the same recipes as Docker's, imported into containerd's
// content store from an archive (Import; `rollbox images build` does it).
// Each sandbox holds a containerd lease labelled with its owner and the
// process lease of its maker, so Cleanup removes what a crashed process
// left: tasks, containers, snapshots, leases.
//
// A sandbox's workdir and /tmp are tmpfs layers on the host, bound into the
// container through mount points that receive the host's later mounts, so
// Fork (sandbox.Forker) freezes the parent's layer in place and gives the
// parent and each child an overlay of their own empty layer over it,
// copying nothing (workspace.go; RATIONALE.md).
package containerd
