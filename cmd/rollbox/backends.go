package main

import (
	"context"
	"errors"
	"io"
	"os"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/auditlog"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

// defaultBackend is the embedded default: it needs nothing but this binary.
const defaultBackend = sandbox.BackendWASM

// backendOptions are what the configuration and a command's flags give
// openBackend.
type backendOptions struct {
	cfg config
	// auditLog is the audit log file (--audit-log); "" means the
	// configuration's ($ROLLBOX_AUDIT_LOG), and no log when that is unset too.
	auditLog string
	// warmGuests builds and compiles the WASM guest programs as the backend
	// opens (run and serve), so no episode pays for a first-use compile.
	warmGuests bool
}

// openBackend wires up a sandbox backend by name. progress gets one line for
// each first-use build. With an audit log, every sandbox the backend makes
// appends its calls there (sandbox/auditlog).
func openBackend(ctx context.Context, name string, progress io.Writer, o backendOptions) (sandbox.Backend, error) {
	var be sandbox.Backend
	var err error
	switch name {
	case sandbox.BackendWASM:
		var w *wasm.Backend
		if w, err = openWASM(ctx, progress, o.cfg); err == nil {
			be = w
			if o.warmGuests {
				if err = w.Warm(ctx, "python", "js"); err != nil {
					w.Close()
				}
			}
		}
	case sandbox.BackendDocker:
		be, err = openDocker(ctx, progress, o.cfg)
	case sandbox.BackendContainerd:
		be, err = openContainerd(ctx, progress, o.cfg)
	default:
		return nil, usagef("backend %v", sandbox.CheckBackend(name))
	}
	if err != nil {
		return nil, err
	}
	path := o.auditLog
	if path == "" {
		path = o.cfg.auditLog
	}
	if path == "" {
		return be, nil
	}
	sync := auditlog.SyncEvery
	if o.cfg.auditSyncNone {
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
