package guesthost

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rollbox/rollbox/internal/guestproto"
	"github.com/rollbox/rollbox/sandbox"
)

// GuestAnswer bounds how long the guest may take beyond a command's own
// timeout (or to answer Hello) before the sandbox is declared broken.
const GuestAnswer = 30 * time.Second

// GuestThreads is what a container's pids limit allows beyond
// Limits.PIDs for the guest agent's own threads, so the commands get the
// whole of their budget (guest.PrepareInit starts 21 of them up front).
const GuestThreads = 32

// DefaultPath is the commands' PATH.
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// livenessEvery is how often the watchdog pings the guest while calls wait
// for it; each ping must be answered within Config.GuestTimeout. A guest
// that does not (frozen by SIGSTOP, a stream a command desynchronised)
// fails the sandbox then, not when the command's timeout has passed.
const livenessEvery = time.Second

// Engine is what a backend's engine says about a sandbox whose guest broke,
// for the verdict on whose failure it was.
type Engine interface {
	// Diagnose asks the engine about the sandbox now.
	Diagnose(ctx context.Context) Diagnosis
}

// Diagnosis is the engine's account of a sandbox whose guest broke.
type Diagnosis struct {
	// Err, when set, is the whole verdict: the engine could not be asked,
	// or says the sandbox was removed from outside (an infrastructure
	// error, already translated at the backend's edge). It is wrapped
	// after the cause.
	Err error
	// State describes the sandbox as the engine sees it, for the message
	// ("container exited, exit code 137").
	State string
	// Infra, when set, says how the engine itself broke the sandbox ("the
	// engine was asked to kill (signal 9) the container", "the container
	// is paused"): an infrastructure failure whatever ran in it.
	Infra string
	// Exited says the guest (the sandbox's init) has ended, with
	// ExitStatus (128 + the signal's number for one killed by a signal).
	Exited     bool
	ExitStatus int
	// OOMKilled says the kernel's OOM killer ended the guest for the
	// sandbox's memory.
	OOMKilled bool
}

// panicExit is the status a Go program ends with on a panic or a fatal
// error of its runtime.
const panicExit = 2

// Config describes one guest connection.
type Config struct {
	// ID names the sandbox in messages (its Info().ID).
	ID   string
	Spec sandbox.Spec
	// GuestTimeout is how long a liveness ping may go unanswered.
	GuestTimeout time.Duration
	Engine       Engine
	// Cut ends the stream (closes the engine's connection or pipes) so
	// that every pending call ends with verdict. Called once the guest is
	// judged broken; it must not block on the guest.
	Cut func(verdict error)
	// AnswerGrace is how long a command's answer may come after its
	// timeout (GuestAnswer when 0; tests give less).
	AnswerGrace time.Duration
}

// Conn is the host's end of one container's guest agent: requests, the
// verdict on a guest that broke, the liveness watchdog. Safe for
// concurrent use.
type Conn struct {
	cfg   Config
	guest *guestproto.Client
	log   *Log // the guest's stderr

	pending  atomic.Int64 // calls waiting for the guest
	execs    atomic.Int64 // of which commands: what could have broken the guest
	watching atomic.Bool  // the liveness watchdog runs

	mu     sync.Mutex
	closed bool
	broken error // the verdict on the guest's failure: every later call returns it
}

// New is the connection to a guest not attached yet: its Log can take the
// guest's stderr before the engine's streams are set up. Attach starts it.
func New(cfg Config) *Conn { return &Conn{cfg: cfg, log: NewLog(LogBytes)} }

// Attach starts reading the guest's replies from r and sending requests to
// w. Call it once, before any request.
func (c *Conn) Attach(r io.Reader, w io.Writer) { c.guest = guestproto.NewClient(r, w) }

// Log is where the backend writes the guest's stderr.
func (c *Conn) Log() *Log { return c.log }

