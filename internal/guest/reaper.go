//go:build linux

package guest

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procs owns this process's children: it reaps them all, dispatches exit
// statuses by pid, and kills what commands leave behind. There is one per
// process, because wait4(-1) is.
//
// # What "a command's processes" means
//
// Commands may run at once in one sandbox (parallel tool calls), and a
// process that left its command's session (setsid, a double fork) carries
// nothing that names the command it came from. So the guarantee is stated
// per sandbox: when no command is live (running, and neither cancelled by
// the host nor killed by the guest), nothing but PID 1 may exist. As PID 1,
// the guest enforces it with kill(-1, SIGKILL), which reaches every other
// process of the PID namespace and which the kernel makes atomic with
// respect to fork (a fork in progress is restarted or its child is signalled
// too), repeated until the call finds no process at all (every victim
// reaped); gVisor signals a snapshot of the namespace instead, which the
// repetition makes sufficient. It runs when the last live command ends, and
// again before a command starts on an idle sandbox (a command the host
// cancelled may still be dying: the next one, e.g. the verifier, must not
// run beside it). While other commands are live, a command that ends gets
// its session and process group killed and every process in no live
// command's session swept, which a process forking at that moment may
// escape until the sandbox next goes idle.
type procs struct {
	self   int
	pid1   bool // we are PID 1: every process we can see is ours to sweep
	oomAdj *os.File
	nudge  chan struct{} // wakes the reaper (a sweep waits for its victims)

	// forkMu is held by every fork and every sweep: no command starts while
	// the sandbox is being emptied. Taken before mu.
	forkMu sync.Mutex

	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	// sessions are the sessions (= process groups, = leader pids) of
	// commands, until their leftovers are known to be gone.
	sessions map[int]*session
}

// session is a command's session, as the sweeps see it.
type session struct {
	// ctx is the command's request: done once the host cancelled it (the
	// guest cancels it synchronously when the Cancel frame is read, before
	// any later request) or the stream ended.
	ctx    context.Context
	killed bool // the guest killed it: a timeout, an idle timeout, the memory guard
	ended  bool // its leader's exit status was collected
}

// live is whether the session's processes still have a right to exist.
func (s *session) live() bool { return !s.ended && !s.killed && s.ctx.Err() == nil }

var (
	procsOnce sync.Once
	theProcs  *procs
)

// processTable returns the process-wide child table, starting its reaper on
// first use. It is process-wide state by nature (wait4(-1), SIGCHLD), hence
// the one package-level value.
func processTable() *procs {
	procsOnce.Do(func() {
		p := &procs{self: os.Getpid(), waiters: map[int]chan syscall.WaitStatus{}, sessions: map[int]*session{},
			nudge: make(chan struct{}, 1)}
		p.pid1 = p.self == 1
		if !p.pid1 {
			// Orphans of our commands come back to us, as they would to PID 1.
			syscall.RawSyscall6(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0, 0, 0, 0)
		}
		if f, err := os.OpenFile("/proc/self/oom_score_adj", os.O_WRONLY, 0); err == nil {
			p.oomAdj = f
		}
		sigc := make(chan os.Signal, 1)
		signal.Notify(sigc, syscall.SIGCHLD)
		go p.reap(sigc)
		theProcs = p
	})
	return theProcs
}

const prSetChildSubreaper = 36

// reap runs for the life of the process: it collects every child that
// exits, and hands the statuses of commands to their waiters.
func (p *procs) reap(sigc chan os.Signal) {
	tick := time.NewTicker(time.Second) // a safety net for a lost SIGCHLD
	defer tick.Stop()
	for {
		select {
		case <-sigc:
		case <-tick.C:
		case <-p.nudge:
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if pid <= 0 || err != nil {
				break
			}
			// spawn registers under mu in the same critical section as the
			// fork, so a waiter for pid, if any, is registered by now.
			p.mu.Lock()
			ch := p.waiters[pid]
			delete(p.waiters, pid)
			p.mu.Unlock()
			if ch != nil {
				ch <- ws // buffered
			}
		}
	}
}

