package trajectory

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Records written while their directory's fsync runs share the next one
// (a group commit: two fsyncs for 64 records, not 64), and each is in
// place, whole, when its write returns.
func TestRecordsWrittenAtOnceShareTheirDirectorysFsyncs(t *testing.T) {
	dir := t.TempDir()
	const n = 64
	first, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	dirSyncs.hook = func() { once.Do(func() { close(first); <-held }) } // the first fsync waits for the others to arrive
	defer func() { dirSyncs.hook = nil }()
	before := dirSyncs.fsyncs.Load()
	var wg sync.WaitGroup
	errs := make([]error, n)
	write := func(i int) {
		defer wg.Done()
		path := filepath.Join(dir, fmt.Sprintf("e%d.json", i))
		doc := fmt.Sprintf(`{"episode_id": "e%d"}`, i)
		if errs[i] = WriteDocument(path, []byte(doc)); errs[i] != nil {
			return
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != doc+"\n" {
			errs[i] = fmt.Errorf("read back: %v %q", err, b)
		}
	}
	wg.Add(1)
	go write(0)
	<-first
	for i := 1; i < n; i++ {
		wg.Add(1)
		go write(i)
	}
	// Every other writer is waiting for the next fsync once it has renamed.
	deadline := time.Now().Add(10 * time.Second)
	for {
		dirSyncs.mu.Lock()
		w := 0
		if d := dirSyncs.dirs[dir]; d != nil {
			w = d.waiters
		}
		dirSyncs.mu.Unlock()
		if w == n || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(held)
	wg.Wait()
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
