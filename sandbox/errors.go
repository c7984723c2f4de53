package sandbox

import (
	"errors"
	"fmt"
)

// Error kinds. Backends wrap one of these with %w and the identifiers that
// matter (sandbox id, image, path), translating their client's errors at
// their edge, so callers can tell infrastructure failures from the model's.
var (
	// ErrInvalidSpec: a Spec or ExecRequest was refused before anything ran.
	ErrInvalidSpec = errors.New("invalid sandbox spec")
	// ErrImageNotFound: the image a Spec names does not exist locally.
	ErrImageNotFound = errors.New("image not found")
	// ErrNotFound: a file or directory does not exist in the sandbox.
	ErrNotFound = errors.New("not found")
	// ErrPathEscape: a path leaves the sandbox's filesystem (.., a symlink, a host path).
	ErrPathEscape = errors.New("path escapes the sandbox")
	// ErrTooLarge: a file or input exceeds a size cap of the call (a read
	// larger than asked for, a file over MaxFileBytes).
	ErrTooLarge = errors.New("too large")
	// ErrNoSpace: the sandbox's disk (workdir, /tmp) is full. Not
	// infrastructure: what fills it is the task's files or the commands'.
	ErrNoSpace = errors.New("no space left in the sandbox")
	// ErrEngineUnavailable: the container engine or runtime cannot be reached.
	ErrEngineUnavailable = errors.New("sandbox engine unavailable")
	// ErrSandboxFailed: the sandbox itself broke (died, protocol error, engine error).
	ErrSandboxFailed = errors.New("sandbox failed")
	// ErrClosed: the sandbox was closed before or during the call.
	ErrClosed = errors.New("sandbox closed")
	// ErrSandboxAbuse: the sandbox broke because of what the commands run
	// in it did — they killed, froze or exhausted the process serving the
	// sandbox (a container's guest agent, a WASM helper) or garbled its
	// stream. It is the agent's doing, not the infrastructure's: IsInfra is
	// false, and the episode is scored as a failure rather than dropped
	// (otherwise a policy learns to dodge a bad reward by crashing its
	// sandbox).
	ErrSandboxAbuse = errors.New("sandbox broken by its own commands")
)

// IsInfra reports whether err is a failure of the infrastructure rather than
// of the command or of the caller's input: such errors must never be scored as
// the model's failure. An ErrSandboxAbuse is never infrastructure, even when
// it also wraps ErrSandboxFailed.
func IsInfra(err error) bool {
	if errors.Is(err, ErrSandboxAbuse) {
		return false
	}
	return errors.Is(err, ErrSandboxFailed) || errors.Is(err, ErrEngineUnavailable) ||
		errors.Is(err, ErrClosed) || errors.Is(err, ErrImageNotFound)
}

// IsAbuse reports whether err says the sandbox was broken by the commands
// run in it (ErrSandboxAbuse).
func IsAbuse(err error) bool { return errors.Is(err, ErrSandboxAbuse) }

// FieldError is an ErrInvalidSpec that names the offending field.
type FieldError struct {
	Field   string
	Message string
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("invalid sandbox spec: %s: %s", e.Field, e.Message)
}

func (e *FieldError) Unwrap() error { return ErrInvalidSpec }

func fieldErr(field, format string, args ...any) error {
	return &FieldError{Field: field, Message: fmt.Sprintf(format, args...)}
}
