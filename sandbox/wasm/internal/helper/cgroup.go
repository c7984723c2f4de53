package helper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Cgroups makes one cgroup per helper under a parent of the host's (v1:
// the memory and pids hierarchies; v2: the unified one, where the host's
// own cgroup delegates both controllers), so a helper's memory and
// threads are bounded by the kernel: past them the helper alone dies.
type Cgroups struct {
	v2     bool
	memory string // parent directories
	pids   string
	next   atomic.Int64
}

// NewCgroups prepares the parent cgroups named name, or says why it cannot
// (not root, no controllers): the helpers then run without them.
func NewCgroups(name string) (*Cgroups, error) {
	if strings.ContainsAny(name, "/\x00") || name == "" || name == "." || name == ".." {
		return nil, fmt.Errorf("cgroup name %q", name)
	}
	const root = "/sys/fs/cgroup"
	if b, err := os.ReadFile(filepath.Join(root, "cgroup.controllers")); err == nil {
		ctl := strings.Fields(string(b))
		if !contains(ctl, "memory") || !contains(ctl, "pids") {
			return nil, fmt.Errorf("cgroup v2 without the memory and pids controllers")
		}
		self, err := ownCgroupV2()
		if err != nil {
			return nil, err
		}
		parent := filepath.Join(root, self, name)
		if err := os.MkdirAll(parent, 0o755); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+memory +pids"), 0); err != nil {
			return nil, fmt.Errorf("delegate memory and pids: %w", err)
		}
		return &Cgroups{v2: true, memory: parent, pids: parent}, nil
	}
	mem, pids := filepath.Join(root, "memory", name), filepath.Join(root, "pids", name)
	for _, d := range []string{mem, pids} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	return &Cgroups{memory: mem, pids: pids}, nil
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

func ownCgroupV2() (string, error) {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(l, "0::"); ok {
			return p, nil
		}
	}
	return "", errors.New("no cgroup v2 entry in /proc/self/cgroup")
}

// Remove removes the parent cgroups (once every helper's is gone).
func (c *Cgroups) Remove() {
	os.Remove(c.memory)
	if c.pids != c.memory {
		os.Remove(c.pids)
	}
}

// cgroup is one helper's.
type cgroup struct {
	v2        bool
	mem, pids string
}

func (c *Cgroups) create(pid, pidsMax int) (*cgroup, error) {
	name := "helper-" + strconv.FormatInt(c.next.Add(1), 10)
	cg := &cgroup{v2: c.v2, mem: filepath.Join(c.memory, name), pids: filepath.Join(c.pids, name)}
	for _, d := range []string{cg.mem, cg.pids} {
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return nil, err
		}
	}
	if pidsMax > 0 {
		if err := os.WriteFile(filepath.Join(cg.pids, "pids.max"), []byte(strconv.Itoa(pidsMax)), 0); err != nil {
			cg.remove()
			return nil, fmt.Errorf("pids.max: %w", err)
		}
	}
	for _, d := range []string{cg.mem, cg.pids} {
		if err := os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			cg.remove()
			return nil, fmt.Errorf("move helper %d: %w", pid, err)
		}
		if cg.v2 {
			break
		}
	}
	return cg, nil
}

// setMemory sets the memory limit. Lowering it below what the helper
// holds (a previous exec's heap not yet returned) can fail: the old, higher
// limit then stays, which is what changed reports.
func (cg *cgroup) setMemory(limit int64) (changed bool, err error) {
	v := []byte(strconv.FormatInt(limit, 10))
	if cg.v2 {
		return true, os.WriteFile(filepath.Join(cg.mem, "memory.max"), v, 0)
	}
	// v1: memory+swap (where accounted) must stay >= memory, so the order
	// depends on the direction.
	mem, memsw := filepath.Join(cg.mem, "memory.limit_in_bytes"), filepath.Join(cg.mem, "memory.memsw.limit_in_bytes")
	cur, _ := os.ReadFile(mem)
	old, _ := strconv.ParseInt(strings.TrimSpace(string(cur)), 10, 64)
	if limit < old {
		if err := os.WriteFile(mem, v, 0); err != nil {
			return false, nil // busy: keep the higher limit
		}
		os.WriteFile(memsw, v, 0)
		return true, nil
	}
	if err := os.WriteFile(memsw, v, 0); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, err
	}
	return true, os.WriteFile(mem, v, 0)
}

// oomKilled reports whether the kernel killed a task of the cgroup for
// its memory limit.
func (cg *cgroup) oomKilled() bool {
	file := "memory.oom_control"
	if cg.v2 {
		file = "memory.events"
	}
	b, err := os.ReadFile(filepath.Join(cg.mem, file))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok && strings.TrimSpace(v) != "0" {
			return true
		}
	}
	return false
}

// remove removes the cgroup once its process has exited (retrying for a
// few seconds, as the kernel frees it after the exit is reaped).
func (cg *cgroup) remove() {
	go func() {
		for i := 0; i < 100; i++ {
			err1 := os.Remove(cg.mem)
			err2 := error(nil)
			if cg.pids != cg.mem {
				err2 = os.Remove(cg.pids)
			}
			if (err1 == nil || errors.Is(err1, os.ErrNotExist)) && (err2 == nil || errors.Is(err2, os.ErrNotExist)) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	}()
}

// PruneStale removes the parent cgroups named prefix+PID of processes that
// no longer exist (a service that crashed), once they are empty.
func PruneStale(prefix string) {
	for _, h := range []string{"/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup"} {
		ents, err := os.ReadDir(h)
		if err != nil {
			continue
		}
		for _, e := range ents {
			id, _, _ := strings.Cut(strings.TrimPrefix(e.Name(), prefix), "-")
			pid, err := strconv.Atoi(id)
			if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) || err != nil {
				continue
			}
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); err == nil {
				continue // alive
			}
			dir := filepath.Join(h, e.Name())
			subs, _ := os.ReadDir(dir)
			for _, s := range subs {
				if s.IsDir() {
					os.Remove(filepath.Join(dir, s.Name()))
				}
			}
			os.Remove(dir)
		}
	}
}
