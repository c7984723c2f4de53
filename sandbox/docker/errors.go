package docker

import (
	"errors"
	"fmt"
	"strings"

	cerrdefs "github.com/containerd/errdefs"
	"github.com/docker/docker/client"

	"github.com/rollbox/rollbox/sandbox"
)

// engineHint is the one line a user needs when the engine is not there.
const engineHint = "is dockerd running? start it with .ci/engine.sh"

// translate maps a docker client error to a sandbox error kind, at the
// edge: connection failures are ErrEngineUnavailable with a one-line hint,
// an unknown runtime is ErrEngineUnavailable naming it, anything else is
// ErrSandboxFailed. what says what was being done, for the message.
func translate(what string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case client.IsErrConnectionFailed(err) || strings.Contains(msg, "Cannot connect to the Docker daemon") ||
		strings.Contains(msg, "connect: no such file or directory") || strings.Contains(msg, "connection refused"):
		return fmt.Errorf("docker engine unreachable (%s): %w", engineHint, sandbox.ErrEngineUnavailable)
	case strings.Contains(msg, "unknown or invalid runtime name"):
		return fmt.Errorf("%s: %s (register it in /etc/docker/daemon.json, see .ci/engine.sh): %w", what, firstLine(msg), sandbox.ErrEngineUnavailable)
	case errors.Is(err, sandbox.ErrClosed), errors.Is(err, sandbox.ErrSandboxFailed):
		return err
	}
	return fmt.Errorf("%s: %s: %w", what, firstLine(msg), sandbox.ErrSandboxFailed)
}

func isNotFound(err error) bool { return cerrdefs.IsNotFound(err) }

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	return s
}
