package helper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rollbox/rollbox/sandbox/wasm/internal/vfs"
)

// Errors of a helper seen from the host.
var (
	// ErrDied: the helper died while running an exec. The exec's own
	// commands are the suspects: one exec runs in a helper at a time.
	ErrDied = errors.New("helper process died")
	// ErrUnavailable: a helper could not be started or did not answer.
	ErrUnavailable = errors.New("helper process unavailable")
)

// Program is what the host answers about a program name: the module's
// host path, the host directories it mounts read-only (host → guest), and
// environment it adds.
type Program struct {
	// Argv0 is the name the program is run as (python3 for CPython).
	Argv0  string
	Path   string
	Mounts map[string]string
	Env    []string
}

// Hooks are what an exec needs from the host beyond its filesystem.
type Hooks struct {
	// Program resolves (building and compiling into the on-disk cache if
	// needed) a named guest program. An error is infrastructure unless it
	// wraps fs.ErrNotExist.
	Program func(ctx context.Context, name string) (Program, error)
	// Slots bounds the WASI instances running at once across helpers.
	Slots chan struct{}
}

// StartOptions say how to start a helper.
type StartOptions struct {
	// Command is the helper program and its arguments.
	Command []string
	Init    Init
	// Cgroup, when set, is created for the helper and holds it, with the
	// memory and pids limits below.
	Cgroup *Cgroups
	// MemoryBase is the helper's memory beyond what an exec may use (Go
	// runtime, compiled modules): its cgroup limit is MemoryBase plus
	// twice the exec's memory limit plus its output.
	MemoryBase int64
	// Pids bounds the helper's threads in its cgroup.
	Pids int
}

// Process is one running helper, seen from the host. It runs one exec at
// a time, so a helper that dies mid-exec was killed by that exec.
type Process struct {
	opts   StartOptions
	cmd    *exec.Cmd
	conn   *conn
	conf   Confinement
	cg     *cgroup
	stderr *tail
	pid    int

	mu      sync.Mutex
	cur     *run
	nextID  uint64
	memSet  int64
	dead    chan struct{}
	death   error
	byHost  bool // the host killed it
	waitErr error
	// exited is closed once Wait returned: waitErr and the command's
	// ProcessState are read only after it.
	exited chan struct{}
}

// run is the exec in flight.
type run struct {
	id    uint64
	fs    vfs.FileSystem
	hooks Hooks
	done  chan Done
	ctx   context.Context // ends with the exec

	mu      sync.Mutex
	handles map[uint64]vfs.File
	nextH   uint64
	slots   int
	extend  time.Duration // time the watchdog must not count (slot waits, program loads)
	extendC chan time.Duration
}

