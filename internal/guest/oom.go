//go:build linux

package guest

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// oomCounter reads how many processes the kernel's OOM killer has killed in
// this sandbox's memory cgroup. A command killed by SIGKILL while the count
// rose is reported as OOM-killed.
type oomCounter struct {
	path   string // memory.oom_control (v1) or memory.events (v2); "" when neither is visible
	source string
}

func newOOMCounter() oomCounter {
	for _, c := range []oomCounter{
		{"/sys/fs/cgroup/memory/memory.oom_control", "cgroup1"},
		{"/sys/fs/cgroup/memory.events", "cgroup2"},
	} {
		if _, err := os.Stat(c.path); err == nil {
			return c
		}
	}
	return oomCounter{source: "none"}
}

func (c oomCounter) count() int64 {
	if c.path == "" {
		return 0
	}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return 0
	}
	for line := range bytes.SplitSeq(b, []byte("\n")) {
		if v, ok := bytes.CutPrefix(line, []byte("oom_kill ")); ok {
			n, _ := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n
		}
	}
	return 0
}

// guardInterval is how often the memory guard samples usage while commands
// run.
const guardInterval = 5 * time.Millisecond

// guardLoop is the memory guard for runtimes whose OOM killer would take the
// whole sandbox (gVisor: the host kills the sentry). While commands run it
// samples the sandbox's memory use from /proc/meminfo and, above limit,
// kills the session of the command using the most memory and marks it
// OOM-killed. The host gives the container headroom above limit so the
// guard acts first.
func (s *Server) guardLoop(limit int64) {
	t := time.NewTicker(guardInterval)
	defer t.Stop()
	var victim *command // killed, not yet gone: its memory is not yet freed
	var settled time.Time
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		s.guardMu.Lock()
		n := len(s.guarded)
		if victim != nil && !s.guarded[victim] {
			// The victim's command has ended; give the sandbox a moment to
			// free its memory before judging anyone else.
			victim, settled = nil, time.Now().Add(guardSettle)
		}
		s.guardMu.Unlock()
		if n == 0 || victim != nil || time.Now().Before(settled) {
			continue
		}
		if used := memUsed(); used > limit {
			victim = s.killLargest()
		}
	}
}

// guardSettle is how long the guard waits after a victim ended before it
// may kill again.
const guardSettle = 200 * time.Millisecond

// memUsed is MemTotal - MemAvailable, in bytes.
func memUsed() int64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	var total, avail int64 = -1, -1
	sc := bufio.NewScanner(f)
	for sc.Scan() && (total < 0 || avail < 0) {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "MemTotal":
			total = n << 10
		case "MemAvailable":
			avail = n << 10
		}
	}
	if total < 0 || avail < 0 {
		return 0
	}
	return total - avail
}

// killLargest kills the guarded command whose session holds the most
// resident memory, and returns it.
func (s *Server) killLargest() *command {
	rss := map[int]int64{}
	page := int64(os.Getpagesize())
	for _, st := range listProcs() {
		b, err := os.ReadFile("/proc/" + strconv.Itoa(st.pid) + "/statm")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b))
		if len(f) > 1 {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			rss[st.sid] += n * page
		}
	}
	s.guardMu.Lock()
	var victim *command
	for c := range s.guarded {
		if victim == nil || rss[c.pid] > rss[victim.pid] {
			victim = c
		}
	}
	s.guardMu.Unlock()
	if victim != nil {
		victim.oomKilled.Store(true)
		s.procs.killSession(victim.pid)
	}
	return victim
}

func (s *Server) guardAdd(c *command) {
	s.guardMu.Lock()
	s.guarded[c] = true
	s.guardMu.Unlock()
}

func (s *Server) guardRemove(c *command) {
	s.guardMu.Lock()
	delete(s.guarded, c)
	s.guardMu.Unlock()
}