// Hello seals replies with a fresh key (a command that reaches the guest's
// stream, as gVisor lets it through /proc/1/fd/1, cannot forge them) and
// tells the guest its roots and, under runsc, the limits it enforces
// itself.
func (c *Conn) Hello(ctx context.Context) error {
	key := make([]byte, guestproto.KeySize)
	rand.Read(key)
	c.guest.Authenticate(key)
	hello := &guestproto.Hello{
		Version:       int(guestproto.Version),
		WritableRoots: []string{c.cfg.Spec.Workdir, "/tmp"},
		SharedRoots:   []string{"/tmp"},
		Key:           key,
	}
	if c.cfg.Spec.Runtime == sandbox.RuntimeRunsc {
		hello.MemoryGuardBytes = int64(c.cfg.Spec.Limits.MemoryMB) << 20
		hello.ProcessLimit = int64(c.cfg.Spec.Limits.PIDs + GuestThreads)
	}
	hctx, cancel := context.WithTimeout(ctx, GuestAnswer)
	defer cancel()
	m, err := c.call(hctx, guestproto.TypeHello, hello)
	if err != nil {
		if ctx.Err() == nil && hctx.Err() != nil {
			return fmt.Errorf("sandbox %s: the guest did not answer in %v%s: %w", c.cfg.ID, GuestAnswer, c.logTail(), sandbox.ErrSandboxFailed)
		}
		return err
	}
	var reply guestproto.HelloReply
	if err := guestproto.Expect(m, guestproto.TypeHelloReply, &reply); err != nil {
		return fmt.Errorf("sandbox %s: hello: %v: %w", c.cfg.ID, err, sandbox.ErrSandboxFailed)
	}
	if !reply.Sealed {
		return fmt.Errorf("sandbox %s: the guest (%s) does not seal its replies: rebuild it from this source: %w", c.cfg.ID, reply.Agent, sandbox.ErrSandboxFailed)
	}
	return nil
}

// MarkClosed makes every call from now on, and every call in flight once
// the backend cuts the stream, fail with ErrClosed.
func (c *Conn) MarkClosed() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
}

// IsClosed reports whether MarkClosed was called.
func (c *Conn) IsClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Broken is the verdict on a guest that broke, nil while it works.
func (c *Conn) Broken() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// Rejected counts the replies dropped for a bad seal.
func (c *Conn) Rejected() int64 {
	if c.guest == nil {
		return 0
	}
	return c.guest.Rejected()
}

// call sends one request to the guest and translates what can go wrong
// with the sandbox (not with the request) into ErrClosed, ErrSandboxFailed
// or ErrSandboxAbuse (see fail).
func (c *Conn) call(ctx context.Context, t guestproto.Type, body guestproto.Payload) (guestproto.Message, error) {
	if c.IsClosed() {
		return guestproto.Message{}, fmt.Errorf("sandbox %s: %w", c.cfg.ID, sandbox.ErrClosed)
	}
	if err := c.Broken(); err != nil {
		return guestproto.Message{}, err
	}
	c.pending.Add(1)
	c.watch()
	m, err := c.guest.Call(ctx, t, body)
	c.pending.Add(-1)
	if err == nil {
		return m, nil
	}
	var ge *guestproto.Error
	switch {
	case errors.As(err, &ge):
		return m, c.GuestError(ge)
	case c.IsClosed():
		return m, fmt.Errorf("sandbox %s: %w", c.cfg.ID, sandbox.ErrClosed)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if b := c.Broken(); b != nil {
			return m, b
		}
		return m, err
	}
	return m, c.fail(fmt.Errorf("guest connection lost: %w", err), c.execs.Load() > 0)
}

// fail records that the guest broke (its stream ended or went wrong, or it
// stopped answering) and returns the verdict, the same for every call from
// now on; the stream is cut so that every pending call ends with it.
// duringCommand says whether a command was running when it broke: only a
// command can have done it then.
func (c *Conn) fail(cause error, duringCommand bool) error {
	if b := c.Broken(); b != nil {
		return b
	}
	verdict := c.judge(cause, duringCommand)
	c.mu.Lock()
	if c.broken == nil {
		c.broken = verdict
	}
	verdict = c.broken
	c.mu.Unlock()
	if c.cfg.Cut != nil {
		c.cfg.Cut(verdict)
	}
	return verdict
}

