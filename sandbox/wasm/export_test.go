package wasm

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
