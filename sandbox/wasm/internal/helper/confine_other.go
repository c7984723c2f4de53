//go:build !linux || !amd64

package helper

// confine is unavailable off linux/amd64: the helper still runs in its own
// process, which is what the host reports.
func confine(init Init) Confinement {
	return Confinement{Notes: []string{"confinement is implemented for linux/amd64 only"}}
}

// LandlockAvailable is false off linux/amd64 (not used there).
func LandlockAvailable() bool { return false }
