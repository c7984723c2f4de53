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
	// ErrTooLarge: a file or input exceeds the sandbox's size caps.
	ErrTooLarge = errors.New("too large")
	// ErrEngineUnavailable: the container engine or runtime cannot be reached.
	ErrEngineUnavailable = errors.New("sandbox engine unavailable")
	// ErrSandboxFailed: the sandbox itself broke (died, protocol error, engine error).
	ErrSandboxFailed = errors.New("sandbox failed")
	// ErrClosed: the sandbox was closed before or during the call.
	ErrClosed = errors.New("sandbox closed")
)

// IsInfra reports whether err is a failure of the infrastructure rather than
// of the command or of the caller's input: such errors must never be scored as
// the model's failure.
func IsInfra(err error) bool {
	return errors.Is(err, ErrSandboxFailed) || errors.Is(err, ErrEngineUnavailable) ||
		errors.Is(err, ErrClosed) || errors.Is(err, ErrImageNotFound)
}

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
