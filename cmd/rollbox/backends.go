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
	// auditMaxBytes, when > 0, rotates the audit log past this size
	// (auditlog.Options.MaxBytes; serve's log).
	auditMaxBytes int64
	// warm names the WASM guest programs to build and compile as the
	// backend opens (python and js for run and serve, so no episode pays for
	// a first-use compile; the one exec runs), besides the helper, which is
	// always built then.
	warm []string
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
		fu := startFirstUse(progress, "preparing the wasm backend: building and compiling its helper and guests…")
		if w, err = openWASM(ctx, fu, o.cfg); err == nil {
			be = w
			if err = w.Warm(ctx, o.warm...); err != nil {
				w.Close()
			}
		}
		fu.end(err)
	case sandbox.BackendDocker:
		fu := startFirstUse(progress, "preparing the docker backend: building the guest agent…")
		be, err = openDocker(ctx, fu, o.cfg)
		fu.end(err)
	case sandbox.BackendContainerd:
		fu := startFirstUse(progress, "preparing the containerd backend: building the guest agent…")
		be, err = openContainerd(ctx, fu, o.cfg)
		fu.end(err)
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
	l, err := auditlog.Open(path, auditlog.Options{Sync: sync, MaxBytes: o.auditMaxBytes})
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
