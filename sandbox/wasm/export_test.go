package wasm

import (
	"os"
	"strconv"
	"strings"
)

// busyHelperPids lists the pids of the helpers running an exec.
func (b *Backend) busyHelperPids() []int {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []int
	for p := range b.busy {
		out = append(out, p.Pid())
	}
	return out
}

// setHelperMemoryBase changes the helpers' memory beyond an exec's, for
// tests of the cgroup limit.
func (b *Backend) setHelperMemoryBase(n int64) { b.memoryBase = n }

// helperRSS sums the resident memory of the backend's live helpers (KB).
func (b *Backend) helperRSS() (n int, kb int64) {
	b.mu.Lock()
	var pids []int
	for p := range b.busy {
		pids = append(pids, p.Pid())
	}
	for _, h := range b.idle {
		pids = append(pids, h.p.Pid())
	}
	b.mu.Unlock()
	for _, pid := range pids {
		data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(l, "VmRSS:"); ok {
				f := strings.Fields(v)
				if len(f) > 0 {
					x, _ := strconv.ParseInt(f[0], 10, 64)
					kb += x
				}
			}
		}
	}
	return len(pids), kb
}