// judge decides whose failure a broken guest is. The engine's own failures
// are infrastructure (ErrEngineUnavailable, ErrSandboxFailed): the engine
// does not answer, the container was removed, or the engine was asked to
// kill, stop or pause it (Engine.Diagnose). So is a guest that broke while
// no command ran (nothing of the agent's exists then: the guest kills every
// process between commands), or that panicked (a bug of its own: it ended
// with a Go panic's status and its log says so).
// Otherwise the commands running in the sandbox killed or froze the guest
// (gVisor lets a command signal PID 1), garbled its stream (gVisor lets it
// write to /proc/1/fd/1) or starved it: ErrSandboxAbuse, the agent's doing,
// which also wraps ErrSandboxFailed.
func (c *Conn) judge(cause error, duringCommand bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	what := fmt.Sprintf("sandbox %s: %v", c.cfg.ID, cause)
	d := c.cfg.Engine.Diagnose(ctx)
	if d.Err != nil {
		return fmt.Errorf("%s: %w", what, d.Err)
	}
	if d.State != "" {
		what += " (" + d.State + ")"
	}
	what += c.tampered()
	if d.Infra != "" {
		return fmt.Errorf("%s: %s%s: %w", what, d.Infra, c.logTail(), sandbox.ErrSandboxFailed)
	}
	if d.OOMKilled {
		// Only what the commands left fills the sandbox's memory (their
		// files in its tmpfs, their processes): a guest that then needs
		// memory to serve a request (a big file read or written, a long
		// listing) and is killed for it, with or without a command
		// running, is the agent's doing.
		return fmt.Errorf("%s: the guest was OOM-killed for the sandbox's memory, which what its commands left fills%s: %w (%w)", what, c.logTail(), sandbox.ErrSandboxAbuse, sandbox.ErrSandboxFailed)
	}
	if !duringCommand {
		return fmt.Errorf("%s%s: %w", what, c.logTail(), sandbox.ErrSandboxFailed)
	}
	// The log alone does not say the guest panicked: under gVisor a command
	// can write into the guest's stderr (/proc/1/fd/2) and then kill it.
	// A panic ends the guest with status 2, which no command can give it.
	if d.Exited && d.ExitStatus == panicExit && strings.Contains(c.log.String(), "panic: ") {
		return fmt.Errorf("%s: the guest panicked%s: %w", what, c.logTail(), sandbox.ErrSandboxFailed)
	}
	return fmt.Errorf("%s while a command ran in it%s: %w (%w)", what, c.logTail(), sandbox.ErrSandboxAbuse, sandbox.ErrSandboxFailed)
}

// watch starts the liveness watchdog unless it runs.
func (c *Conn) watch() {
	if c.watching.CompareAndSwap(false, true) {
		go c.watchdog()
	}
}

func (c *Conn) watchdog() {
	t := time.NewTicker(livenessEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.guest.Done():
			c.watching.Store(false)
			return
		}
		if c.pending.Load() == 0 || c.IsClosed() || c.Broken() != nil {
			c.watching.Store(false)
			// A call that started meanwhile saw the flag still set: go on
			// watching for it.
			if c.pending.Load() == 0 || c.IsClosed() || c.Broken() != nil || !c.watching.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		duringCommand := c.execs.Load() > 0
		ctx, cancel := context.WithTimeout(context.Background(), c.cfg.GuestTimeout)
		_, err := c.guest.Call(ctx, guestproto.TypePing, nil)
		timedOut := ctx.Err() != nil
		cancel()
		if err != nil && timedOut && !c.IsClosed() {
			c.fail(fmt.Errorf("the guest did not answer a ping in %v", c.cfg.GuestTimeout), duringCommand || c.execs.Load() > 0)
		}
		// A stream that ended is the pending calls' to report.
	}
}

