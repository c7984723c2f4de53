package containerd

// SetMaxLayers sets how deep forks stack layers before a fork copies, and
// returns the function that restores it.
func SetMaxLayers(n int) func() {
	old := maxLayers
	maxLayers = n
	return func() { maxLayers = old }
}

// SetChannelHook makes b call f with each channel's socket path once it
// listens, before the container exists.
func SetChannelHook(b *Backend, f func(path string)) { b.channelHook = f }

// UsesChannel says whether the sandbox speaks to its guest over the
// channel (not the task's stdio).
func (c *Container) UsesChannel() bool { return c.conn.Load() != nil }

// ChannelRefused counts the connections to the sandbox's channel closed
// for not being its guest's.
func (c *Container) ChannelRefused() int64 {
	if c.ch == nil {
		return 0
	}
	return c.ch.refused.Load()
}

// SetTrace makes b call f as each step of a create ends ("" as a create
// begins). Creates must run one at a time.
func SetTrace(b *Backend, f func(step string)) { b.trace = f }

// SetAllABIs makes b keep the default seccomp profile's every system call
// ABI, as before withNativeSyscallsOnly.
func SetAllABIs(b *Backend) { b.allABIs = true }

// SetShimGroup makes every create of b join the shim of the sandbox id
// (its task's shim) instead of starting its own ("" for its own).
func SetShimGroup(b *Backend, id string) { b.shimGroup = id }
