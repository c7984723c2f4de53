// Package lease marks what a live process owns, so that a cleanup can tell
// the leftovers of a crashed process from the resources of a running one.
// A process holds an exclusive flock(2) on a small file named after its
// lease for as long as it lives; the kernel drops the lock when the process
// dies, however it dies (SIGKILL, OOM, power loss followed by a reboot that
// empties the directory). Resources carry the lease's token (a container
// label, say); a cleanup removes those whose lease no process holds.
//
// Locks are seen only by processes that share the directory's filesystem:
// resources also carry the host name (LabelHost), and a cleanup leaves
// alone what another host made.
package lease

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// Labels put on resources a lease covers.
const (
	LabelLease = "rollbox.lease"
	LabelHost  = "rollbox.host"
)

const suffix = ".lease"

// DefaultDir is where leases live unless rollbox is told otherwise
// ($ROLLBOX_LEASE_DIR): /run/rollbox/leases for root, runtimeDir/rollbox/leases
// (runtimeDir is the user's $XDG_RUNTIME_DIR, "" when unset), or a per-user
// directory under the temporary directory. Every rollbox process of a host
// must see the same directory (a service with a private /tmp does see
// /run); the /run ones are emptied at boot, when every lease is dead anyway.
func DefaultDir(runtimeDir string) string {
	if os.Getuid() == 0 {
		if st, err := os.Stat("/run"); err == nil && st.IsDir() {
			return "/run/rollbox/leases"
		}
	}
	if runtimeDir != "" {
		return filepath.Join(runtimeDir, "rollbox", "leases")
	}
	return filepath.Join(os.TempDir(), fmt.Sprintf("rollbox-%d", os.Getuid()), "leases")
}

// Host names this machine in LabelHost.
func Host() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown"
	}
	return h
}

// Lease is held until Release or the end of the process.
type Lease struct {
	f     *os.File
	token string
	path  string
}

// Acquire creates and locks a fresh lease in dir.
func Acquire(dir string) (*Lease, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	// Locked under a temporary name, then renamed: a lease file under its
	// own name is never seen unlocked while its process lives.
	tmp := filepath.Join(dir, "."+token+".tmp")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	final := filepath.Join(dir, token+suffix)
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("lease: lock %s: %w", tmp, err)
	}
	fmt.Fprintf(f, "pid %d\n", os.Getpid())
	if err := os.Rename(tmp, final); err != nil {
		f.Close()
		os.Remove(tmp)
		return nil, fmt.Errorf("lease: %w", err)
	}
	return &Lease{f: f, token: token, path: final}, nil
}

// Token names the lease on the resources it covers.
func (l *Lease) Token() string { return l.token }

// Release removes the lease: what it covered is orphaned from now on.
// Idempotent.
func (l *Lease) Release() error {
	if l.f == nil {
		return nil
	}
	err := os.Remove(l.path)
	l.f.Close()
	l.f = nil
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return err
}

// State is what a cleanup knows of a lease.
type State int

const (
	// Held: a live process holds it.
	Held State = iota
	// Dead: its file is there and unlocked: its process died.
	Dead
	// Missing: no file. Its process released it (and should have cleaned
	// up), the host rebooted, or it lives in another lease directory: a
	// cleanup cannot tell, and should leave running resources alone.
	Missing
)

// Check says whether token's lease in dir is held, dead or missing.
func Check(dir, token string) (State, error) {
	if token == "" || strings.ContainsAny(token, "/\\.") {
		return Missing, fmt.Errorf("lease: bad token %q", token)
	}
	f, err := os.Open(filepath.Join(dir, token+suffix))
	if errors.Is(err, fs.ErrNotExist) {
		return Missing, nil
	}
	if err != nil {
		return Missing, fmt.Errorf("lease: %w", err)
	}
	defer f.Close()
	held, err := locked(f)
	if err != nil {
		return Missing, err
	}
	if held {
		return Held, nil
	}
	return Dead, nil
}

// locked tries the lock: taken means nobody held it (it is let go at once).
func locked(f *os.File) (bool, error) {
	err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if errors.Is(err, syscall.EWOULDBLOCK) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("lease: lock %s: %w", f.Name(), err)
	}
	syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return false, nil
}

// Sweep removes the lease files in dir that no process holds and returns
// how many it removed. Run it after the resources they covered are gone.
func Sweep(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("lease: %w", err)
	}
	n := 0
	var errs []error
	for _, e := range entries {
		name := e.Name()
		// A .tmp is a lease whose process died between creating and
		// naming it.
		if !strings.HasSuffix(name, suffix) && !(strings.HasPrefix(name, ".") && strings.HasSuffix(name, ".tmp")) {
			continue
		}
		p := filepath.Join(dir, e.Name())
		f, err := os.Open(p)
		if err != nil {
			continue // removed meanwhile
		}
		// Remove while holding the lock, so a racing Held sees either a
		// held file or none.
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err == nil {
			if err := os.Remove(p); err == nil {
				n++
			} else if !errors.Is(err, fs.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		f.Close()
	}
	return n, errors.Join(errs...)
}

// LockDir takes an exclusive lock on a directory for as long as the process
// holds the returned file (close it to let go): a cleanup that can take the
// lock knows nobody is using the directory.
func LockDir(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("lock %s: %w", dir, err)
	}
	return f, nil
}
