package wasm

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/helper"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// Sandbox is one episode: its filesystem and nothing else while idle.
type Sandbox struct {
	b    *Backend
	id   string
	spec sandbox.Spec
	fs   *vfs.FS

	// cpu is the helpers' CPU time spent on this sandbox's commands.
	cpu atomic.Int64

	mu      sync.Mutex
	closed  bool
	cancels map[*execState]context.CancelCauseFunc
	wg      sync.WaitGroup
}

func newSandbox(b *Backend, spec sandbox.Spec) *Sandbox {
	l := spec.Limits
	limit := int64(l.DiskMB+l.TmpMB) << 20
	return &Sandbox{
		b: b, spec: spec,
		id:      "wasm-" + strconv.FormatInt(b.nextID.Add(1), 10),
		fs:      vfs.New(limit, spec.Workdir, "/tmp", "/root"),
		cancels: map[*execState]context.CancelCauseFunc{},
	}
}

// Info describes the sandbox.
func (s *Sandbox) Info() sandbox.Info {
	return sandbox.Info{ID: s.id, Backend: "wasm", Image: s.spec.Image, Network: sandbox.NetworkNone,
		Limits: s.spec.Limits, Workdir: s.spec.Workdir}
}

// Used is the bytes the sandbox's files are charged.
func (s *Sandbox) Used() int64 { return s.fs.Used() }

// execState identifies one running exec (not zero-sized: pointers to
// zero-sized values may compare equal).
type execState struct{ started time.Time }

// begin registers an exec so Close can stop it.
func (s *Sandbox) begin(cancel context.CancelCauseFunc) (*execState, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, fmt.Errorf("%s: %w", s.id, sandbox.ErrClosed)
	}
	st := &execState{started: time.Now()}
	s.cancels[st] = cancel
	s.wg.Add(1)
	return st, nil
}

func (s *Sandbox) end(st *execState) {
	s.mu.Lock()
	delete(s.cancels, st)
	s.mu.Unlock()
	s.wg.Done()
}

// execEnv is a command's environment, sorted KEY=VALUE pairs: the
// defaults, the spec's, the request's. Apart from Exec, so that the map's
// room is not on the stack of an episode waiting for a helper.
//
//go:noinline
func (s *Sandbox) execEnv(reqEnv map[string]string) []string {
	env := map[string]string{
		"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "USER": "user", "LOGNAME": "user",
		"TMPDIR": "/tmp", "LANG": "C.UTF-8", "SHELL": "/bin/sh", "UID": "1000", "EUID": "1000", "GID": "1000",
	}
	for k, v := range s.spec.Env {
		env[k] = v
	}
	for k, v := range reqEnv {
		env[k] = v
	}
	pairs := make([]string, 0, len(env))
	for k, v := range env {
		pairs = append(pairs, k+"="+v)
	}
	sort.Strings(pairs)
	return pairs
}

// Exec runs a shell line or an argv in a helper process: the shell and
// WASI programs run there, confined, against this sandbox's filesystem.
func (s *Sandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	if err := req.Validate(); err != nil {
		return sandbox.Result{}, err
	}
	start := time.Now()
	timeout := req.Timeout
	if timeout == 0 {
		timeout = s.spec.Limits.ExecTimeout
	}
	outCap := req.OutputCap
	if outCap == 0 {
		outCap = s.spec.Limits.OutputBytes
	}
	ectx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	st, err := s.begin(cancel)
	if err != nil {
		return sandbox.Result{}, err
	}
	defer s.end(st)

	dir := req.Workdir
	if dir == "" {
		dir = s.spec.Workdir
	}
	if err := s.fs.MkdirAll(dir, 0o755); err != nil {
		return sandbox.Result{}, s.fileErr("exec workdir", dir, err)
	}
	pairs := s.execEnv(req.Env)

	p, err := s.b.acquire(ectx)
	if err != nil {
		return s.stopped(ctx, ectx, err)
	}
	dn, err := p.Run(ectx, helper.Exec{
		Shell: req.Shell, Argv: req.Argv, Env: pairs, Dir: dir, Stdin: req.Stdin,
		Timeout: timeout, IdleTimeout: req.IdleTimeout, OutputCap: outCap,
		MemoryBytes: int64(s.spec.Limits.MemoryMB) << 20, Jobs: s.spec.Limits.PIDs,
		Threads: threadsFor(s.spec.Limits.CPUs),
	}, s.fs, helper.Hooks{Program: s.b.program, Slots: s.b.slots})
	if dn.CPU > 0 {
		s.cpu.Add(int64(dn.CPU))
	}
	died := errors.Is(err, helper.ErrDied)
	s.b.release(p)
	switch {
	case died:
		s.b.mu.Lock()
		s.b.deaths++
		s.b.mu.Unlock()
		// One exec runs in a helper at a time: this command killed it
		// (memory, threads, a crash it provoked). The agent's doing.
		return sandbox.Result{}, fmt.Errorf("%s: %w: %v (%w)", s.id, errHelperDied, err, sandbox.ErrSandboxAbuse)
	case err != nil:
		return s.stopped(ctx, ectx, err)
	case dn.Internal != "":
		return sandbox.Result{}, fmt.Errorf("%s: the WASM runtime failed: %s: %w", s.id, dn.Internal, sandbox.ErrSandboxFailed)
	case dn.Cancelled != 0:
		return s.stopped(ctx, ectx, context.Cause(ectx))
	}
	return sandbox.Result{
		ExitCode: dn.ExitCode, Stdout: dn.Stdout, Stderr: dn.Stderr,
		StdoutDropped: dn.StdoutDropped, StderrDropped: dn.StderrDropped,
		TimedOut: dn.TimedOut, IdleTimedOut: dn.IdleTimedOut, OOMKilled: dn.OOMKilled, Trap: dn.Trap,
		Duration: time.Since(start),
	}, nil
}

