//go:build linux

package guest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/internal/guestproto"
	"github.com/rollbox/rollbox/sandbox"
)

// drainGrace is how long output pipes may stay open after a command and its
// leftovers were killed (a process that escaped with our pipe).
const drainGrace = 2 * time.Second

const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// run executes one command to its end and describes what it did. ctx ends
// when the host cancels the request or the guest shuts down: the command is
// killed as on a timeout.
func (s *Server) run(ctx context.Context, req *guestproto.Exec) (*guestproto.ExecResult, error) {
	s.enter() // until the command has started
	started := false
	defer func() {
		if !started {
			s.leave()
		}
	}()
	argv := req.Argv
	if req.Shell != "" {
		if len(argv) > 0 {
			return nil, invalid("exec: both argv and shell are set")
		}
		argv = []string{"/bin/sh", "-c", req.Shell}
	}
	if len(argv) == 0 || argv[0] == "" {
		return nil, invalid("exec: no program")
	}
	if req.Workdir != "" {
		if st, err := os.Stat(req.Workdir); err != nil || !st.IsDir() {
			return nil, invalid(fmt.Sprintf("exec: workdir %q is not a directory", req.Workdir))
		}
	}
	start := time.Now()
	outCap := int(min(req.OutputCap, sandbox.MaxFileBytes))
	if outCap <= 0 {
		outCap = sandbox.DefaultOutputBytes
	}
	stdout, stderr := sandbox.NewCapture(outCap), sandbox.NewCapture(outCap)
	res := &guestproto.ExecResult{}
	finish := func() *guestproto.ExecResult {
		res.Stdout, res.Stderr = stdout.Bytes(), stderr.Bytes()
		res.StdoutDropped, res.StderrDropped = stdout.Dropped(), stderr.Dropped()
		res.Duration = max(time.Since(start), time.Nanosecond)
		return res
	}
	path, err := lookPath(argv[0], req.Env, req.Workdir)
	if err != nil {
		fmt.Fprintf(stderr, "rollbox: %s: %v\n", argv[0], err)
		res.ExitCode = 127
		if errors.Is(err, errNotExecutable) {
			res.ExitCode = 126
		}
		return finish(), nil
	}

	// Pipes: the child's ends (plain descriptors, blocking) go to the
	// fork and are closed here after it; ours are read (or written) until
	// EOF through the runtime's poller. Without stdin the child reads the
	// server's /dev/null.
	var stdinW *os.File
	stdinR, closeStdinR := s.devNull, false
	switch {
	case len(req.Stdin) > 0:
		if stdinR, stdinW, err = childPipe(false); err != nil {
			return nil, err
		}
		closeStdinR = true
	case stdinR < 0:
		if stdinR, err = syscall.Open(os.DevNull, syscall.O_RDONLY|syscall.O_CLOEXEC, 0); err != nil {
			return nil, os.NewSyscallError("open /dev/null", err)
		}
		closeStdinR = true
	}
	closeChildEnds := func(fds ...int) {
		if closeStdinR {
			syscall.Close(stdinR)
		}
		for _, fd := range fds {
			syscall.Close(fd)
		}
	}
	outW, outR, err := childPipe(true)
	if err != nil {
		closeChildEnds()
		if stdinW != nil {
			stdinW.Close()
		}
		return nil, err
	}
	errW, errR, err := childPipe(true)
	if err != nil {
		closeChildEnds(outW)
		outR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		return nil, err
	}
	oomBefore := s.oom.count()
	pid, status, err := s.procs.spawn(ctx, path, argv, req.Env, req.Workdir, []uintptr{uintptr(stdinR), uintptr(outW), uintptr(errW)})
	closeChildEnds(outW, errW)
	if err != nil {
		outR.Close()
		errR.Close()
		if stdinW != nil {
			stdinW.Close()
		}
		var se *sweepError
		if errors.As(err, &se) || ctx.Err() != nil {
			return nil, err // the sandbox's failure, or nobody waits
		}
		if errors.Is(err, syscall.EAGAIN) {
			fmt.Fprintf(stderr, "rollbox: cannot start %s: %v (the pids limit is reached)\n", argv[0], err)
		} else {
			fmt.Fprintf(stderr, "rollbox: %s: %v\n", argv[0], err)
		}
		res.ExitCode = 127
		if !errors.Is(err, syscall.ENOENT) {
			res.ExitCode = 126 // found but could not be run
		}
		return finish(), nil
	}
	cmd := &command{pid: pid}
	s.guardAdd(cmd)
	defer s.guardRemove(cmd)
	started = true
	s.leave()

	if stdinW != nil {
		go func() { // ends when the data is written or the child is gone
			stdinW.Write(req.Stdin)
			stdinW.Close()
		}()
	}
	var lastOutput atomic.Int64
	lastOutput.Store(time.Now().UnixNano())
	var readers sync.WaitGroup
	for _, p := range []struct {
		r *os.File
		w io.Writer
	}{{outR, stdout}, {errR, stderr}} {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, 64<<10)
			for {
				n, err := p.r.Read(buf)
				if n > 0 {
					p.w.Write(buf[:n])
					lastOutput.Store(time.Now().UnixNano())
				}
				if err != nil {
					return
				}
			}
		}()
	}

	timeout := req.Timeout
	if timeout <= 0 {
		timeout = sandbox.DefaultExecTimeout
	}
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	var idle <-chan time.Time
	var idleTimer *time.Timer
	if req.IdleTimeout > 0 {
		idleTimer = time.NewTimer(req.IdleTimeout)
		defer idleTimer.Stop()
		idle = idleTimer.C
	}
	var ws syscall.WaitStatus
