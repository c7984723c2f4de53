//go:build linux

package guest

import (
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// procs owns this process's children: it reaps them all and dispatches exit
// statuses by pid. There is one per process, because wait4(-1) is.
type procs struct {
	self   int
	pid1   bool // we are PID 1: every process we can see is ours to sweep
	oomAdj *os.File

	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	// sessions are the sessions (= process groups, = leader pids) of
	// commands: true while the command runs, false once it ended and its
	// leftovers may be killed.
	sessions map[int]bool
}

var (
	procsOnce sync.Once
	theProcs  *procs
)

// processTable returns the process-wide child table, starting its reaper on
// first use. It is process-wide state by nature (wait4(-1), SIGCHLD), hence
// the one package-level value.
func processTable() *procs {
	procsOnce.Do(func() {
		p := &procs{self: os.Getpid(), waiters: map[int]chan syscall.WaitStatus{}, sessions: map[int]bool{}}
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
// kernel's OOM killer picks a command, never the guest.
func (p *procs) spawn(path string, argv, env []string, dir string, files []uintptr) (int, chan syscall.WaitStatus, error) {
	// A fork that fails for want of processes (EAGAIN: the pids limit or
	// RLIMIT_NPROC) is retried for a while: the processes of a command that
	// was just killed take a moment to go away.
	deadline := time.Now().Add(spawnRetry)
	for delay := time.Millisecond; ; delay = min(2*delay, 100*time.Millisecond) {
		pid, ch, err := p.fork(path, argv, env, dir, files)
		if err != syscall.EAGAIN || time.Now().After(deadline) {
			return pid, ch, err
		}
		time.Sleep(delay)
	}
}

// spawnRetry bounds how long spawn retries a fork that fails with EAGAIN.
const spawnRetry = 3 * time.Second

func (p *procs) fork(path string, argv, env []string, dir string, files []uintptr) (int, chan syscall.WaitStatus, error) {
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
	p.sessions[pid] = true
	return pid, ch, nil
}

// ended marks a command's session as over: its leftovers may be swept.
func (p *procs) ended(sid int) {
	p.mu.Lock()
	p.sessions[sid] = false
	p.mu.Unlock()
}

// killSession sends SIGKILL to the process group of sid and to every
// process still in the session (grandchildren that left the group).
func (p *procs) killSession(sid int) {
	syscall.Kill(-sid, syscall.SIGKILL)
	for _, st := range listProcs() {
		if st.sid == sid && st.pid != p.self {
			syscall.Kill(st.pid, syscall.SIGKILL)
		}
	}
}

// sweep kills every process that belongs to no running command: remnants
// of ended sessions, and processes that escaped into sessions of their own.
// As PID 1 that is everything but the guest; elsewhere (tests on the host)
// it is limited to our own sessions and the orphans re-parented to us.
func (p *procs) sweep() {
	p.mu.Lock() // no spawn may run: a fresh child is not yet registered
	defer p.mu.Unlock()
	seen := map[int]bool{}
	for _, st := range listProcs() {
		if st.pid == p.self {
			continue
		}
		running, ours := p.sessions[st.sid]
		if running || st.sid == p.selfSID() {
			continue
		}
		if p.pid1 || ours || st.ppid == p.self {
			syscall.Kill(st.pid, syscall.SIGKILL)
			seen[st.sid] = true
		}
	}
	for sid, running := range p.sessions {
		if !running && !seen[sid] {
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