// tampered says how many forged replies were dropped, if any: the sign that
// a command wrote into the guest's stream.
func (c *Conn) tampered() string {
	if n := c.Rejected(); n > 0 {
		return fmt.Sprintf(" (%d unauthenticated replies dropped: a command wrote into the guest's stream)", n)
	}
	return ""
}

func (c *Conn) logTail() string {
	if s := c.log.String(); s != "" {
		return "; guest log: " + s
	}
	return ""
}

// GuestError maps the guest's error codes to sandbox error kinds: what the
// request got wrong is the caller's (ErrNotFound, ErrPathEscape,
// ErrTooLarge, ErrInvalidSpec, fs.ErrPermission); what the guest failed at
// itself, or a code this host does not know, is the sandbox's
// (ErrSandboxFailed).
func (c *Conn) GuestError(e *guestproto.Error) error {
	switch e.Code {
	case guestproto.CodeNotFound:
		return fmt.Errorf("%s: %w", e.Message, sandbox.ErrNotFound)
	case guestproto.CodePathEscape:
		return fmt.Errorf("%s: %w", e.Message, sandbox.ErrPathEscape)
	case guestproto.CodeTooLarge:
		return fmt.Errorf("%s: %w", e.Message, sandbox.ErrTooLarge)
	case guestproto.CodeInvalid:
		return fmt.Errorf("%s: %w", e.Message, sandbox.ErrInvalidSpec)
	case guestproto.CodeDenied:
		return deniedError(e.Message)
	case guestproto.CodeInternal:
		return fmt.Errorf("sandbox %s: the guest failed: %s: %w", c.cfg.ID, e.Message, sandbox.ErrSandboxFailed)
	}
	return fmt.Errorf("sandbox %s: the guest answered with error code %q: %s: %w", c.cfg.ID, e.Code, e.Message, sandbox.ErrSandboxFailed)
}

// deniedError is a file request refused for the commands' user's rights:
// an fs.ErrPermission whose message is the guest's (which says so already).
type deniedError string

func (e deniedError) Error() string { return string(e) }
func (e deniedError) Unwrap() error { return fs.ErrPermission }

// Exec runs one command through the guest.
func (c *Conn) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	if err := req.Validate(); err != nil {
		return sandbox.Result{}, err
	}
	if req.OutputCap > sandbox.MaxFileBytes {
		return sandbox.Result{}, &sandbox.FieldError{Field: "exec.output_cap", Message: fmt.Sprintf("%d is above the %d maximum", req.OutputCap, sandbox.MaxFileBytes)}
	}
	if len(req.Stdin) > sandbox.MaxFileBytes {
		return sandbox.Result{}, fmt.Errorf("exec stdin of %d bytes: %w", len(req.Stdin), sandbox.ErrTooLarge)
	}
	l := c.cfg.Spec.Limits
	msg := &guestproto.Exec{
		Argv: req.Argv, Shell: req.Shell, Workdir: req.Workdir, Timeout: req.Timeout,
		IdleTimeout: req.IdleTimeout, OutputCap: int64(req.OutputCap), Stdin: req.Stdin,
		Env: c.Env(req.Env),
	}
	if msg.Workdir == "" {
		msg.Workdir = c.cfg.Spec.Workdir
	}
	if msg.Timeout == 0 {
		msg.Timeout = l.ExecTimeout
	}
	if msg.OutputCap == 0 {
		msg.OutputCap = int64(l.OutputBytes)
	}
	// The guest enforces the timeout and the watchdog finds a guest that
	// stopped answering; this bounds a guest that answers pings but not the
	// command.
	grace := c.cfg.AnswerGrace
	if grace <= 0 {
		grace = GuestAnswer
	}
	wctx, cancel := context.WithTimeout(ctx, msg.Timeout+grace)
	defer cancel()
	c.execs.Add(1)
	m, err := c.call(wctx, guestproto.TypeExec, msg)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil && !c.IsClosed() {
		// A guest that answers pings but not the command: it was sent a
		// command, so a command may have done it (under gVisor one can
		// read the guest's stdin, /proc/1/fd/0, and take the request
		// while the pings go through; elsewhere a process the command left
		// that SIGKILL does not end holds the answer). Judged as any guest
		// that broke while a command ran: before, it was infrastructure.
		err = c.fail(fmt.Errorf("no answer %v after the command's timeout", grace), true)
	}
	c.execs.Add(-1)
	if err != nil {
		return sandbox.Result{}, err
	}
	var r guestproto.ExecResult
	if err := guestproto.Expect(m, guestproto.TypeExecResult, &r); err != nil {
		return sandbox.Result{}, fmt.Errorf("sandbox %s: %v: %w", c.cfg.ID, err, sandbox.ErrSandboxFailed)
	}
	return sandbox.Result{
		ExitCode: r.ExitCode, Signal: r.Signal,
		Stdout: nonNil(r.Stdout), Stderr: nonNil(r.Stderr),
		StdoutDropped: r.StdoutDropped, StderrDropped: r.StderrDropped,
		TimedOut: r.TimedOut, IdleTimedOut: r.IdleTimedOut, OOMKilled: r.OOMKilled,
		Duration: r.Duration,
	}, nil
}

