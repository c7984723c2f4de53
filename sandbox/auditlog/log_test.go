package auditlog_test

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/rollbox/rollbox/sandbox"
	"github.com/rollbox/rollbox/sandbox/auditlog"
	"github.com/rollbox/rollbox/sandbox/wasm"
)

func open(t *testing.T, path string) *auditlog.Log {
	t.Helper()
	l, err := auditlog.Open(path, auditlog.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

func lines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.SplitAfter(strings.TrimSuffix(string(b), "\n"), "\n")
}

func records(t *testing.T, path string) []map[string]any {
	var out []map[string]any
	for _, l := range lines(t, path) {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("%q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func verify(path string) (auditlog.Summary, error) {
	f, err := os.Open(path)
	if err != nil {
		return auditlog.Summary{}, err
	}
	defer f.Close()
	return auditlog.Verify(f)
}

func TestEverySandboxCallIsRecordedAndChained(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := open(t, path)
	wb, err := wasm.New(ctx, wasm.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b := auditlog.Wrap(wb, l)
	defer b.Close()
	sb, err := b.Create(ctx, sandbox.Spec{Labels: map[string]string{sandbox.LabelEpisode: "ep-1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/work/a.txt", []byte("hello"), 0o644); err != nil {
		t.Fatal(err)
	}
	sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"cat", "/work/a.txt"}})
	big := "echo " + strings.Repeat("x", auditlog.InlineBytes)
	sb.Exec(ctx, sandbox.ExecRequest{Shell: big, Stdin: []byte("in")})
	sb.Exec(ctx, sandbox.ExecRequest{Shell: "exit 3"})
	sb.Close()
	sb.Close()

	recs := records(t, path)
	ops := []string{}
	for _, r := range recs {
		ops = append(ops, r["op"].(string))
		if r["episode"] != "ep-1" || r["backend"] != "wasm" || r["sandbox"] == "" {
			t.Errorf("record without its episode, backend or sandbox: %v", r)
		}
	}
	if got := strings.Join(ops, " "); got != "create write exec exec exec close" {
		t.Fatalf("ops %q", got)
	}
	if w := recs[1]; w["path"] != "/work/a.txt" || w["size"] != 5.0 || w["sha256"] != "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824" {
		t.Errorf("write record %v", w)
	}
	if e := recs[2]; fmt.Sprint(e["argv"]) != "[cat /work/a.txt]" || e["exit_code"] != 0.0 || e["stdout_bytes"] != 5.0 {
		t.Errorf("small exec record %v", e)
	}
	if e := recs[3]; e["shell"] != nil || e["input_sha256"] == nil || e["input_bytes"] != float64(len(big)) || e["stdin_sha256"] == nil {
		t.Errorf("a large command must be kept as its hash: %v", e)
	}
	if e := recs[4]; e["exit_code"] != 3.0 || e["shell"] != "exit 3" {
		t.Errorf("failing exec record %v", e)
	}
	s, err := verify(path)
	if err != nil || s.Lines != 6 || s.Execs != 3 || s.Writes != 1 || len(s.EpisodeIDs) != 1 {
		t.Fatalf("verify: %+v %v", s, err)
	}
	if recs[0]["prev"] != auditlog.Genesis {
		t.Errorf("first prev %v", recs[0]["prev"])
	}
}

// write appends n records and returns the log's lines.
func write(t *testing.T, path string, n int) []string {
	l := open(t, path)
	for i := range n {
		code := i
		if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Sandbox: "sb", Argv: []string{"step", fmt.Sprint(i)}, ExitCode: &code}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	return lines(t, path)
}

func TestTamperingIsDetectedAtTheFirstBadLine(t *testing.T) {
	rehash := func(line string) string { // an attacker who recomputes a line's own hash
		body := line[:strings.LastIndex(line, `,"hash":"`)] + "}"
		var r auditlog.Record
		json.Unmarshal([]byte(body), &r)
		b, _ := json.Marshal(r)
		return string(b[:len(b)-1]) + `,"hash":"` + sha(b) + `"}` + "\n"
	}
	tests := []struct {
		name   string
		tamper func(ls []string) []string
		line   int
		reason string
	}{
		{"an edited exit code", func(ls []string) []string {
			ls[2] = strings.Replace(ls[2], `"exit_code":2`, `"exit_code":0`, 1)
			return ls
		}, 3, "edited"},
		{"an edited line with its own hash recomputed", func(ls []string) []string {
			ls[2] = rehash(strings.Replace(ls[2], `"exit_code":2`, `"exit_code":0`, 1))
			return ls
		}, 4, "line before hashes"},
		{"a deleted line", func(ls []string) []string { return append(ls[:2], ls[3:]...) }, 3, "line before hashes"},
		{"the first line deleted", func(ls []string) []string { return ls[1:] }, 1, "genesis"},
		{"two lines swapped", func(ls []string) []string {
			ls[1], ls[2] = ls[2], ls[1]
			return ls
		}, 2, "line before hashes"},
		{"a torn last line", func(ls []string) []string {
			ls[4] = ls[4][:len(ls[4])/2]
			return ls
		}, 5, "torn"},
		{"a line that is not JSON", func(ls []string) []string {
			ls[1] = "garbage\n"
			return ls
		}, 2, "hash"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "audit.jsonl")
			ls := tt.tamper(write(t, path, 5))
			os.WriteFile(path, []byte(strings.Join(ls, "")), 0o600)
			_, err := verify(path)
			var ve *auditlog.VerifyError
			if !errors.As(err, &ve) || ve.Line != tt.line || !strings.Contains(ve.Reason, tt.reason) {
				t.Fatalf("verify = %v, want line %d (%s)", err, tt.line, tt.reason)
			}
		})
	}
}

func sha(b []byte) string { return fmt.Sprintf("%x", sha256.Sum256(b)) }

func TestTheChainContinuesAcrossRestarts(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	write(t, path, 3)
	write(t, path, 2) // a second process lifetime
	recs := records(t, path)
	if len(recs) != 5 || recs[3]["seq"] != 4.0 {
		t.Fatalf("records %v", recs)
	}
	if s, err := verify(path); err != nil || s.Lines != 5 {
		t.Fatalf("verify %+v %v", s, err)
	}
}

func TestATornLogIsNotAppendedTo(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	ls := write(t, path, 2)
	os.WriteFile(path, []byte(ls[0]+ls[1][:10]), 0o600)
	if _, err := auditlog.Open(path, auditlog.Options{}); err == nil || !strings.Contains(err.Error(), "torn") {
		t.Fatalf("Open of a torn log: %v", err)
	}
}

// Two Logs on one file stand for two processes: the flock and the re-read
// of the tail keep one chain.
func TestConcurrentWritersKeepOneChain(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	logs := []*auditlog.Log{open(t, path), open(t, path)}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l := logs[i%2]
			for j := range 50 {
				if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: fmt.Sprintf("w%d-%d", i, j)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s, err := verify(path); err != nil || s.Lines != 400 {
		t.Fatalf("verify %+v %v", s, err)
	}
}

func TestAnUnwritableLogFailsTheCall(t *testing.T) {
	ctx := context.Background()
	l, err := auditlog.Open(filepath.Join(t.TempDir(), "audit.jsonl"), auditlog.Options{Sync: auditlog.SyncNone})
	if err != nil {
		t.Fatal(err)
	}
	wb, _ := wasm.New(ctx, wasm.Options{})
	b := auditlog.Wrap(wb, l)
	defer b.Close()
	sb, err := b.Create(ctx, sandbox.Spec{})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close()
	l.Close()
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Shell: "true"}); !errors.Is(err, sandbox.ErrSandboxFailed) {
		t.Errorf("exec with a closed log: %v, want ErrSandboxFailed", err)
	}
	if err := sb.WriteFile(ctx, "/work/x", []byte("x"), 0o644); !errors.Is(err, sandbox.ErrSandboxFailed) {
		t.Errorf("write with a closed log: %v, want ErrSandboxFailed", err)
	}
}

