package trajectory

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
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
	before := docCommits.syncs.Load()
	errs := commitAtOnce(t, dir, n, n-1, func(h func()) { docCommits.hook = h }, func() int {
		docCommits.mu.Lock()
		defer docCommits.mu.Unlock()
		if q := docCommits.dirs[dir]; q != nil {
			return len(q.pending)
		}
		return 0
	}, CommitDocument)
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