// errClosing is the cause Close gives the execs it stops.
var errClosing = fmt.Errorf("sandbox closed during exec: %w (%w)", sandbox.ErrClosed, helper.ErrClosing)

// stopped reports an exec that ended without a result: the sandbox
// closing, the caller cancelling, or the runtime failing.
func (s *Sandbox) stopped(ctx, ectx context.Context, err error) (sandbox.Result, error) {
	cause := context.Cause(ectx)
	switch {
	case errors.Is(cause, errClosing):
		return sandbox.Result{}, fmt.Errorf("%s: %w", s.id, errClosing)
	case ctx.Err() != nil:
		return sandbox.Result{}, context.Cause(ctx)
	case errors.Is(err, sandbox.ErrClosed) || errors.Is(err, sandbox.ErrEngineUnavailable):
		return sandbox.Result{}, fmt.Errorf("%s: %w", s.id, err)
	}
	return sandbox.Result{}, fmt.Errorf("%s: %v: %w", s.id, err, sandbox.ErrSandboxFailed)
}

// path errors from the filesystem, translated to the sandbox's kinds.
func (s *Sandbox) fileErr(op, p string, err error) error {
	var tl *vfs.TooLargeError
	switch {
	case errors.As(err, &tl):
		return fmt.Errorf("%s: %s %s: %d bytes over the cap of %d: %w", s.id, op, p, tl.Size, tl.Max, sandbox.ErrTooLarge)
	case errors.Is(err, vfs.ErrEscape):
		return fmt.Errorf("%s: %s %s: %w", s.id, op, p, sandbox.ErrPathEscape)
	case errors.Is(err, syscall.ENOENT):
		return fmt.Errorf("%s: %s %s: %w", s.id, op, p, sandbox.ErrNotFound)
	case errors.Is(err, syscall.ENOSPC):
		return fmt.Errorf("%s: %s %s: disk cap of %d MB reached: %w", s.id, op, p, s.spec.Limits.DiskMB+s.spec.Limits.TmpMB, sandbox.ErrNoSpace)
	}
	return fmt.Errorf("%s: %s %s: %w", s.id, op, p, err)
}

func (s *Sandbox) checkOpen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return fmt.Errorf("%s: %w", s.id, sandbox.ErrClosed)
	}
	return nil
}

// ReadFile reads a file by an absolute path that passes through no symlink.
func (s *Sandbox) ReadFile(ctx context.Context, p string, maxBytes int64) ([]byte, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	if maxBytes <= 0 {
		maxBytes = sandbox.MaxFileBytes
	}
	data, err := s.fs.StrictReadFile(p, maxBytes)
	if err != nil {
		return nil, s.fileErr("read", p, err)
	}
	return data, nil
}

// WriteFile creates or replaces a file, making parents.
func (s *Sandbox) WriteFile(ctx context.Context, p string, data []byte, mode fs.FileMode) error {
	if err := s.checkOpen(); err != nil {
		return err
	}
	if len(data) > sandbox.MaxFileBytes {
		return fmt.Errorf("%s: write %s: %d bytes: %w", s.id, p, len(data), sandbox.ErrTooLarge)
	}
	if err := s.fs.StrictWriteFile(p, data, mode); err != nil {
		return s.fileErr("write", p, err)
	}
	return nil
}

// ListFiles lists a directory, sorted by name.
func (s *Sandbox) ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	if err := s.checkOpen(); err != nil {
		return nil, err
	}
	ents, err := s.fs.StrictReadDir(dir)
	if err != nil {
		return nil, s.fileErr("list", dir, err)
	}
	out := make([]sandbox.FileInfo, 0, len(ents))
	for _, e := range ents {
		fi, err := e.Info()
		if err != nil {
			continue
		}
		info := sandbox.FileInfo{Name: e.Name(), Size: fi.Size(), Mode: fi.Mode(), IsDir: fi.IsDir(), ModTime: fi.ModTime()}
		if fi.Mode()&fs.ModeSymlink != 0 {
			info.Link, _ = s.fs.Readlink(dir + "/" + e.Name())
		}
		out = append(out, info)
	}
	sandbox.SortFileInfos(out)
	return out, nil
}

// Close stops running execs, waits for them and drops the filesystem. It
// is idempotent and safe to call concurrently.
func (s *Sandbox) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		s.wg.Wait()
		return nil
	}
	s.closed = true
	for _, cancel := range s.cancels {
		cancel(errClosing)
	}
	s.mu.Unlock()
	s.wg.Wait()
	s.fs.Drop() // release the files
	s.b.live.Delete(s.id)
	return nil
}
