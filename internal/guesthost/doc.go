// Package guesthost is the host's end of a container's guest agent
// (images/guest), shared by the container backends (sandbox/docker,
// sandbox/containerd): it speaks guestproto over whatever stream the engine
// gives (Docker's attach, a containerd task's stdio), seals replies, runs the
// liveness watchdog while calls wait, and decides whose failure a broken
// guest is — the engine's (infrastructure) or the commands' (ErrSandboxAbuse)
// — from what the backend's Engine says. It imports no engine client.
package guesthost
