package helper

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/wasm/internal/shell"
)

// EnvFD names the environment variable that tells a program it was
// started as a helper, and on which descriptor its connection is.
const EnvFD = "ROLLBOX_WASM_HELPER"

// Main is the helper process: it says hello, takes its Init, confines
// itself, reports what it applied, then runs the execs the host sends (one
// at a time) until the connection closes. It returns the process's exit
// status.
func Main() int {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "compile":
			return compileMain(os.Args[2:])
		case "selftest":
			return selfTestMain(os.Args[2:])
		}
	}
	fd, err := strconv.Atoi(os.Getenv(EnvFD))
	if err != nil || fd < 3 {
		fmt.Fprintf(os.Stderr, "rollbox wasm helper: %s=%q: not started by a WASM backend\n", EnvFD, os.Getenv(EnvFD))
		return 2
	}
	os.Unsetenv(EnvFD)
	f := os.NewFile(uintptr(fd), "host")
	c := newConn(f)
	if err := c.send(mHello, func() []byte { var e encoder; e.uint(Version); return e.b }()); err != nil {
		return 1
	}
	t, b, err := c.recv()
	if err != nil || t != mInit {
		fmt.Fprintf(os.Stderr, "rollbox wasm helper: no init: %v\n", err)
		return 1
	}
	in, err := decodeInit(b)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rollbox wasm helper: %v\n", err)
		return 1
	}
	if in.MaxThreads > 0 {
		debug.SetMaxThreads(in.MaxThreads)
	}
	// A goroutine overflowing its stack kills the process: keep the limit
	// well below the memory a helper may use.
	debug.SetMaxStack(256 << 20)
	// The runtimes open the on-disk cache before the confinement closes
	// the host to this process.
	progs, err := newPrograms(in.CacheDir)
	if err != nil {
		fmt.Fprintf(os.Stderr, "rollbox wasm helper: %v\n", err)
		return 1
	}
	conf := Confinement{}
	if in.Confine {
		conf = confine(in)
	} else {
		conf.Notes = append(conf.Notes, "confinement off (tests of the confinement only)")
	}
	names := map[string]bool{}
	for _, n := range in.Programs {
		names[n] = true
	}
	if err := c.send(mReady, conf.encode()); err != nil {
		return 1
	}
	h := &helperState{c: c, cl: newCaller(c), progs: progs, names: names, execs: map[uint64]context.CancelCauseFunc{}}
	return h.loop()
}

type helperState struct {
	c     *conn
	cl    *caller
	progs *programs
	names map[string]bool

	mu    sync.Mutex
	execs map[uint64]context.CancelCauseFunc
	wg    sync.WaitGroup
}

func (h *helperState) loop() int {
	for {
		t, b, err := h.c.recv()
		if err != nil {
			h.cl.fail(err)
			h.cancelAll()
			h.wg.Wait()
			if errors.Is(err, io.EOF) {
				return 0
			}
			fmt.Fprintf(os.Stderr, "rollbox wasm helper: %v\n", err)
			return 1
		}
		switch t {
		case mExec:
			ex, err := decodeExec(b)
			if err != nil {
				fmt.Fprintf(os.Stderr, "rollbox wasm helper: %v\n", err)
				return 1
			}
			h.start(ex)
		case mCancel:
			cn, err := decodeCancel(b)
			if err != nil {
				return 1
			}
			h.mu.Lock()
			cancel := h.execs[cn.ID]
			h.mu.Unlock()
			if cancel != nil {
				cancel(cancelCause{cn.Reason})
			}
		case mReply:
			if err := h.cl.deliver(b); err != nil {
				fmt.Fprintf(os.Stderr, "rollbox wasm helper: %v\n", err)
				return 1
			}
		default:
			fmt.Fprintf(os.Stderr, "rollbox wasm helper: unexpected message %d\n", t)
			return 1
		}
	}
}

func (h *helperState) cancelAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, c := range h.execs {
		c(cancelCause{CancelClosing})
	}
}

// cancelCause is a host's Cancel, as a context cause.
type cancelCause struct{ reason byte }

func (c cancelCause) Error() string { return "cancelled by the host" }

var (
	errTimeout = errors.New("exec timed out")
	errIdle    = errors.New("exec printed nothing for its idle timeout")
)

func (h *helperState) start(ex Exec) {
	ctx, cancel := context.WithCancelCause(context.Background())
	h.mu.Lock()
	h.execs[ex.ID] = cancel
	h.mu.Unlock()
	h.wg.Add(1)
	go func() {
		defer h.wg.Done()
		dn := h.run(ctx, cancel, ex)
		h.mu.Lock()
		delete(h.execs, ex.ID)
		h.mu.Unlock()
		cancel(nil)
		// A big exec's garbage would count against the next exec's
		// cgroup limit: give it back first.
		if held() > 128<<20 {
			debug.FreeOSMemory()
		}
		h.c.send(mDone, dn.encode())
	}()
}

