// Package docker is the container sandbox backend on the Docker engine
// (github.com/docker/docker/client, API version negotiated; the engine here
// speaks 1.41).
//
// Every sandbox is one container whose PID 1 is the guest agent
// (images/guest), bind-mounted read-only at /.rollbox/guest. The backend
// attaches to the container's stdin/stdout before starting it and speaks the
// guestproto protocol over that stream, so an exec is a message round trip
// (about a millisecond) rather than a docker exec (tens of milliseconds), and
// the same path works under gVisor (runtime runsc).
//
// Containers are hardened by default: no network, all capabilities dropped,
// no-new-privileges, a read-only root with size-limited tmpfs for the
// workdir and /tmp, memory with swap equal to it, a CPU quota, a pids limit,
// and user 65534:65534 (nobody). Every container is labelled
// rollbox.owner=<owner> so Cleanup can remove what a crashed process left.
//
// # Errors
//
// The engine's failures are infrastructure (sandbox.ErrEngineUnavailable,
// ErrImageNotFound, ErrSandboxFailed). A guest that breaks while a command
// runs in its sandbox (killed, frozen: a liveness ping unanswered for
// Options.GuestTimeout, or its stream garbled), with no sign the engine did
// it, is sandbox.ErrSandboxAbuse: the agent's doing. Close returns only once
// the engine says the container is gone, or an error naming it.
//
// It also builds the container images named by recipes in images/recipes
// (BuildImage), with no registry: a recipe script fills a rootfs directory
// that is imported as a tar stream.
package docker
