package docker

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/docker/docker/api/types"
	"github.com/docker/docker/api/types/container"
	"github.com/docker/docker/api/types/events"
	"github.com/docker/docker/api/types/filters"
	"github.com/docker/docker/pkg/stdcopy"

	"github.com/rollbox/rollbox/internal/guestproto"
	"github.com/rollbox/rollbox/sandbox"
)

// guestAnswer bounds how long the guest may take beyond a command's own
// timeout before the sandbox is declared broken.
const guestAnswer = 30 * time.Second

// Container is one sandbox: a container whose PID 1 is the guest agent.
type Container struct {
	b      *Backend
	id     string
	spec   sandbox.Spec
	info   sandbox.Info
	guest  *guestproto.Client
	hijack types.HijackedResponse
	demux  chan struct{}  // closed when the attach stream has ended
	pr     *io.PipeReader // the guest's stdout, demultiplexed; read by guest
	log    *guestLog      // the guest's stderr

	created time.Time // before the container was created: its engine events start after

	pending  atomic.Int64 // calls waiting for the guest
	execs    atomic.Int64 // of which commands: what could have broken the guest
	watching atomic.Bool  // the liveness watchdog runs

	closeOnce sync.Once
	closeErr  error

	mu     sync.Mutex
	closed bool
	broken error // the verdict on the guest's failure: every later call returns it
}

func newContainer(b *Backend, id string, spec sandbox.Spec, ref, imageID string, created time.Time) *Container {
	return &Container{
		b: b, id: id, spec: spec, demux: make(chan struct{}), log: newGuestLog(guestLogBytes), created: created,
		info: sandbox.Info{
			ID: id[:12], Backend: "docker", Image: ref, ImageDigest: imageID, Runtime: spec.Runtime,
			Network: spec.Network, Limits: spec.Limits, Workdir: spec.Workdir,
		},
	}
}

// start attaches (before the start, so nothing the guest says is lost),
// starts the container and says hello to the guest.
func (c *Container) start(ctx context.Context) error {
	var err error
	c.hijack, err = c.b.cli.ContainerAttach(ctx, c.id, container.AttachOptions{
		Stream: true, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		close(c.demux)
		return translate("attach to container "+c.info.ID, err)
	}
	pr, pw := io.Pipe()
	c.pr = pr
	go func() {
		defer close(c.demux)
		_, err := stdcopy.StdCopy(pw, c.log, c.hijack.Reader)
		pw.CloseWithError(err) // nil: io.EOF for the reader
	}()
	c.guest = guestproto.NewClient(pr, c.hijack.Conn)
	if err := c.b.cli.ContainerStart(ctx, c.id, container.StartOptions{}); err != nil {
		return translate("start container "+c.info.ID, err)
	}
	// Replies are sealed with a fresh key: a command that reaches the
	// guest's stream (gVisor lets it open /proc/1/fd/1) cannot forge them.
	key := make([]byte, guestproto.KeySize)
	rand.Read(key)
	c.guest.Authenticate(key)
	hello := &guestproto.Hello{
		Version:       int(guestproto.Version),
		WritableRoots: []string{c.spec.Workdir, "/tmp"},
		SharedRoots:   []string{"/tmp"},
		Key:           key,
	}
	if c.spec.Runtime == sandbox.RuntimeRunsc {
		hello.MemoryGuardBytes = int64(c.spec.Limits.MemoryMB) << 20
		hello.ProcessLimit = int64(c.spec.Limits.PIDs + guestThreads)
	}
	hctx, cancel := context.WithTimeout(ctx, guestAnswer)
	defer cancel()
	m, err := c.call(hctx, guestproto.TypeHello, hello)
	if err != nil {
		if ctx.Err() == nil && hctx.Err() != nil {
			return fmt.Errorf("sandbox %s: the guest did not answer in %v%s: %w", c.info.ID, guestAnswer, c.logTail(), sandbox.ErrSandboxFailed)
		}
		return err
	}
	var reply guestproto.HelloReply
	if err := guestproto.Expect(m, guestproto.TypeHelloReply, &reply); err != nil {
		return fmt.Errorf("sandbox %s: hello: %v: %w", c.info.ID, err, sandbox.ErrSandboxFailed)
	}
	if !reply.Sealed {
		return fmt.Errorf("sandbox %s: the guest (%s) does not seal its replies: rebuild it from this source: %w", c.info.ID, reply.Agent, sandbox.ErrSandboxFailed)
	}
	return nil
}

// Info describes the sandbox as it runs.
func (c *Container) Info() sandbox.Info { return c.info }

// call sends one request to the guest and translates what can go wrong
// with the sandbox (not with the request) into ErrClosed, ErrSandboxFailed
// or ErrSandboxAbuse (see fail).
func (c *Container) call(ctx context.Context, t guestproto.Type, body guestproto.Payload) (guestproto.Message, error) {
	if c.isClosed() {
		return guestproto.Message{}, fmt.Errorf("sandbox %s: %w", c.info.ID, sandbox.ErrClosed)
	}
	if err := c.brokenErr(); err != nil {
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
		return m, c.guestError(ge)
	case c.isClosed():
		return m, fmt.Errorf("sandbox %s: %w", c.info.ID, sandbox.ErrClosed)
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		if b := c.brokenErr(); b != nil {
			return m, b
		}
		return m, err
	}
	return m, c.fail(fmt.Errorf("guest connection lost: %w", err), c.execs.Load() > 0)
}

func (c *Container) brokenErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.broken
}

