package sandbox

import (
	"context"
	"fmt"
	"io/fs"
	"slices"
	"strings"
)

// Backend names: the closed list a task's sandbox.backend, the --backend
// flags, the API and a trajectory's sandbox.backend take.
const (
	BackendWASM       = "wasm"
	BackendDocker     = "docker"
	BackendContainerd = "containerd"
)

// Backends lists the backend names, the default (BackendWASM) first.
func Backends() []string { return []string{BackendWASM, BackendDocker, BackendContainerd} }

// CheckBackend returns nil for a known backend name, else an error naming
// the known ones.
func CheckBackend(name string) error {
	if slices.Contains(Backends(), name) {
		return nil
	}
	return fmt.Errorf("%q is not one of %s", name, strings.Join(Backends(), ", "))
}

// Sandbox is one isolated environment. Every call takes a context:
// cancelling it kills what the call started. Methods are safe for
// concurrent use; Close is idempotent and may race with any call, which then
// fails with ErrClosed.
type Sandbox interface {
	Info() Info
	// Exec runs one command. A command that fails is a Result; an error
	// means the request was invalid (ErrInvalidSpec) or the sandbox failed.
	Exec(ctx context.Context, req ExecRequest) (Result, error)
	// ReadFile returns at most maxBytes of the file (MaxFileBytes when
	// maxBytes <= 0); a larger file is ErrTooLarge. Symlinks that point out
	// of the sandbox are not followed.
	ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error)
	// WriteFile creates or replaces a file, making parent directories.
	WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error
	// ListFiles lists a directory, sorted by name.
	ListFiles(ctx context.Context, dir string) ([]FileInfo, error)
	// Close stops everything the sandbox runs and removes what it created.
	Close() error
}

// Backend creates sandboxes of one kind.
type Backend interface {
	// Name is one of Backends.
	Name() string
	// Create validates the spec, then makes a ready sandbox. A partial
	// failure undoes what it did.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Close releases the backend's own resources (clients, runtimes). It
	// does not close sandboxes already handed out.
	Close() error
}
