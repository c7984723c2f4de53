package trajectory

import (
	"testing"
)

// Records written while their directory's fsync runs share the next one
// (a group commit: two fsyncs for 64 records, not 64), and each is in
// place, whole, when its write returns.
func TestRecordsWrittenAtOnceShareTheirDirectorysFsyncs(t *testing.T) {
	dir := t.TempDir()
	const n = 64
	before := dirSyncs.fsyncs.Load()
	// Every other writer waits for the next fsync once it has renamed.
	errs := commitAtOnce(t, dir, n, n, func(h func()) { dirSyncs.hook = h }, func() int {
		dirSyncs.mu.Lock()
		defer dirSyncs.mu.Unlock()
		if d := dirSyncs.dirs[dir]; d != nil {
			return d.waiters
		}
		return 0
	}, WriteDocument)
	for i, err := range errs {
		if err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if syncs := dirSyncs.fsyncs.Load() - before; syncs != 2 {
		t.Errorf("%d directory fsyncs for %d records, want 2 (the first's, then one for the %d that came while it ran)", syncs, n, n-1)
	}
	dirSyncs.mu.Lock()
	left := len(dirSyncs.dirs)
	dirSyncs.mu.Unlock()
	if left != 0 {
		t.Errorf("%d directories still held by the group commit, want none", left)
	}
}
