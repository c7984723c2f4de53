// Command guest is the agent that runs as PID 1 of every container sandbox:
// it serves the host over its stdin/stdout (internal/guestproto) and logs to
// stderr. It is built static (CGO_ENABLED=0) by images.Builder and
// bind-mounted read-only into the container; its logic lives in
// internal/guest.
package main

import (
	"os"

	"github.com/rollbox/rollbox/internal/guest"
)

func main() {
	if os.Getpid() == 1 {
		guest.PrepareInit()
	}
	if err := guest.Serve(os.Stdin, os.Stdout, os.Stderr); err != nil {
		os.Exit(1)
	}
}