func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// Env is a command's whole environment: defaults, the spec's, the
// request's, as NAME=VALUE sorted by name.
func (c *Conn) Env(req map[string]string) []string {
	env := map[string]string{"PATH": DefaultPath, "HOME": c.cfg.Spec.Workdir, "LANG": "C.UTF-8"}
	maps.Copy(env, c.cfg.Spec.Env)
	maps.Copy(env, req)
	keys := slices.Sorted(maps.Keys(env))
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, k+"="+env[k])
	}
	return out
}

// ReadFile reads a file through the guest, never following a symlink out of
// the directory it lies under.
func (c *Conn) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	if maxBytes <= 0 || maxBytes > sandbox.MaxFileBytes {
		maxBytes = sandbox.MaxFileBytes
	}
	m, err := c.call(ctx, guestproto.TypeReadFile, &guestproto.ReadFile{Path: path, MaxBytes: maxBytes})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var fd guestproto.FileData
	if err := guestproto.Expect(m, guestproto.TypeFileData, &fd); err != nil {
		return nil, fmt.Errorf("sandbox %s: read %s: %v: %w", c.cfg.ID, path, err, sandbox.ErrSandboxFailed)
	}
	return nonNil(fd.Data), nil
}

// WriteFile writes a file through the guest (mkdir -p, atomic replace),
// only under the workdir and /tmp.
func (c *Conn) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	if len(data) > sandbox.MaxFileBytes {
		return fmt.Errorf("write %s: %d bytes: %w", path, len(data), sandbox.ErrTooLarge)
	}
	m, err := c.call(ctx, guestproto.TypeWriteFile, &guestproto.WriteFile{Path: path, Mode: uint32(mode.Perm()), Data: data})
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := guestproto.Expect(m, guestproto.TypeOK, nil); err != nil {
		return fmt.Errorf("sandbox %s: write %s: %v: %w", c.cfg.ID, path, err, sandbox.ErrSandboxFailed)
	}
	return nil
}

// ListFiles lists a directory through the guest.
func (c *Conn) ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	m, err := c.call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: dir})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var dl guestproto.DirList
	if err := guestproto.Expect(m, guestproto.TypeDirList, &dl); err != nil {
		return nil, fmt.Errorf("sandbox %s: list %s: %v: %w", c.cfg.ID, dir, err, sandbox.ErrSandboxFailed)
	}
	out := make([]sandbox.FileInfo, 0, len(dl.Entries))
	for _, e := range dl.Entries {
		out = append(out, sandbox.FileInfo{
			Name: e.Name, Size: e.Size, Mode: fs.FileMode(e.Mode), IsDir: e.IsDir, ModTime: e.ModTime, Link: e.Link,
		})
	}
	sandbox.SortFileInfos(out)
	return out, nil
}