// spawn starts argv[0] (a path) in a new session and returns its pid and a
// channel that receives its exit status. The child's oom_score_adj is 1000
// from its first instruction: the guest raises its own score for the
// duration of the fork (the child inherits it) and lowers it back, so the
// kernel's OOM killer picks a command, never the guest. A command that
// starts on an idle sandbox starts alone: whatever is left is killed first.
// ctx is the command's request; once it is done the command is not started.
func (p *procs) spawn(ctx context.Context, path string, argv, env []string, dir string, files []uintptr) (int, chan syscall.WaitStatus, error) {
	// A fork that fails for want of processes (EAGAIN: the pids limit or
	// RLIMIT_NPROC) is retried for a while: the processes of a command that
	// was just killed take a moment to go away.
	deadline := time.Now().Add(spawnRetry)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		pid, ch, err := p.fork(ctx, path, argv, env, dir, files)
		if err != syscall.EAGAIN || time.Now().After(deadline) {
			return pid, ch, err
		}
		time.Sleep(delay)
	}
}

// spawnRetry bounds how long spawn retries a fork that fails with EAGAIN.
const spawnRetry = 3 * time.Second

func (p *procs) fork(ctx context.Context, path string, argv, env []string, dir string, files []uintptr) (int, chan syscall.WaitStatus, error) {
	p.forkMu.Lock()
	defer p.forkMu.Unlock()
	if err := ctx.Err(); err != nil {
		return 0, nil, err
	}
	if p.pid1 && !p.anyLive() {
		if err := p.killAll(); err != nil {
			return 0, nil, err
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.oomAdj != nil {
		p.oomAdj.WriteAt([]byte("1000"), 0)
	}
	pid, err := syscall.ForkExec(path, argv, &syscall.ProcAttr{
		Dir: dir, Env: env, Files: files,
		Sys: &syscall.SysProcAttr{Setsid: true},
	})
	if p.oomAdj != nil {
		p.oomAdj.WriteAt([]byte("0"), 0)
	}
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	p.waiters[pid] = ch
	p.sessions[pid] = &session{ctx: ctx}
	return pid, ch, nil
}

// anyLive reports whether some command is live.
func (p *procs) anyLive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, s := range p.sessions {
		if s.live() {
			return true
		}
	}
	return false
}

// ended is called once a command's leader has exited: nothing it started
// may outlive it. When no other command is live, every process but PID 1 is
// killed (see procs); otherwise its session and every process in no live
// command's session are.
func (p *procs) ended(sid int) error {
	p.forkMu.Lock()
	defer p.forkMu.Unlock()
	p.mu.Lock()
	if s := p.sessions[sid]; s != nil {
		s.ended = true
	}
	p.mu.Unlock()
	if p.pid1 && !p.anyLive() {
		return p.killAll()
	}
	p.killSession(sid)
	p.sweep()
	return nil
}

// killAllWait bounds how long killAll waits for the processes it killed to
// be gone.
const killAllWait = 10 * time.Second

// killAll kills every process of the PID namespace but PID 1 and returns
// once none is left, reaped included. Only PID 1 may call it (elsewhere
// kill(-1) reaches every process of the user), with forkMu held.
//
// kill(-1, SIGKILL) fails with ESRCH once it finds no process to signal.
// Zombies count until they are reaped (Linux and gVisor alike), so an ESRCH
// on the first call means the sandbox was already empty: the common case
// costs one system call. After a kill, /proc must agree too.
func (p *procs) killAll() error {
	deadline := time.Now().Add(killAllWait)
	delay := 20 * time.Microsecond
	for first := true; ; first = false {
		err := syscall.Kill(-1, syscall.SIGKILL)
		if err == syscall.ESRCH {
			if first {
				break
			}
			left := p.others()
			if len(left) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return &sweepError{fmt.Sprintf("%d processes are left %v after SIGKILL to all: %v", len(left), killAllWait, left)}
			}
		} else if time.Now().After(deadline) {
			return &sweepError{fmt.Sprintf("processes are still alive %v after SIGKILL to all (kill: %v): %v", killAllWait, err, p.others())}
		}
		select { // the victims' statuses must be collected
		case p.nudge <- struct{}{}:
		default:
		}
		time.Sleep(delay)
		delay = min(2*delay, 5*time.Millisecond)
	}
	p.mu.Lock()
	for sid, s := range p.sessions {
		if !s.live() {
			delete(p.sessions, sid)
		}
	}
	p.mu.Unlock()
	return nil
}