// fail records that the guest broke (its stream ended or went wrong, or it
// stopped answering) and returns the verdict, the same for every call from
// now on; the stream is cut so that every pending call ends with it.
// duringCommand says whether a command was running when it broke: only a
// command can have done it then.
func (c *Container) fail(cause error, duringCommand bool) error {
	if b := c.brokenErr(); b != nil {
		return b
	}
	verdict := c.judge(cause, duringCommand)
	c.mu.Lock()
	if c.broken == nil {
		c.broken = verdict
	}
	verdict = c.broken
	c.mu.Unlock()
	if c.hijack.Conn != nil {
		c.hijack.Close()
	}
	if c.pr != nil {
		c.pr.CloseWithError(verdict)
	}
	return verdict
}

// judge decides whose failure a broken guest is. The engine's own failures
// are infrastructure (ErrEngineUnavailable, ErrSandboxFailed): the engine
// does not answer, the container was removed, or the engine was asked to
// kill, stop or pause it (its events say so; a signal from inside leaves no
// such event). So is a guest that broke while no command ran (nothing of
// the agent's exists then: the guest kills every process between
// commands), or that panicked (a bug of its own). Otherwise the commands
// running in the sandbox killed or froze the guest (gVisor lets a command
// signal PID 1), garbled its stream (gVisor lets it write to /proc/1/fd/1)
// or starved it: ErrSandboxAbuse, the agent's doing, which also wraps
// ErrSandboxFailed.
func (c *Container) judge(cause error, duringCommand bool) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	what := fmt.Sprintf("sandbox %s: %v", c.info.ID, cause)
	in, err := c.b.cli.ContainerInspect(ctx, c.id)
	switch {
	case isNotFound(err):
		return fmt.Errorf("%s: the container was removed from outside: %w", what, sandbox.ErrSandboxFailed)
	case err != nil:
		return fmt.Errorf("%s: %w", what, translate("inspect the container", err))
	}
	if in.State != nil {
		what += fmt.Sprintf(" (container %s, exit code %d", in.State.Status, in.State.ExitCode)
		if in.State.OOMKilled {
			what += ", OOM-killed"
		}
		what += ")"
	}
	what += c.tampered()
	if action := c.engineAction(ctx); action != "" {
		return fmt.Errorf("%s: the engine was asked to %s the container%s: %w", what, action, c.logTail(), sandbox.ErrSandboxFailed)
	}
	if in.State != nil && in.State.Paused {
		return fmt.Errorf("%s: the container is paused%s: %w", what, c.logTail(), sandbox.ErrSandboxFailed)
	}
	if !duringCommand {
		return fmt.Errorf("%s%s: %w", what, c.logTail(), sandbox.ErrSandboxFailed)
	}
	if strings.Contains(c.log.String(), "panic: ") {
		return fmt.Errorf("%s: the guest panicked%s: %w", what, c.logTail(), sandbox.ErrSandboxFailed)
	}
	return fmt.Errorf("%s while a command ran in it%s: %w (%w)", what, c.logTail(), sandbox.ErrSandboxAbuse, sandbox.ErrSandboxFailed)
}