// Two Logs (two processes) append to a log that rotates every few KB: no
// line is lost or duplicated, every rotated file verifies, and each new
// file seals the end of the one before it.
func TestARotatedLogKeepsEveryLineAndSealsTheFilesItRotated(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	opts := auditlog.Options{Sync: auditlog.SyncNone, MaxBytes: 4 << 10, Keep: 1000}
	var logs []*auditlog.Log
	for range 2 {
		l, err := auditlog.Open(path, opts)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		logs = append(logs, l)
	}
	const writers, each = 8, 60
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				if err := logs[i%2].Append(auditlog.Record{Op: auditlog.OpExec, Shell: fmt.Sprintf("w%d-%d", i, j)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	ents, _ := os.ReadDir(dir)
	files := rotatedFiles(path, len(ents))
	if len(files) < 10 {
		t.Fatalf("%d files for %d lines of 4 KB logs: %v", len(files), writers*each, ents)
	}
	sums, err := auditlog.VerifyFiles(files)
	if err != nil {
		t.Fatalf("verify: %v (%d files: %v)", err, len(files), ents)
	}
	seen := map[string]bool{}
	for _, f := range files {
		for _, r := range records(t, f) {
			if r["op"] == auditlog.OpExec {
				seen[r["shell"].(string)] = true
			}
		}
		if st, _ := os.Stat(f); st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v", f, st.Mode())
		}
	}
	if len(seen) != writers*each || sums[0].Rotated != nil || sums[1].Rotated == nil {
		t.Fatalf("%d distinct exec lines of %d; summaries %+v", len(seen), writers*each, sums[:2])
	}

	// The end of a rotated file cut off (or the order wrong) is found.
	old := files[len(files)-2]
	ls := lines(t, old)
	os.WriteFile(old, []byte(strings.Join(ls[:len(ls)-1], "")), 0o600)
	var fe *auditlog.FileError
	if _, err := auditlog.VerifyFiles(files); !errors.As(err, &fe) || fe.Path != path || !strings.Contains(err.Error(), "cut or edited") {
		t.Fatalf("a truncated rotated file: %v", err)
	}
}

// Only Keep rotated files stay.
func TestARotatedLogKeepsOnlyItsLastFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := auditlog.Open(path, auditlog.Options{Sync: auditlog.SyncNone, MaxBytes: 1 << 10, Keep: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for j := range 100 {
		if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: fmt.Sprintf("c%d", j)}); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(dir)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	if want := "audit.jsonl audit.jsonl.1 audit.jsonl.2"; strings.Join(names, " ") != want {
		t.Fatalf("files %v, want %s", names, want)
	}
	if _, err := auditlog.VerifyFiles([]string{path + ".2", path + ".1", path}); err != nil {
		t.Fatal(err)
	}
}

// An episode whose records span a rotation is one episode in the total of
// the files, not one per file.
func TestAnEpisodeAcrossARotationIsCountedOnce(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.jsonl")
	l, err := auditlog.Open(path, auditlog.Options{Sync: auditlog.SyncNone, MaxBytes: 1 << 10, Keep: 1000})
	if err != nil {
		t.Fatal(err)
	}
	for j := range 40 {
		if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Episode: fmt.Sprintf("ep-%d", j%3), Shell: fmt.Sprintf("cmd-%d", j)}); err != nil {
			t.Fatal(err)
		}
	}
	l.Close()
	ents, _ := os.ReadDir(dir)
	files := rotatedFiles(path, len(ents))
	if len(files) < 3 {
		t.Fatalf("%d files: the records did not rotate", len(files))
	}
	sums, err := auditlog.VerifyFiles(files)
	if err != nil {
		t.Fatal(err)
	}
	total := auditlog.Total(sums)
	if len(total.EpisodeIDs) != 3 || total.Execs != 40 || total.Head != sums[len(sums)-1].Head || !total.First.Equal(sums[0].First) {
		t.Fatalf("total of %d files: %d episodes (want 3), %d execs (want 40), head %q first %v", len(files), len(total.EpisodeIDs), total.Execs, total.Head, total.First)
	}
}

// rotatedFiles names a log at path and its n-1 rotated files, oldest first
// (PATH.n-1 ... PATH.1 PATH), as VerifyFiles takes them.
func rotatedFiles(path string, n int) []string {
	var files []string
	for i := n - 1; i >= 1; i-- {
		files = append(files, fmt.Sprintf("%s.%d", path, i))
	}
	return append(files, path)
}
