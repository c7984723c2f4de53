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
	// forkSpares is the containerd backend's Options.ForkSpares
	// (--fork-spares).
	forkSpares int
}

// defaultForkSpares is --fork-spares' default: a fork of up to 8 (a GRPO
// group's, an environment-mode client's) takes ready sandboxes. They are
// made only once a spec is forked (or its prefix runs), and closed when
// no fork has taken them for containerd.DefaultSpareIdle.
const defaultForkSpares = 8

// maxForkSpares bounds --fork-spares: the most one fork may make.
const maxForkSpares = sandbox.MaxFork

// addForkSparesFlag adds --fork-spares to a command that runs episodes.
func addForkSparesFlag(fs interface {
	Int(name string, value int, usage string) *int
}) *int {
	return fs.Int("fork-spares", defaultForkSpares, "containerd: fresh sandboxes kept ready per forked spec, up to a fork's n, made after its first fork or while a task's prefix runs, so forks (a prefix's group, POST /v1/episodes/{id}/fork) skip the cold creates; closed after 5 minutes unused; 0 disables")
}

// checkForkSpares refuses a --fork-spares out of range, naming the flag.
func checkForkSpares(n int) error {
	if n < 0 || n > maxForkSpares {
		return usagef("--fork-spares %d is outside 0..%d", n, maxForkSpares)
	}
	return nil
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
		be, err = openContainerd(ctx, fu, o.cfg, o.forkSpares)
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