// engineAction names what the engine was asked to do to the container since
// it was created that breaks its guest ("kill (signal 9)", "pause",
// "stop"), or "" when nothing: a command's signal to PID 1 leaves no event.
func (c *Container) engineAction(ctx context.Context) string {
	now := time.Now()
	msgs, errs := c.b.cli.Events(ctx, events.ListOptions{
		Since: strconv.FormatInt(c.created.Add(-time.Second).Unix(), 10),
		Until: fmt.Sprintf("%d.%09d", now.Unix(), now.Nanosecond()),
		Filters: filters.NewArgs(filters.Arg("type", string(events.ContainerEventType)),
			filters.Arg("container", c.id)),
	})
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return ""
			}
			switch m.Action {
			case events.ActionKill:
				return "kill (signal " + m.Actor.Attributes["signal"] + ")"
			case events.ActionStop, events.ActionPause, events.ActionRestart, events.ActionDestroy:
				return string(m.Action)
			}
		case <-errs:
			return ""
		case <-ctx.Done():
			return ""
		}
	}
}

// livenessEvery is how often the watchdog pings the guest while calls wait
// for it; each ping must be answered within Options.GuestTimeout. A guest
// that does not (frozen by SIGSTOP, a stream a command desynchronised)
// fails the sandbox then, not when the command's timeout has passed.
const livenessEvery = time.Second

// watch starts the liveness watchdog unless it runs.
func (c *Container) watch() {
	if c.watching.CompareAndSwap(false, true) {
		go c.watchdog()
	}
}

func (c *Container) watchdog() {
	t := time.NewTicker(livenessEvery)
	defer t.Stop()
	for {
		select {
		case <-t.C:
		case <-c.guest.Done():
			c.watching.Store(false)
			return
		}
		if c.pending.Load() == 0 || c.isClosed() || c.brokenErr() != nil {
			c.watching.Store(false)
			// A call that started meanwhile saw the flag still set: go on
			// watching for it.
			if c.pending.Load() == 0 || c.isClosed() || c.brokenErr() != nil || !c.watching.CompareAndSwap(false, true) {
				return
			}
			continue
		}
		duringCommand := c.execs.Load() > 0
		ctx, cancel := context.WithTimeout(context.Background(), c.b.opts.GuestTimeout)
		_, err := c.guest.Call(ctx, guestproto.TypePing, nil)
		timedOut := ctx.Err() != nil
		cancel()
		if err != nil && timedOut && !c.isClosed() {
			c.fail(fmt.Errorf("the guest did not answer a ping in %v", c.b.opts.GuestTimeout), duringCommand || c.execs.Load() > 0)
		}
		// A stream that ended is the pending calls' to report.
	}
}

// tampered says how many forged replies were dropped, if any: the sign that
// a command wrote into the guest's stream.
func (c *Container) tampered() string {
	if n := c.guest.Rejected(); n > 0 {
		return fmt.Sprintf(" (%d unauthenticated replies dropped: a command wrote into the guest's stream)", n)
	}
	return ""
}

func (c *Container) logTail() string {
	if s := c.log.String(); s != "" {
		return "; guest log: " + s
	}
	return ""
}

