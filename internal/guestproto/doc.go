// Package guestproto is the framed, versioned protocol between a container
// backend on the host and the guest agent that is PID 1 of every container
// (images/guest). It rides on the container's attached stdin/stdout, so it
// works wherever an attach does: runc, gVisor (where host unix sockets on
// bind mounts do not), containerd and Kubernetes.
//
// A frame is a 12-byte header (magic, version, type, flags, a 32-bit request
// id, a 32-bit payload length) and the payload. A payload is at most
// MaxFrame bytes, so a corrupt or hostile length never allocates more than
// that; a message larger than a frame (a file, a big stdin) is split into
// frames carrying FlagMore and reassembled per id up to MaxMessage. Requests
// are multiplexed: every request carries an id chosen by the host, the reply
// carries the same id, and frames of different ids interleave freely.
//
// Payloads use a small binary encoding (uvarints and length-prefixed bytes)
// whose decoder checks every length against what is left, so decoding never
// allocates more than its input.
package guestproto
