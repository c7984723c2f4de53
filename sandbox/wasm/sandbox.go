package wasm

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/shell"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// Sandbox is one episode: its filesystem and nothing else while idle.
type Sandbox struct {
	b    *Backend
	id   string
	spec sandbox.Spec
	fs   *vfs.FS

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

var (
	errTimeout = errors.New("exec timed out")
	errIdle    = errors.New("exec printed nothing for its idle timeout")
	errClosing = fmt.Errorf("sandbox closed during exec: %w", sandbox.ErrClosed)
)

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

// activityWriter records the time of the last write, for idle timeouts.
type activityWriter struct {
	w    io.Writer
	last *atomic.Int64
}

func (a *activityWriter) Write(p []byte) (int, error) {
	a.last.Store(time.Now().UnixNano())
	return a.w.Write(p)
}

// Exec runs a shell line or an argv: the shell runs in this process
// against the episode's filesystem; python, js and .wasm programs run as
// WASI modules.
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
	clock := newExecClock(timeout, func() { cancel(errTimeout) })
	defer clock.stop()

	dir := req.Workdir
	if dir == "" {
		dir = s.spec.Workdir
	}
	if err := s.fs.MkdirAll(dir, 0o755); err != nil {
		return sandbox.Result{}, &sandbox.FieldError{Field: "exec.workdir", Message: fmt.Sprintf("%q: %v", dir, err)}
	}
	env := map[string]string{
		"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "USER": "user", "LOGNAME": "user",
		"TMPDIR": "/tmp", "LANG": "C.UTF-8", "SHELL": "/bin/sh", "UID": "1000", "EUID": "1000", "GID": "1000",
	}
	for k, v := range s.spec.Env {
		env[k] = v
	}
	for k, v := range req.Env {
		env[k] = v
	}

	stdout, stderr := sandbox.NewCapture(outCap), sandbox.NewCapture(outCap)
	var last atomic.Int64
	last.Store(time.Now().UnixNano())
	var out, errw io.Writer = stdout, stderr
	if req.IdleTimeout > 0 {
		out, errw = &activityWriter{w: stdout, last: &last}, &activityWriter{w: stderr, last: &last}
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(min(req.IdleTimeout/4, 100*time.Millisecond) + time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-ectx.Done():
					return
				case <-tick.C:
					if time.Since(time.Unix(0, last.Load())) >= req.IdleTimeout {
						cancel(errIdle)
						return
					}
				}
			}
		}()
	}

	stdin, closeStdin, err := stdinPipe(req.Stdin)
	if err != nil {
		return sandbox.Result{}, fmt.Errorf("%s: stdin: %v: %w", s.id, err, sandbox.ErrSandboxFailed)
	}
	defer closeStdin()

	clock.waitStart()
	err = acquire(ectx, s.b.shells)
	clock.waitEnd(false) // the shell itself holds no instance slot
	if err != nil {
		return s.stopped(ctx, ectx, start, stdout, stderr)
	}
	defer func() { <-s.b.shells }()

	progs := &execPrograms{b: s.b, sb: s, memLimit: uint64(s.spec.Limits.MemoryMB) << 20, clock: clock}
	cfg := shell.Config{
		FS: s.fs, Env: env, Dir: dir, Stdin: stdin, Stdout: out, Stderr: errw,
		Limits:  shell.Limits{MemoryBytes: int64(s.spec.Limits.MemoryMB) << 20, Jobs: s.spec.Limits.PIDs},
		Program: progs,
	}
	var o shell.Outcome
	if req.Shell != "" {
		o = shell.RunScript(ectx, cfg, req.Shell)
	} else {
		o = shell.RunArgv(ectx, cfg, req.Argv)
	}
	if ectx.Err() != nil && !o.OOM {
		return s.stopped(ctx, ectx, start, stdout, stderr)
	}
	res := sandbox.Result{ExitCode: o.ExitCode, Duration: time.Since(start)}
	progs.mu.Lock()
	res.Trap = progs.trap
	res.OOMKilled = o.OOM || progs.oom
	progs.mu.Unlock()
	if o.Reason != "" {
		fmt.Fprintf(stderr, "rollbox: %s\n", o.Reason)
	}
	fill(&res, stdout, stderr)
	return res, nil
}

// stopped builds the outcome of an exec whose context ended: a timeout is a
// Result, a cancellation or a Close is an error.
func (s *Sandbox) stopped(ctx, ectx context.Context, start time.Time, stdout, stderr *sandbox.Capture) (sandbox.Result, error) {
	cause := context.Cause(ectx)
	res := sandbox.Result{ExitCode: 137, Duration: time.Since(start)}
	switch {
	case errors.Is(cause, errTimeout):
		res.TimedOut = true
	case errors.Is(cause, errIdle):
		res.TimedOut, res.IdleTimedOut = true, true
	case errors.Is(cause, errClosing):
		return sandbox.Result{}, fmt.Errorf("%s: %w", s.id, errClosing)
	case ctx.Err() != nil:
		return sandbox.Result{}, ctx.Err()
	default:
		return sandbox.Result{}, fmt.Errorf("%s: %v: %w", s.id, cause, sandbox.ErrSandboxFailed)
	}
	fill(&res, stdout, stderr)
	return res, nil
}

func fill(res *sandbox.Result, stdout, stderr *sandbox.Capture) {
	res.Stdout, res.StdoutDropped = stdout.Bytes(), stdout.Dropped()
	res.Stderr, res.StderrDropped = stderr.Bytes(), stderr.Dropped()
}

// stdinPipe gives the shell an *os.File for data; the returned func closes
// both ends and waits for the copier, so nothing outlives the exec.
func stdinPipe(data []byte) (*os.File, func(), error) {
	if len(data) == 0 {
		return nil, func() {}, nil
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		pw.Write(data) // fails with EPIPE once the reader is closed
		pw.Close()
	}()
	return pr, func() {
		pr.Close()
		<-done
	}, nil
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
		return fmt.Errorf("%s: %s %s: disk cap of %d MB reached: %w", s.id, op, p, s.spec.Limits.DiskMB+s.spec.Limits.TmpMB, sandbox.ErrTooLarge)
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
