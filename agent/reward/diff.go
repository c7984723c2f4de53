package reward

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/textdiff"
)

// maxDiffLinesPerFile caps one file's part of a workspace diff; files over
// maxDiffFileBytes are named with their sizes, not diffed (a diff's cost
// grows with the file times its changes).
const (
	maxDiffLinesPerFile = 2000
	maxDiffFileBytes    = 512 << 10
)

// diffOf is the workspace as read against the task's files: every file
// read that differs (added or modified, whether a reward takes it or
// not), every task file under the workdir the agent deleted, and the
// paths listed but not read (symlinks, special files, over a bound). The
// diff keeps its head and tail within trajectory.MaxWorkspaceDiffBytes.
func diffOf(snap *snapshot, task map[string][]byte, workdir string) *trajectory.WorkspaceDiff {
	wd := &trajectory.WorkspaceDiff{Files: []trajectory.WorkspaceFile{}}
	var b strings.Builder
	for _, p := range snap.sortedFiles() {
		f := snap.files[p]
		old, fromTask := task[p]
		status, from := "modified", "a"+p
		if !fromTask {
			status, from = "added", "/dev/null"
		}
		wd.Files = append(wd.Files, trajectory.WorkspaceFile{Path: p, Status: status})
		b.WriteString(fileDiff(old, f.data, from, "b"+p))
	}
	var deleted []string
	for p := range task {
		if under(p, workdir) && snap.presence(p) == "absent" {
			deleted = append(deleted, p)
		}
	}
	sort.Strings(deleted)
	for _, p := range deleted {
		wd.Files = append(wd.Files, trajectory.WorkspaceFile{Path: p, Status: "deleted"})
		b.WriteString(fileDiff(task[p], nil, "a"+p, "/dev/null"))
	}
	for _, s := range snap.skipped {
		if s.Kind == trajectory.SkipUnsafe || s.Kind == trajectory.SkipBound || strings.Contains(s.Reason, "not read") {
			wd.Files = append(wd.Files, trajectory.WorkspaceFile{Path: s.Path, Status: "unread"})
			fmt.Fprintf(&b, "# %s: not read (%s)\n", s.Path, s.Reason)
		}
	}
	full := b.String()
	wd.Bytes = len(full)
	wd.Diff, wd.Dropped = judge.HeadTail(full, trajectory.MaxWorkspaceDiffBytes)
	return wd
}

// fileDiff is one file's unified diff; binary content is named, not shown.
func fileDiff(old, new []byte, from, to string) string {
	if binary(old) || binary(new) {
		return fmt.Sprintf("Binary files %s and %s differ\n", from, to)
	}
	if len(old) > maxDiffFileBytes || len(new) > maxDiffFileBytes {
		return fmt.Sprintf("--- %s\n+++ %s\n@@ %d bytes -> %d bytes: over %d bytes, not diffed @@\n", from, to, len(old), len(new), maxDiffFileBytes)
	}
	d := textdiff.UnifiedN(string(old), string(new), from, to, 3, maxDiffLinesPerFile)
	if d == "" && !bytes.Equal(old, new) {
		return fmt.Sprintf("--- %s\n+++ %s\n", from, to)
	}
	return d
}

func binary(b []byte) bool {
	return bytes.IndexByte(b, 0) >= 0 || !utf8.Valid(b)
}