// sweepError says the sandbox could not be emptied of earlier commands'
// processes: no command may start in it.
type sweepError struct{ msg string }

func (e *sweepError) Error() string {
	return "the processes of earlier commands cannot be killed: " + e.msg
}

// others lists the pids in /proc other than ours.
func (p *procs) others() []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	var out []int
	for _, n := range names {
		if pid, err := strconv.Atoi(n); err == nil && pid != p.self {
			out = append(out, pid)
		}
	}
	return out
}

// killSession sends SIGKILL to the process group of sid and to every
// process still in the session (grandchildren that left the group), and
// marks the command killed: its leftovers have no right to exist.
func (p *procs) killSession(sid int) {
	p.mu.Lock()
	if s := p.sessions[sid]; s != nil {
		s.killed = true
	}
	p.mu.Unlock()
	syscall.Kill(-sid, syscall.SIGKILL)
	for _, st := range listProcs() {
		if st.sid == sid && st.pid != p.self {
			syscall.Kill(st.pid, syscall.SIGKILL)
		}
	}
}

// sweep kills every process that belongs to no live command: remnants of
// ended or killed sessions, and processes that escaped into sessions of
// their own. As PID 1 that is everything but the guest; elsewhere (tests on
// the host) it is limited to our own sessions and the orphans re-parented
// to us. One pass: a process forking meanwhile may escape it (killAll is
// the sweep that nothing escapes).
func (p *procs) sweep() {
	p.mu.Lock() // the reaper's dispatch waits; forks are held off by forkMu
	defer p.mu.Unlock()
	seen := map[int]bool{}
	self := p.selfSID()
	for _, st := range listProcs() {
		if st.pid == p.self {
			continue
		}
		s, ours := p.sessions[st.sid]
		if (ours && s.live()) || st.sid == self {
			continue
		}
		if p.pid1 || ours || st.ppid == p.self {
			syscall.Kill(st.pid, syscall.SIGKILL)
			seen[st.sid] = true
		}
	}
	for sid, s := range p.sessions {
		if !s.live() && !seen[sid] {
			delete(p.sessions, sid)
		}
	}
}

func (p *procs) selfSID() int {
	sid, _, _ := syscall.RawSyscall(syscall.SYS_GETSID, 0, 0, 0)
	return int(sid)
}

// procStat is what sweep needs of /proc/PID/stat.
type procStat struct {
	pid, ppid, pgid, sid int
	state                byte
}

// listProcs reads every process's stat. Processes that vanish meanwhile are
// skipped.
func listProcs() []procStat {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	defer d.Close()
	names, _ := d.Readdirnames(-1)
	out := make([]procStat, 0, len(names))
	buf := make([]byte, 512)
	for _, n := range names {
		pid, err := strconv.Atoi(n)
		if err != nil {
			continue
		}
		st, ok := readStat(pid, buf)
		if ok {
			out = append(out, st)
		}
	}
	return out
}

func readStat(pid int, buf []byte) (procStat, bool) {
	fd, err := syscall.Open("/proc/"+strconv.Itoa(pid)+"/stat", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return procStat{}, false
	}
	n, err := syscall.Read(fd, buf)
	syscall.Close(fd)
	if err != nil || n <= 0 {
		return procStat{}, false
	}
	s := string(buf[:n])
	// pid (comm) state ppid pgrp session ...; comm may hold spaces and parens.
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return procStat{}, false
	}
	f := strings.Fields(s[i+2:])
	if len(f) < 4 {
		return procStat{}, false
	}
	st := procStat{pid: pid, state: f[0][0]}
	st.ppid, _ = strconv.Atoi(f[1])
	st.pgid, _ = strconv.Atoi(f[2])
	st.sid, _ = strconv.Atoi(f[3])
	return st, true
}
