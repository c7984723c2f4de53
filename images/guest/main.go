// Command guest is the agent that runs as PID 1 of every container sandbox:
// it serves the host over its stdin/stdout (internal/guestproto), or with
// `-channel PATH` over a unix socket the host listens on (the containerd
// backend's channel past the shim: sandbox/containerd/RATIONALE.md), and
// logs to stderr. It is built static (CGO_ENABLED=0) by images.Builder and
// bind-mounted read-only into the container; its logic lives in
// internal/guest.
package main

import (
	"fmt"
	"net"
	"os"

	"github.com/rollbox/rollbox/internal/guest"
)

func main() {
	if os.Getpid() == 1 {
		// Non-dumpable before the channel exists: no command can ever
		// reach its descriptor through /proc/1/fd.
		guest.PrepareInit()
	}
	if len(os.Args) == 3 && os.Args[1] == "-channel" {
		// First thing, before any request (so before any command): the
		// host takes one connection, this one, and closes its listener.
		conn, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: os.Args[2], Net: "unix"})
		if err != nil {
			fmt.Fprintf(os.Stderr, "guest: connect to the host's channel: %v\n", err)
			os.Exit(3) // not 2, a Go panic's status
		}
		if err := guest.Serve(conn, conn, os.Stderr); err != nil {
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 {
		fmt.Fprintf(os.Stderr, "guest: unknown arguments %q (want none, or -channel PATH)\n", os.Args[1:])
		os.Exit(3)
	}
	if err := guest.Serve(os.Stdin, os.Stdout, os.Stderr); err != nil {
		os.Exit(1)
	}
}
