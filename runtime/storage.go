package runtime

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Storage states, as /healthz reports them.
const (
	StorageOK = "ok"
	// StorageLow: free space is below the reserve; new work is refused (507)
	// and queued episodes wait, so the episodes running can still write
	// their records.
	StorageLow = "low"
	// StorageFull: nothing more can be written (ENOSPC).
	StorageFull = "full"
	// StorageReadOnly: the data directory's file system is read-only.
	StorageReadOnly = "read_only"
	// StorageError: the data directory cannot be written for another reason.
	StorageError = "error"
)

// StorageHealth is the data directory in /healthz.
type StorageHealth struct {
	State        string    `json:"state"`
	FreeBytes    int64     `json:"free_bytes"`
	ReserveBytes int64     `json:"reserve_bytes"`
	Error        string    `json:"error,omitempty"`
	CheckedAt    time.Time `json:"checked_at"`
}

// storageMonitor watches the data directory's free space and writability
// from its own goroutine, so that admission, the dispatcher and /healthz
// read a state (an atomic) instead of doing I/O. A record that failed to be
// written asks for a check at once.
type storageMonitor struct {
	dir     string
	reserve int64
	every   time.Duration
	// probeEvery is how often a check also writes and removes a small file
	// (statfs does not see a directory that cannot be written for other
	// reasons than a read-only mount).
	probeEvery time.Duration
	// changed is called (from the monitor's goroutine) when the state
	// changes.
	changed func(old, new *StorageHealth)

	state     atomic.Pointer[StorageHealth]
	kickCh    chan struct{}
	lastProbe time.Time
}

func newStorageMonitor(dir string, reserve int64, every time.Duration, changed func(old, new *StorageHealth)) *storageMonitor {
	m := &storageMonitor{dir: dir, reserve: reserve, every: every, probeEvery: 10 * every, changed: changed,
		kickCh: make(chan struct{}, 1)}
	m.state.Store(m.measure(true))
	return m
}

// health is the last state measured.
func (m *storageMonitor) health() StorageHealth { return *m.state.Load() }

// ok reports whether new work may start.
func (m *storageMonitor) ok() bool { return m.state.Load().State == StorageOK }

// kick asks for a check now (a record could not be written).
func (m *storageMonitor) kick() { signal(m.kickCh) }

// refusal is the error new work gets while the data directory cannot take
// it, or nil.
func (m *storageMonitor) refusal() error {
	h := m.state.Load()
	switch h.State {
	case StorageOK:
		return nil
	case StorageLow, StorageFull:
		return &apiError{Status: http.StatusInsufficientStorage, Code: codeInsufficientStorage, RetryAfter: 30,
			Message: fmt.Sprintf("the data directory %s has %s free, below the reserve of %s kept for the records of the episodes running (--disk-reserve); free some space",
				m.dir, fmtBytes(h.FreeBytes), fmtBytes(h.ReserveBytes))}
	}
	return &apiError{Status: http.StatusServiceUnavailable, Code: codeStorageUnavailable, RetryAfter: 30,
		Message: fmt.Sprintf("the data directory %s cannot be written (%s): %s", m.dir, h.State, h.Error)}
}

// run checks every m.every (and when kicked) until stop is closed.
func (m *storageMonitor) run(stop <-chan struct{}) {
	t := time.NewTicker(m.every)
	defer t.Stop()
	for {
		probe := false
		select {
		case <-stop:
			return
		case <-t.C:
			probe = time.Since(m.lastProbe) >= m.probeEvery
		case <-m.kickCh:
			probe = true
		}
		next := m.measure(probe)
		old := m.state.Swap(next)
		if old.State != next.State && m.changed != nil {
			m.changed(old, next)
		}
	}
}

// measure reads the free space (statfs) and, with probe, writes a small
// file to prove the directory takes writes.
func (m *storageMonitor) measure(probe bool) *StorageHealth {
	h := &StorageHealth{State: StorageOK, ReserveBytes: m.reserve, CheckedAt: time.Now().UTC()}
	var fs unix.Statfs_t
	if err := unix.Statfs(m.dir, &fs); err != nil {
		h.State, h.Error = StorageError, err.Error()
		return h
	}
	h.FreeBytes = int64(fs.Bavail) * int64(fs.Bsize)
	if fs.Flags&unix.ST_RDONLY != 0 {
		h.State, h.Error = StorageReadOnly, "the file system is mounted read-only"
		return h
	}
	if probe {
		m.lastProbe = time.Now()
		if err := probeWrite(m.dir); err != nil {
			switch {
			case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
				h.State = StorageFull
			case errors.Is(err, syscall.EROFS):
				h.State = StorageReadOnly
			default:
				h.State = StorageError
			}
			h.Error = err.Error()
			return h
		}
	}
	switch {
	case h.FreeBytes == 0:
		h.State = StorageFull
	case h.FreeBytes < m.reserve:
		h.State = StorageLow
	}
	return h
}

// probeWrite writes, syncs and removes a small file in dir.
func probeWrite(dir string) error {
	p := filepath.Join(dir, ".rollbox-write-probe")
	f, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(make([]byte, 512))
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	os.Remove(p)
	return err
}

// fmtBytes writes a size for people: 1.5 GiB, 30 MiB, 512 B.
func fmtBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}
