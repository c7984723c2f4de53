package trajectory

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Documents committed while a commit runs share the next one: one
// file-system sync for all of them (two for 64 documents, not an fsync
// each), and each is in place, whole, when its commit returns; one that
// cannot be written gets its own error and takes none of the others down.
func TestDocumentsCommittedAtOnceShareOneFileSystemSync(t *testing.T) {
	dir := t.TempDir()
	const n = 64
	const bad = 17 // its temp file's name is taken by a directory
	if err := os.Mkdir(filepath.Join(dir, fmt.Sprintf("e%d.json", bad)+tmpSuffix), 0o755); err != nil {
		t.Fatal(err)
	}
	first, held := make(chan struct{}), make(chan struct{})
	var once sync.Once
	docCommits.hook = func() { once.Do(func() { close(first); <-held }) } // the first batch waits for the others to arrive
	defer func() { docCommits.hook = nil }()
	before := docCommits.syncs.Load()
	var wg sync.WaitGroup
	errs := make([]error, n)
	commit := func(i int) {
		defer wg.Done()
		path := filepath.Join(dir, fmt.Sprintf("e%d.json", i))
		doc := fmt.Sprintf(`{"episode_id": "e%d"}`, i)
		if errs[i] = CommitDocument(path, []byte(doc)); errs[i] != nil {
			return
		}
		if b, err := os.ReadFile(path); err != nil || string(b) != doc+"\n" {
			errs[i] = fmt.Errorf("read back: %v %q", err, b)
		}
	}
	wg.Add(1)
	go commit(0)
	<-first
	for i := 1; i < n; i++ {
		wg.Add(1)
		go commit(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		docCommits.mu.Lock()
		w := 0
		if q := docCommits.dirs[dir]; q != nil {
			w = len(q.pending)
		}
		docCommits.mu.Unlock()
		if w == n-1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Millisecond)
	}
	close(held)
	wg.Wait()
	for i, err := range errs {
		if i == bad {
			if err == nil {
				t.Errorf("document %d: committed, want the error of its temp file", i)
			}
			continue
		}
		if err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
	}
	if syncs := docCommits.syncs.Load() - before; syncs != 2 {
		t.Errorf("%d file-system syncs for %d documents, want 2 (the first's, then one for the %d that came while it ran)", syncs, n, n-1)
	}
	left, _ := filepath.Glob(filepath.Join(dir, "*"+tmpSuffix))
	if len(left) != 1 {
		t.Errorf("temp files left: %v, want only the directory in the way", left)
	}
	docCommits.mu.Lock()
	queues := len(docCommits.dirs)
	docCommits.mu.Unlock()
	if queues != 0 {
		t.Errorf("%d directories still held by the group commit, want none", queues)
	}
}
