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

// Dir is where leases live: $ROLLBOX_LEASE_DIR, else a per-user directory
// under the temporary directory.
func Dir() string {
	if d := os.Getenv("ROLLBOX_LEASE_DIR"); d != "" {
		return d
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
}

// Acquire creates and locks a fresh lease in dir.
func Acquire(dir string) (*Lease, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	var b [8]byte
	rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	f, err := os.OpenFile(filepath.Join(dir, token+suffix), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		os.Remove(f.Name())
		return nil, fmt.Errorf("lease: lock %s: %w", f.Name(), err)
	}
	fmt.Fprintf(f, "pid %d\n", os.Getpid())
	return &Lease{f: f, token: token}, nil
}

// Token names the lease on the resources it covers.
func (l *Lease) Token() string { return l.token }

// Release removes the lease: what it covered is orphaned from now on.
// Idempotent.
func (l *Lease) Release() error {
	if l.f == nil {
		return nil
	}
	err := os.Remove(l.f.Name())
	l.f.Close()
	l.f = nil
	if errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	return err
}

// Held reports whether a live process holds token's lease in dir. A lease
// whose file is gone is not held.
func Held(dir, token string) (bool, error) {
	if token == "" || strings.ContainsAny(token, "/\\.") {
		return false, fmt.Errorf("lease: bad token %q", token)
	}
	f, err := os.Open(filepath.Join(dir, token+suffix))
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("lease: %w", err)
	}
	defer f.Close()
	return locked(f)
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
		if !strings.HasSuffix(e.Name(), suffix) {
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