// guestError maps the guest's error codes to sandbox error kinds: what the
// request got wrong is the caller's (ErrNotFound, ErrPathEscape,
// ErrTooLarge, ErrInvalidSpec, fs.ErrPermission); what the guest failed at
// itself, or a code this host does not know, is the sandbox's
// (ErrSandboxFailed).
func (c *Container) guestError(e *guestproto.Error) error {
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
		return fmt.Errorf("sandbox %s: the guest failed: %s: %w", c.info.ID, e.Message, sandbox.ErrSandboxFailed)
	}
	return fmt.Errorf("sandbox %s: the guest answered with error code %q: %s: %w", c.info.ID, e.Code, e.Message, sandbox.ErrSandboxFailed)
}

// deniedError is a file request refused for the commands' user's rights:
// an fs.ErrPermission whose message is the guest's (which says so already).
type deniedError string

func (e deniedError) Error() string { return string(e) }
func (e deniedError) Unwrap() error { return fs.ErrPermission }

// Exec runs one command through the guest.
func (c *Container) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.Result, error) {
	if err := req.Validate(); err != nil {
		return sandbox.Result{}, err
	}
	if req.OutputCap > sandbox.MaxFileBytes {
		return sandbox.Result{}, &sandbox.FieldError{Field: "exec.output_cap", Message: fmt.Sprintf("%d is above the %d maximum", req.OutputCap, sandbox.MaxFileBytes)}
	}
	if len(req.Stdin) > sandbox.MaxFileBytes {
		return sandbox.Result{}, fmt.Errorf("exec stdin of %d bytes: %w", len(req.Stdin), sandbox.ErrTooLarge)
	}
	l := c.spec.Limits
	msg := &guestproto.Exec{
		Argv: req.Argv, Shell: req.Shell, Workdir: req.Workdir, Timeout: req.Timeout,
		IdleTimeout: req.IdleTimeout, OutputCap: int64(req.OutputCap), Stdin: req.Stdin,
		Env: c.env(req.Env),
	}
	if msg.Workdir == "" {
		msg.Workdir = c.spec.Workdir
	}
	if msg.Timeout == 0 {
		msg.Timeout = l.ExecTimeout
	}
	if msg.OutputCap == 0 {
		msg.OutputCap = int64(l.OutputBytes)
	}
	// The guest enforces the timeout and the watchdog finds a guest that
	// stopped answering; this bounds a guest that answers pings but not the
	// command (a bug of its own: it always answers in time otherwise).
	wctx, cancel := context.WithTimeout(ctx, msg.Timeout+guestAnswer)
	defer cancel()
	c.execs.Add(1)
	m, err := c.call(wctx, guestproto.TypeExec, msg)
	if err != nil && ctx.Err() == nil && wctx.Err() != nil && !c.isClosed() {
		err = c.fail(fmt.Errorf("no answer %v after the command's timeout", guestAnswer), false)
	}
	c.execs.Add(-1)
	if err != nil {
		return sandbox.Result{}, err
	}
	var r guestproto.ExecResult
	if err := guestproto.Expect(m, guestproto.TypeExecResult, &r); err != nil {
		return sandbox.Result{}, fmt.Errorf("sandbox %s: %v: %w", c.info.ID, err, sandbox.ErrSandboxFailed)
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

// env is a command's whole environment: defaults, the spec's, the request's.
func (c *Container) env(req map[string]string) []string {
	env := map[string]string{"PATH": defaultPath, "HOME": c.spec.Workdir, "LANG": "C.UTF-8"}
	maps.Copy(env, c.spec.Env)
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
func (c *Container) ReadFile(ctx context.Context, path string, maxBytes int64) ([]byte, error) {
	if maxBytes <= 0 || maxBytes > sandbox.MaxFileBytes {
		maxBytes = sandbox.MaxFileBytes
	}
	m, err := c.call(ctx, guestproto.TypeReadFile, &guestproto.ReadFile{Path: path, MaxBytes: maxBytes})
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	var fd guestproto.FileData
	if err := guestproto.Expect(m, guestproto.TypeFileData, &fd); err != nil {
		return nil, fmt.Errorf("sandbox %s: read %s: %v: %w", c.info.ID, path, err, sandbox.ErrSandboxFailed)
	}
	return nonNil(fd.Data), nil
}

// WriteFile writes a file through the guest (mkdir -p, atomic replace),
// only under the workdir and /tmp.
func (c *Container) WriteFile(ctx context.Context, path string, data []byte, mode fs.FileMode) error {
	if len(data) > sandbox.MaxFileBytes {
		return fmt.Errorf("write %s: %d bytes: %w", path, len(data), sandbox.ErrTooLarge)
	}
	m, err := c.call(ctx, guestproto.TypeWriteFile, &guestproto.WriteFile{Path: path, Mode: uint32(mode.Perm()), Data: data})
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := guestproto.Expect(m, guestproto.TypeOK, nil); err != nil {
		return fmt.Errorf("sandbox %s: write %s: %v: %w", c.info.ID, path, err, sandbox.ErrSandboxFailed)
	}
	return nil
}

// ListFiles lists a directory through the guest.
func (c *Container) ListFiles(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	m, err := c.call(ctx, guestproto.TypeListDir, &guestproto.ListDir{Path: dir})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", dir, err)
	}
	var dl guestproto.DirList
	if err := guestproto.Expect(m, guestproto.TypeDirList, &dl); err != nil {
		return nil, fmt.Errorf("sandbox %s: list %s: %v: %w", c.info.ID, dir, err, sandbox.ErrSandboxFailed)
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

func (c *Container) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Close ends every call in flight (they fail with ErrClosed), closes the
// attach connection and force-removes the container with its volumes, and
// returns once the engine says the container does not exist. Idempotent and
// safe to call concurrently; it runs to the end even if the caller's context
// is gone.
//
// # Errors
//
// A remove that fails (dockerd under load: "did not receive an exit event",
// "PID ... is zombie"), or that the engine accepts while the container is
// still there, is retried with back-off for Options.RemoveTimeout; then
// Close returns an ErrSandboxFailed naming the container, the attempts and
// the last failure, and Backend.RemoveFailures counts it. `rollbox gc`
// removes such a container later.
func (c *Container) Close() error {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.closed = true
		c.mu.Unlock()
		if c.hijack.Conn != nil {
			c.hijack.Close()
		}
		if c.pr != nil {
			// The demultiplexer may be blocked writing to a reader that
			// stopped at a bad frame (a command wrote into the guest's
			// stream): closing the conn alone would not end it.
			c.pr.CloseWithError(sandbox.ErrClosed)
		}
		if err := c.b.remove(c.id); err != nil {
			c.b.removeFailures.Add(1)
			c.closeErr = err
		}
		<-c.demux
	})
	return c.closeErr
}

// guestLogBytes bounds what a sandbox keeps of its guest's stderr: half
// from the start, half from the end.
const guestLogBytes = 16 << 10

// guestLog keeps the head and the tail of the guest's stderr. A Go crash
// names its cause on its first lines ("fatal error: ...", "panic: ...") and
// then dumps every goroutine, often far more than the cap: a tail alone
// would keep the stacks and lose the cause.
type guestLog struct {
	limit int
	c     *sandbox.Capture
}

func newGuestLog(limit int) *guestLog {
	return &guestLog{limit: limit, c: sandbox.NewCapture(limit)}
}

func (l *guestLog) Write(p []byte) (int, error) { return l.c.Write(p) }

// String is the kept log, with what was left out of its middle marked.
func (l *guestLog) String() string {
	b := l.c.Bytes()
	dropped := l.c.Dropped()
	if dropped == 0 {
		return string(b)
	}
	head := l.limit - l.limit/2 // sandbox.NewCapture's split
	return fmt.Sprintf("%s\n[... %d bytes of the guest's log left out ...]\n%s", b[:head], dropped, b[head:])
}