// run runs one exec: the shell against the host's filesystem, WASI
// programs in this process.
func (h *helperState) run(ctx context.Context, cancel context.CancelCauseFunc, ex Exec) (dn Done) {
	dn.ID = ex.ID
	if ex.HeapLimit > 0 {
		debug.SetMemoryLimit(ex.HeapLimit)
	}
	if ex.Threads > 0 && runtime.GOMAXPROCS(0) != ex.Threads {
		runtime.GOMAXPROCS(ex.Threads) // stops the world: only when it changes
	}
	cpu0 := cpuTime()
	defer func() { dn.CPU = cpuTime() - cpu0 }()
	defer func() {
		if r := recover(); r != nil {
			dn = Done{ID: ex.ID, Internal: fmt.Sprintf("panic: %v\n%s", r, debug.Stack())}
		}
	}()
	timeout := ex.Timeout
	if timeout <= 0 {
		timeout = 24 * time.Hour
	}
	clock := newExecClock(timeout, func() { cancel(errTimeout) })
	defer clock.stop()
	stdout, stderr := sandbox.NewCapture(ex.OutputCap), sandbox.NewCapture(ex.OutputCap)
	var out, errw io.Writer = stdout, stderr
	if ex.IdleTimeout > 0 {
		var last atomic.Int64
		last.Store(time.Now().UnixNano())
		out, errw = &activityWriter{w: stdout, last: &last}, &activityWriter{w: stderr, last: &last}
		done := make(chan struct{})
		defer close(done)
		go func() {
			tick := time.NewTicker(min(ex.IdleTimeout/4, 100*time.Millisecond) + time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-done:
					return
				case <-ctx.Done():
					return
				case <-tick.C:
					if time.Since(time.Unix(0, last.Load())) >= ex.IdleTimeout {
						cancel(errIdle)
						return
					}
				}
			}
		}()
	}
	env := map[string]string{}
	for _, kv := range ex.Env {
		if k, v, ok := bytesCut(kv); ok {
			env[k] = v
		}
	}
	fsys := remoteFS{cl: h.cl, exec: ex.ID}
	runner := &execPrograms{progs: h.progs, cl: h.cl, exec: ex.ID, fs: fsys, memLimit: uint64(ex.MemoryBytes), clock: clock, names: h.names}
	cfg := shell.Config{
		FS: fsys, Env: env, Dir: ex.Dir, Stdin: bytes.NewReader(ex.Stdin), Stdout: out, Stderr: errw,
		Limits:  shell.Limits{MemoryBytes: ex.MemoryBytes, Jobs: ex.Jobs},
		Program: runner,
	}
	var o shell.Outcome
	if ex.Shell != "" {
		o = shell.RunScript(ctx, cfg, ex.Shell)
	} else {
		o = shell.RunArgv(ctx, cfg, ex.Argv)
	}
	if o.Internal != "" {
		return Done{ID: ex.ID, Internal: o.Internal}
	}
	if err := runner.internalErr(); err != nil {
		return Done{ID: ex.ID, Internal: err.Error()}
	}
	dn.ExitCode = o.ExitCode
	if cause := context.Cause(ctx); ctx.Err() != nil && !o.OOM {
		var cc cancelCause
		switch {
		case errors.Is(cause, errTimeout):
			dn.TimedOut, dn.ExitCode = true, 137
		case errors.Is(cause, errIdle):
			dn.TimedOut, dn.IdleTimedOut, dn.ExitCode = true, true, 137
		case errors.As(cause, &cc):
			dn.Cancelled = cc.reason
		}
	}
	dn.Trap, dn.OOMKilled = runner.result()
	dn.OOMKilled = dn.OOMKilled || o.OOM
	if o.Reason != "" {
		fmt.Fprintf(stderr, "rollbox: %s\n", o.Reason)
	}
	dn.Stdout, dn.StdoutDropped = stdout.Bytes(), stdout.Dropped()
	dn.Stderr, dn.StderrDropped = stderr.Bytes(), stderr.Dropped()
	return dn
}

func bytesCut(kv string) (string, string, bool) {
	for i := 0; i < len(kv); i++ {
		if kv[i] == '=' {
			return kv[:i], kv[i+1:], true
		}
	}
	return "", "", false
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

// compileMain is "compile CACHEDIR MODULE...": it compiles the host's guest
// modules (trusted input, given by the host) into the on-disk cache, with
// the same wazero (same version string, same configuration) as the helpers
// that then only read the cache.
func compileMain(args []string) int {
	if len(args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: wasm-helper compile CACHEDIR MODULE.wasm...")
		return 2
	}
	p, err := newPrograms(args[0])
	if err != nil {
		fmt.Fprintf(os.Stderr, "compile: %v\n", err)
		return 1
	}
	for _, m := range args[1:] {
		if _, err := p.loadNamed(context.Background(), m); err != nil {
			fmt.Fprintf(os.Stderr, "compile %s: %v\n", m, err)
			return 1
		}
	}
	return 0
}

// held is the memory the Go runtime holds from the OS (mapped, not
// released).
func held() uint64 {
	ms := []metrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(ms)
	return ms[0].Value.Uint64() - ms[1].Value.Uint64()
}

// cpuTime is this process's CPU time (user + system).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
