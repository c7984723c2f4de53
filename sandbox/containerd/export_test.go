package containerd

// SetMaxLayers sets how deep forks stack layers before a fork copies, and
// returns the function that restores it.
func SetMaxLayers(n int) func() {
	old := maxLayers
	maxLayers = n
	return func() { maxLayers = old }
}
