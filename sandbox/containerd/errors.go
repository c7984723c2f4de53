package containerd

import (
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/rollbox/rollbox/sandbox"
)

// engineHint is the one line a user needs when containerd is not there.
const engineHint = "is containerd running? start it with .ci/engine.sh"

// translate maps a containerd client error to a sandbox error kind, at the
// edge: an unreachable daemon is ErrEngineUnavailable with a one-line hint,
// a runtime whose shim is missing is ErrEngineUnavailable naming it,
// anything else is ErrSandboxFailed. what says what was being done.
func translate(what string, err error) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	switch {
	case errors.Is(err, sandbox.ErrClosed), errors.Is(err, sandbox.ErrSandboxFailed),
		errors.Is(err, sandbox.ErrEngineUnavailable), errors.Is(err, sandbox.ErrSandboxAbuse):
		return err
	case errdefs.IsUnavailable(err) || strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "connect: no such file or directory") || strings.Contains(msg, "transport is closing"):
		return fmt.Errorf("containerd unreachable (%s): %w", engineHint, sandbox.ErrEngineUnavailable)
	case strings.Contains(msg, "binary not installed") || strings.Contains(msg, "no such file or directory: unknown") && strings.Contains(msg, "shim"):
		return fmt.Errorf("%s: %s (the runtime's shim is not installed): %w", what, firstLine(msg), sandbox.ErrEngineUnavailable)
	}
	return fmt.Errorf("%s: %s: %w", what, firstLine(msg), sandbox.ErrSandboxFailed)
}

func isNotFound(err error) bool { return errdefs.IsNotFound(err) }
