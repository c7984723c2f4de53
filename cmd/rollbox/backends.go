package main

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/auditlog"
)

// defaultBackend is the embedded default: it needs nothing but this binary.
const defaultBackend = sandbox.BackendWASM

// openBackend wires up a sandbox backend by name. progress gets one line for
// each first-use build. When $ROLLBOX_AUDIT_LOG names a file, every sandbox
// the backend makes appends its calls there (sandbox/auditlog).
func openBackend(ctx context.Context, name string, progress io.Writer) (sandbox.Backend, error) {
	return openBackendWith(ctx, name, progress, backendOptions{})
}

// backendOptions are what a command's flags add to openBackend.
type backendOptions struct {
	// auditLog is the audit log file (--audit-log); "" means
	// $ROLLBOX_AUDIT_LOG, and no log when that is unset too.
	auditLog string
	// warmGuests builds and compiles the WASM guest programs as the backend
	// opens (run and serve), so no episode pays for a first-use compile.
	warmGuests bool
}

func openBackendWith(ctx context.Context, name string, progress io.Writer, o backendOptions) (sandbox.Backend, error) {
	var be sandbox.Backend
	var err error
	switch name {
	case sandbox.BackendWASM:
		be, err = openWASM(ctx, progress)
		if w, ok := be.(interface {
			Warm(context.Context, ...string) error
		}); ok && err == nil && o.warmGuests {
			if err = w.Warm(ctx, "python", "js"); err != nil {
				be.Close()
			}
		}
	case sandbox.BackendDocker:
		be, err = openDocker(ctx, progress)
	default:
		return nil, usagef("backend %v", sandbox.CheckBackend(name))
	}
	if err != nil {
		return nil, err
	}
	path := o.auditLog
	if path == "" {
		path = os.Getenv("ROLLBOX_AUDIT_LOG")
	}
	if path == "" {
		return be, nil
	}
	sync := auditlog.SyncEvery
	if os.Getenv("ROLLBOX_AUDIT_SYNC") == "none" {
		sync = auditlog.SyncNone
	}
	l, err := auditlog.Open(path, auditlog.Options{Sync: sync})
	if err != nil {
		be.Close()
		return nil, err
	}
	return &auditedBackend{Backend: auditlog.Wrap(be, l), log: l}, nil
}

// auditedBackend owns the audit log its sandboxes write to.
type auditedBackend struct {
	sandbox.Backend
	log *auditlog.Log
}

func (b *auditedBackend) Close() error            { return errors.Join(b.Backend.Close(), b.log.Close()) }
func (b *auditedBackend) Unwrap() sandbox.Backend { return b.Backend }

func isTerminal(r io.Reader) bool {
	f, ok := r.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
