package reward

import (
	"io/fs"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/sandbox"
)

func TestTheWorkspaceDiffShowsChangesAddsDeletionsAndWhatWasNotRead(t *testing.T) {
	task := map[string][]byte{
		"/work/calc.py":      []byte("def add(a, b):\n    return a - b\n"),
		"/work/test_calc.py": []byte("assert add(2, 3) == 5\n"),
		"/work/old.txt":      []byte("gone\n"),
		"/work/big.txt":      []byte(strings.Repeat("x\n", maxDiffFileBytes)),
	}
	snap := &snapshot{workdir: "/work", files: map[string]agentFile{
		"/work/calc.py":      {data: []byte("def add(a, b):\n    return a + b\n")},
		"/work/test_calc.py": {data: []byte("assert add(2, 3) != 5\n"), extra: true},
		"/work/conftest.py":  {data: []byte("import os\n"), extra: true},
		"/work/blob.bin":     {data: []byte{0, 1, 2}},
		"/work/big.txt":      {data: []byte(strings.Repeat("y\n", maxDiffFileBytes))},
	}, listed: map[string]map[string]sandbox.FileInfo{"/work": {
		"calc.py": {Name: "calc.py", Mode: 0o644}, "test_calc.py": {Name: "test_calc.py", Mode: 0o644},
		"conftest.py": {Name: "conftest.py", Mode: 0o644}, "blob.bin": {Name: "blob.bin", Mode: 0o644},
		"big.txt": {Name: "big.txt", Mode: 0o644}, "link": {Name: "link", Mode: fs.ModeSymlink, Link: "/etc"},
	}}}
	snap.skip("/work/link", trajectory.SkipUnsafe, `a symlink (to "/etc"): never followed or copied`)
	wd := diffOf(snap, task, "/work")
	status := map[string]string{}
	for _, f := range wd.Files {
		status[f.Path] = f.Status
	}
	want := map[string]string{"/work/calc.py": "modified", "/work/test_calc.py": "modified", "/work/conftest.py": "added",
		"/work/blob.bin": "added", "/work/big.txt": "modified", "/work/old.txt": "deleted", "/work/link": "unread"}
	for p, s := range want {
		if status[p] != s {
			t.Errorf("%s: %q, want %q (all: %v)", p, status[p], s, status)
		}
	}
	for _, w := range []string{"-    return a - b\n+    return a + b", "-assert add(2, 3) == 5\n+assert add(2, 3) != 5",
		"--- /dev/null\n+++ b/work/conftest.py", "Binary files /dev/null and b/work/blob.bin differ", "not diffed",
		"--- a/work/old.txt\n+++ /dev/null", "# /work/link: not read"} {
		if !strings.Contains(wd.Diff, w) {
			t.Errorf("diff lacks %q:\n%s", w, wd.Diff)
		}
	}
	if wd.Bytes != len(wd.Diff) || wd.Dropped != 0 {
		t.Errorf("bytes %d dropped %d", wd.Bytes, wd.Dropped)
	}
}