// tail keeps the head and the end of a helper's stderr, for the error
// that reports its death (Go's fatal errors print their cause first).
type tail struct {
	mu   sync.Mutex
	head []byte
	end  []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if room := 2048 - len(t.head); room > 0 {
		t.head = append(t.head, p[:min(room, len(p))]...)
	}
	t.end = append(t.end, p...)
	if len(t.end) > 2048 {
		t.end = append([]byte(nil), t.end[len(t.end)-2048:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := strings.TrimSpace(string(t.head))
	if len(t.end) > 0 && !strings.Contains(string(t.head), strings.TrimSpace(string(t.end))) {
		s += " … " + strings.TrimSpace(string(t.end))
	}
	return s
}

// Start starts a helper, places it in its cgroup, initialises it and waits
// until it has confined itself.
func Start(ctx context.Context, opts StartOptions) (*Process, error) {
	if len(opts.Command) == 0 {
		return nil, fmt.Errorf("%w: no helper program", ErrUnavailable)
	}
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: socketpair: %v", ErrUnavailable, err)
	}
	mine := os.NewFile(uintptr(fds[0]), "helper")
	theirs := os.NewFile(uintptr(fds[1]), "helper-end")
	p := &Process{opts: opts, stderr: &tail{}, dead: make(chan struct{}), exited: make(chan struct{})}
	cmd := exec.Command(opts.Command[0], opts.Command[1:]...)
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.Env = []string{"ROLLBOX_WASM_HELPER=3", "GOTRACEBACK=single"}
	cmd.Dir = "/"
	cmd.Stderr = p.stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	err = cmd.Start()
	// The child has its end now: without ours closed, its exit would not
	// be seen as EOF.
	theirs.Close()
	if err != nil {
		mine.Close()
		return nil, fmt.Errorf("%w: start %s: %v", ErrUnavailable, opts.Command[0], err)
	}
	p.cmd, p.pid = cmd, cmd.Process.Pid
	p.conn = newConn(mine)
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
		mine.Close()
	}()
	fail := func(err error) (*Process, error) {
		p.kill()
		return nil, fmt.Errorf("%w: %v%s", ErrUnavailable, err, p.stderrNote())
	}
	if opts.Cgroup != nil {
		cg, err := opts.Cgroup.create(p.pid, opts.Pids)
		if err != nil {
			return fail(fmt.Errorf("cgroup: %v", err))
		}
		p.cg = cg
	}
	// Handshake, bounded: a program that does not speak the protocol (a
	// binary without the helper) must not hang the backend.
	type frame struct {
		t   byte
		b   []byte
		err error
	}
	ch := make(chan frame, 1)
	recv := func() (byte, []byte, error) {
		go func() {
			t, b, err := p.conn.recv()
			ch <- frame{t, b, err}
		}()
		select {
		case f := <-ch:
			return f.t, f.b, f.err
		case <-time.After(20 * time.Second):
			return 0, nil, errors.New("no answer within 20s")
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
	t, b, err := recv()
	if err != nil || t != mHello {
		return fail(fmt.Errorf("no hello from %s (got %d, %v): is it the WASM helper?", opts.Command[0], t, err))
	}
	d := decoder{b: b}
	if v := d.uint(); v != Version || d.done() != nil {
		return fail(fmt.Errorf("helper speaks protocol %d, the host %d: rebuild it", v, Version))
	}
	if err := p.conn.send(mInit, opts.Init.encode()); err != nil {
		return fail(err)
	}
	t, b, err = recv()
	if err != nil || t != mReady {
		return fail(fmt.Errorf("helper did not get ready (got %d, %v)", t, err))
	}
	if p.conf, err = decodeConfinement(b); err != nil {
		return fail(err)
	}
	go p.serve()
	return p, nil
}

func (p *Process) stderrNote() string {
	if s := p.stderr.String(); s != "" {
		return ": " + s
	}
	return ""
}

// Confinement is what the helper applied to itself.
func (p *Process) Confinement() Confinement { return p.conf }

// Pid is the helper's process id.
func (p *Process) Pid() int { return p.pid }

// Alive reports whether the helper can take an exec.
func (p *Process) Alive() bool {
	select {
	case <-p.dead:
		return false
	default:
		return true
	}
}

// Kill stops the helper (its exec, if any, fails as the host's doing).
func (p *Process) Kill() { p.kill() }

func (p *Process) kill() {
	p.mu.Lock()
	p.byHost = true
	p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Kill()
	}
	if p.conn != nil {
		if c, ok := p.conn.w.(io.Closer); ok {
			c.Close()
		}
	}
}

// serve reads the helper's frames until it dies: requests are answered
// (file system calls inline, programs and slots in goroutines, as they
// may wait), results handed to the exec.
func (p *Process) serve() {
	var err error
	for {
		var t byte
		var b []byte
		t, b, err = p.conn.recv()
		if err != nil {
			break
		}
		switch t {
		case mRequest:
			err = p.request(b)
		case mDone:
			var dn Done
			if dn, err = decodeDone(b); err == nil {
				p.mu.Lock()
				r := p.cur
				p.mu.Unlock()
				if r == nil || r.id != dn.ID {
					err = fmt.Errorf("%w: result of exec %d, none running", errProto, dn.ID)
				} else {
					r.done <- dn
				}
			}
		default:
			err = fmt.Errorf("%w: message type %d", errProto, t)
		}
		if err != nil {
			break
		}
	}
	// A protocol error is the helper's (and so its exec's) doing too:
	// nothing but our code and what the exec made it do writes there.
	p.mu.Lock()
	byHost := p.byHost
	p.mu.Unlock()
	p.kill()
	// Wait for the process to report how it ended.
	var st *os.ProcessState
	select {
	case <-p.exited:
		st = p.cmd.ProcessState
	case <-time.After(2 * time.Second):
	}
	cause := "connection lost: " + err.Error()
	if st != nil {
		cause = st.String()
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL && p.cg != nil && p.cg.oomKilled() {
			cause = "killed by its memory limit (cgroup)"
		}
	}
	if errors.Is(err, errProto) {
		cause = err.Error() + " (" + cause + ")"
	}
	if p.cg != nil {
		p.cg.remove() // after reading why it died
	}
	p.mu.Lock()
	if byHost && p.death == nil {
		p.death = fmt.Errorf("%w: stopped by the host", ErrUnavailable)
	} else if p.death == nil {
		p.death = fmt.Errorf("%w: %s%s", ErrDied, cause, p.stderrNote())
	}
	p.mu.Unlock()
	close(p.dead)
}

// Run runs one exec on the helper against fsys. It returns the helper's
// result, or ErrDied (the exec killed its helper), or ErrUnavailable, or
// the context's error after cancelling the exec.
func (p *Process) Run(ctx context.Context, ex Exec, fsys vfs.FileSystem, hooks Hooks) (Done, error) {
	p.mu.Lock()
	if p.cur != nil {
		p.mu.Unlock()
		return Done{}, fmt.Errorf("%w: busy", ErrUnavailable)
	}
	p.nextID++
	ex.ID = p.nextID
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{id: ex.ID, fs: fsys, hooks: hooks, done: make(chan Done, 1), ctx: rctx,
		handles: map[uint64]vfs.File{}, extendC: make(chan time.Duration, 16)}
	p.cur = r
	p.mu.Unlock()
	defer p.finish(r)
	memLimit := p.opts.MemoryBase + 2*ex.MemoryBytes + 4*int64(ex.OutputCap) + int64(len(ex.Stdin))
	ex.HeapLimit = memLimit - memLimit/8
	if p.cg != nil {
		limit := memLimit
		if limit != p.memSet {
			changed, err := p.cg.setMemory(limit)
			if err != nil {
				return Done{}, fmt.Errorf("%w: cgroup memory limit %d: %v", ErrUnavailable, limit, err)
			}
			if changed {
				p.memSet = limit
			}
		}
	}
	if err := p.conn.send(mExec, ex.encode()); err != nil {
		<-p.dead
		return Done{}, p.deathErr()
	}
	// The watchdog: the helper enforces the timeout; past it and a grace
	// (plus the time spent waiting for slots and programs, which the
	// helper's clock does not count), the helper is stuck and is killed.
	grace := 10 * time.Second
	limit := ex.Timeout + grace
	if ex.Timeout <= 0 {
		limit = 24 * time.Hour
	}
	started := time.Now()
	watchdog := time.NewTimer(limit)
	defer watchdog.Stop()
	cancelled := false
	for {
		select {
		case dn := <-r.done:
			return dn, nil
		case <-p.dead:
			// A result may have arrived just before the end.
			select {
			case dn := <-r.done:
				return dn, nil
			default:
			}
			return Done{}, p.deathErr()
		case d := <-r.extendC:
			limit += d
			watchdog.Reset(max(limit-time.Since(started), time.Millisecond))
		case <-ctx.Done():
			if cancelled {
				continue
			}
			cancelled = true
			reason := byte(CancelCaller)
			if errors.Is(context.Cause(ctx), ErrClosing) {
				reason = CancelClosing
			}
			p.conn.send(mCancel, Cancel{ID: ex.ID, Reason: reason}.encode())
			watchdog.Reset(2 * time.Second)
		case <-watchdog.C:
			p.kill()
			<-p.dead
			if cancelled {
				return Done{}, context.Cause(ctx)
			}
			// Stuck past its timeout: the exec timed out.
			return Done{ID: ex.ID, ExitCode: 137, TimedOut: true}, nil
		}
	}
}

// prefetch is how much of a file opened for reading comes with the open.
const prefetch = 64 << 10

// ErrClosing is the cancel cause a sandbox's Close gives its execs.
var ErrClosing = errors.New("sandbox closing")

func (p *Process) deathErr() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.death
}

// finish closes what the exec left open and releases its slots.
func (p *Process) finish(r *run) {
	r.mu.Lock()
	for h, f := range r.handles {
		f.Close()
		delete(r.handles, h)
	}
	for ; r.slots > 0; r.slots-- {
		<-r.hooks.Slots
	}
	r.mu.Unlock()
	p.mu.Lock()
	if p.cur == r {
		p.cur = nil
	}
	p.mu.Unlock()
}

func (r *run) extendBy(d time.Duration) {
	select {
	case r.extendC <- d:
	default:
	}
}

// request answers one request of the helper.
func (p *Process) request(b []byte) error {
	d := &decoder{b: b}
	id, execID, op := d.uint(), d.uint(), byte(d.intn(255))
	if d.err != nil || op == 0 || op >= opLast {
		return fmt.Errorf("%w: bad request header", errProto)
	}
	p.mu.Lock()
	r := p.cur
	p.mu.Unlock()
	// reply sends err and, when there is no error (or always, for reads
	// and writes, whose counts matter with an error too), the results.
	reply := func(err error, results func(*encoder)) error {
		if id == 0 {
			return nil
		}
		var e encoder
		e.uint(id)
		encodeErr(&e, err)
		if results != nil && (err == nil || op == opRead || op == opPread || op == opWrite || op == opPwrite) {
			results(&e)
		}
		return p.conn.send(mReply, e.b)
	}
	if r == nil || r.id != execID {
		// A request for an exec that ended: its handles are closed.
		if op == opSlotRelease {
			return nil
		}
		return reply(&fs.PathError{Op: "request", Path: "", Err: syscall.EBADF}, nil)
	}
	switch op {
	case opProgram:
		name := d.str(256)
		if err := d.done(); err != nil {
			return err
		}
		go func() {
			start := time.Now()
			prog, err := r.hooks.Program(r.ctx, name)
			r.extendBy(time.Since(start))
			reply(err, func(e *encoder) {
				e.str(prog.Argv0)
				e.str(prog.Path)
				var mounts []string
				for h, g := range prog.Mounts {
					mounts = append(mounts, h, g)
				}
				e.strs(mounts)
				e.strs(prog.Env)
			})
		}()
		return nil
	case opSlot:
		if err := d.done(); err != nil {
			return err
		}
		go func() {
			start := time.Now()
			select {
			case r.hooks.Slots <- struct{}{}:
				r.mu.Lock()
				r.slots++
				r.mu.Unlock()
				r.extendBy(time.Since(start))
				reply(nil, nil)
			case <-r.ctx.Done():
				reply(r.ctx.Err(), nil)
			}
		}()
		return nil
	case opSlotRelease:
		if err := d.done(); err != nil {
			return err
		}
		r.mu.Lock()
		if r.slots > 0 {
			r.slots--
			<-r.hooks.Slots
		}
		r.mu.Unlock()
		return nil
	}
	return p.fsRequest(r, d, op, reply)
}

// fsRequest runs a file system call on the exec's episode filesystem.
func (p *Process) fsRequest(r *run, d *decoder, op byte, reply func(error, func(*encoder)) error) error {
	fsys := r.fs
	handle := func() (vfs.File, uint64) {
		h := d.uint()
		r.mu.Lock()
		f := r.handles[h]
		r.mu.Unlock()
		return f, h
	}
	badHandle := &fs.PathError{Op: "file", Err: syscall.EBADF}
	switch op {
	case opRead, opPread, opWrite, opPwrite, opSeek, opFstat, opReadDirH, opFtruncate, opClose, opSetAppend, opSetModTime:
		f, h := handle()
		var off int64
		switch op {
		case opPread, opPwrite:
			off = d.int()
		}
		switch op {
		case opRead, opPread:
			n := d.intn(maxIO)
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			buf := make([]byte, n)
			var k int
			var err error
			if op == opRead {
				k, err = f.Read(buf)
			} else {
				k, err = f.ReadAt(buf, off)
			}
			return reply(err, func(e *encoder) { e.bytes(buf[:k]) })
		case opWrite, opPwrite:
			data := d.bytes(maxIO)
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			var k int
			var err error
			if op == opWrite {
				k, err = f.Write(data)
			} else {
				k, err = f.WriteAt(data, off)
			}
			return reply(err, func(e *encoder) { e.uint(uint64(k)) })
		case opSeek:
			offset, whence := d.int(), d.intn(2)
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			pos, err := f.Seek(offset, whence)
			return reply(err, func(e *encoder) { e.int(pos) })
		case opFstat:
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			fi, err := f.Stat()
			return reply(err, func(e *encoder) { encodeInfo(e, fi) })
		case opReadDirH:
			n := int(d.int())
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			if n <= 0 || n > 4096 {
				n = 4096 // bounded either way; the caller asks again
			}
			ents, err := f.ReadDir(n)
			return reply(err, func(e *encoder) { encodeEntries(e, ents) })
		case opFtruncate:
			size := d.int()
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			return reply(f.Truncate(size), nil)
		case opClose:
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			r.mu.Lock()
			delete(r.handles, h)
			r.mu.Unlock()
			return reply(f.Close(), nil)
		case opSetAppend:
			on := d.bool()
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			return reply(f.SetAppend(on), nil)
		case opSetModTime:
			t := d.int()
			if err := d.done(); err != nil {
				return err
			}
			if f == nil {
				return reply(badHandle, nil)
			}
			return reply(f.SetModTime(time.Unix(0, t)), nil)
		}
	case opUsage:
		if err := d.done(); err != nil {
			return err
		}
		used, limit := fsys.Usage()
		return reply(nil, func(e *encoder) {
			e.int(used)
			e.int(limit)
		})
	}
	// Path operations.
	p0 := d.str(maxPath)
	switch op {
	case opStat, opLstat:
		if err := d.done(); err != nil {
			return err
		}
		var fi fs.FileInfo
		var err error
		if op == opStat {
			fi, err = fsys.Stat(p0)
		} else {
			fi, err = fsys.Lstat(p0)
		}
		return reply(err, func(e *encoder) { encodeInfo(e, fi) })
	case opOpen:
		flag, perm := int(d.int()), fs.FileMode(d.uint())
		if err := d.done(); err != nil {
			return err
		}
		r.mu.Lock()
		n := len(r.handles)
		r.mu.Unlock()
		if n >= maxHandles {
			return reply(&fs.PathError{Op: "open", Path: p0, Err: syscall.EMFILE}, nil)
		}
		f, err := fsys.OpenFile(p0, flag, perm.Perm())
		if err != nil {
			return reply(err, nil)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return reply(err, nil)
		}
		r.mu.Lock()
		r.nextH++
		h := r.nextH
		r.handles[h] = f
		r.mu.Unlock()
		// A file opened to be read comes with its first bytes (all of a
		// small one, with EOF): cat, grep and friends need no further round
		// trip.
		var pre []byte
		eof := false
		if flag&(syscall.O_WRONLY|syscall.O_RDWR) == 0 && fi.Mode().IsRegular() {
			pre = make([]byte, min(fi.Size()+1, prefetch))
			n, err := io.ReadFull(f, pre)
			pre = pre[:n]
			eof = err == io.EOF || err == io.ErrUnexpectedEOF
		}
		return reply(nil, func(e *encoder) {
			e.uint(h)
			encodeInfo(e, fi)
			e.bool(f.Append())
			e.bytes(pre)
			e.bool(eof)
		})
	case opReadDir:
		if err := d.done(); err != nil {
			return err
		}
		ents, err := fsys.ReadDir(p0)
		return reply(err, func(e *encoder) { encodeEntries(e, ents) })
	case opMkdir, opMkdirAll, opChmod:
		perm := fs.FileMode(d.uint())
		if err := d.done(); err != nil {
			return err
		}
		switch op {
		case opMkdir:
			return reply(fsys.Mkdir(p0, perm.Perm()), nil)
		case opMkdirAll:
			return reply(fsys.MkdirAll(p0, perm.Perm()), nil)
		}
		return reply(fsys.Chmod(p0, perm.Perm()), nil)
	case opRemove, opRemoveAll:
		if err := d.done(); err != nil {
			return err
		}
		if op == opRemove {
			return reply(fsys.Remove(p0), nil)
		}
		return reply(fsys.RemoveAll(p0), nil)
	case opRename, opSymlink:
		p1 := d.str(maxPath)
		if err := d.done(); err != nil {
			return err
		}
		if op == opRename {
			return reply(fsys.Rename(p0, p1), nil)
		}
		return reply(fsys.Symlink(p1, p0), nil)
	case opReadlink:
		if err := d.done(); err != nil {
			return err
		}
		t, err := fsys.Readlink(p0)
		return reply(err, func(e *encoder) { e.str(t) })
	case opChtimes:
		t := d.int()
		if err := d.done(); err != nil {
			return err
		}
		return reply(fsys.Chtimes(p0, time.Unix(0, t)), nil)
	case opTruncate:
		size := d.int()
		if err := d.done(); err != nil {
			return err
		}
		return reply(fsys.Truncate(p0, size), nil)
	case opReadFile:
		max := d.int()
		if err := d.done(); err != nil {
			return err
		}
		if max <= 0 || max > MaxFrame-1024 {
			max = MaxFrame - 1024
		}
		data, err := fsys.ReadFile(p0, max)
		return reply(err, func(e *encoder) { e.bytes(data) })
	case opWriteFile:
		perm := fs.FileMode(d.uint())
		data := d.bytes(MaxFrame)
		if err := d.done(); err != nil {
			return err
		}
		return reply(fsys.WriteFile(p0, data, perm.Perm()), nil)
	}
	return fmt.Errorf("%w: op %d", errProto, op)
}

// SelfTest runs "selftest" of the helper program with ro readable and
// returns its report.
func SelfTest(ctx context.Context, command []string, ro string) (SelfTestReport, error) {
	cmd := exec.CommandContext(ctx, command[0], append(command[1:], "selftest", ro)...)
	cmd.Env = []string{"GOTRACEBACK=single"}
	out, err := cmd.Output()
	var rep SelfTestReport
	if jerr := json.Unmarshal(out, &rep); jerr != nil {
		return rep, fmt.Errorf("selftest: %v (%v)", jerr, err)
	}
	return rep, nil
}