wait:
	for {
		select {
		case ws = <-status:
			break wait
		case <-deadline.C:
			res.TimedOut = true
			s.killSession(pid)
		case <-idle:
			since := time.Since(time.Unix(0, lastOutput.Load()))
			if since < req.IdleTimeout {
				idleTimer.Reset(req.IdleTimeout - since)
				continue
			}
			res.TimedOut, res.IdleTimedOut = true, true
			s.killSession(pid)
			idle = nil
		case <-ctx.Done():
			s.killSession(pid)
			ctx = context.Background() // killed once; now wait for the status
		}
	}
	// The command is over: nothing it started may outlive it, and its pipes
	// must reach EOF.
	s.enter()
	if err := s.procs.ended(pid); err != nil {
		s.log.Printf("exec %s: %v", argv[0], err) // the next command's start fails with it
	}
	s.leave()
	drained := make(chan struct{})
	go func() { readers.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainGrace):
		outR.SetReadDeadline(time.Now())
		errR.SetReadDeadline(time.Now())
		<-drained
	}
	switch {
	case ws.Signaled():
		sig := ws.Signal()
		res.Signal = signalName(sig)
		res.ExitCode = 128 + int(sig)
	case ws.Exited():
		res.ExitCode = ws.ExitStatus()
	}
	killed := (ws.Signaled() && ws.Signal() == syscall.SIGKILL) || res.ExitCode == 128+int(syscall.SIGKILL)
	s.enter()
	outR.Close()
	errR.Close()
	if cmd.oomKilled.Load() || (killed && !res.TimedOut && s.oom.count() > oomBefore) {
		res.OOMKilled = true
	}
	s.leave()
	return finish(), nil
}

// childPipe makes a pipe whose one end is a command's (a plain blocking
// descriptor, close-on-exec: the fork dups it) and whose other is ours, in
// the runtime's poller; childWrites says which end the child writes to.
// (os.Pipe puts both ends in the poller, and handing one to a fork takes it
// out again: twice the system calls for every command.)
func childPipe(childWrites bool) (child int, ours *os.File, err error) {
	var p [2]int
	if err := syscall.Pipe2(p[:], syscall.O_CLOEXEC); err != nil {
		return -1, nil, os.NewSyscallError("pipe2", err)
	}
	child, mine := p[0], p[1]
	if childWrites {
		child, mine = p[1], p[0]
	}
	if err := syscall.SetNonblock(mine, true); err != nil {
		syscall.Close(p[0])
		syscall.Close(p[1])
		return -1, nil, os.NewSyscallError("fcntl", err)
	}
	return child, os.NewFile(uintptr(mine), "|"+strconv.Itoa(mine)), nil
}

// killSession kills a command's session, in a request slot: it reads the
// whole of /proc.
func (s *Server) killSession(sid int) {
	s.enter()
	s.procs.killSession(sid)
	s.leave()
}

// command is a running command, as the memory guard sees it.
type command struct {
	pid       int
	oomKilled atomic.Bool
}

var errNotExecutable = errors.New("permission denied")

// lookPath finds prog the way a shell would: a name with a slash is used as
// is (relative to dir), anything else is searched in the command's PATH.
func lookPath(prog string, env []string, dir string) (string, error) {
	if strings.Contains(prog, "/") {
		p := prog
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		return p, checkExecutable(p)
	}
	pathVar := defaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			pathVar = v
		}
	}
	denied := false
	for _, d := range filepath.SplitList(pathVar) {
		if d == "" {
			d = "."
		}
		p := filepath.Join(d, prog)
		if !filepath.IsAbs(p) && dir != "" {
			p = filepath.Join(dir, p)
		}
		switch err := checkExecutable(p); {
		case err == nil:
			return p, nil
		case errors.Is(err, errNotExecutable):
			denied = true
		}
	}
	if denied {
		return "", errNotExecutable
	}
	return "", errors.New("command not found")
}

func checkExecutable(p string) error {
	st, err := os.Stat(p)
	if err != nil {
		return errors.New("command not found")
	}
	if st.IsDir() || syscall.Access(p, 1 /* X_OK */) != nil {
		return errNotExecutable
	}
	return nil
}

var signalNames = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT", syscall.SIGILL: "SIGILL",
	syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT", syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE",
	syscall.SIGKILL: "SIGKILL", syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM", syscall.SIGSTKFLT: "SIGSTKFLT",
	syscall.SIGCHLD: "SIGCHLD", syscall.SIGCONT: "SIGCONT", syscall.SIGSTOP: "SIGSTOP", syscall.SIGTSTP: "SIGTSTP",
	syscall.SIGTTIN: "SIGTTIN", syscall.SIGTTOU: "SIGTTOU", syscall.SIGURG: "SIGURG", syscall.SIGXCPU: "SIGXCPU",
	syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGVTALRM: "SIGVTALRM", syscall.SIGPROF: "SIGPROF", syscall.SIGWINCH: "SIGWINCH",
	syscall.SIGIO: "SIGIO", syscall.SIGPWR: "SIGPWR", syscall.SIGSYS: "SIGSYS",
}

func signalName(s syscall.Signal) string {
	if n, ok := signalNames[s]; ok {
		return n
	}
	return fmt.Sprintf("SIG%d", int(s))
}
