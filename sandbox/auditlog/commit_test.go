package auditlog_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/sandbox/auditlog"
)

// logFiles names the log at path and the files it rotated away, oldest
// first, as VerifyFiles takes them.
func logFiles(t *testing.T, path string) []string {
	t.Helper()
	var files []string
	for i := 1; ; i++ {
		if _, err := os.Stat(fmt.Sprintf("%s.%d", path, i)); err != nil {
			break
		}
		files = append([]string{fmt.Sprintf("%s.%d", path, i)}, files...)
	}
	return append(files, path)
}

// shells reads the shell of every exec line of the log's files, checking
// each file's chain and the seals between them. A torn last line (the
// process killed in its write) is left out: it was never acknowledged.
func shells(t *testing.T, path string) map[string]int {
	t.Helper()
	files := logFiles(t, path)
	last := files[len(files)-1]
	if b, err := os.ReadFile(last); err == nil && len(b) > 0 && b[len(b)-1] != '\n' {
		t.Logf("the last line is torn (%d bytes): left out", len(b)-strings.LastIndexByte(string(b), '\n')-1)
		os.WriteFile(last, b[:strings.LastIndexByte(string(b), '\n')+1], 0o600)
	}
	if _, err := auditlog.VerifyFiles(files); err != nil {
		t.Fatalf("verify %d files: %v", len(files), err)
	}
	seen := map[string]int{}
	for _, f := range files {
		for _, r := range records(t, f) {
			if r["op"] == auditlog.OpExec {
				seen[r["shell"].(string)]++
			}
		}
	}
	return seen
}

// Concurrent appends wait for their line to be durable, but share the
// fsync that makes it so (group commit): many lines, few fsyncs, one
// chain with every line once.
func TestConcurrentAppendsShareFsyncs(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l := open(t, path)
	const writers, each = 128, 10
	var wg sync.WaitGroup
	for i := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range each {
				if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: fmt.Sprintf("w%d-%d", i, j)}); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	syncs := auditlog.Syncs(l)
	l.Close()
	seen := shells(t, path)
	if len(seen) != writers*each {
		t.Fatalf("%d distinct lines, want %d", len(seen), writers*each)
	}
	for s, n := range seen {
		if n != 1 {
			t.Fatalf("%s written %d times", s, n)
		}
	}
	if syncs == 0 || syncs*2 > writers*each {
		t.Fatalf("%d fsyncs for %d lines from %d concurrent appenders: want at most one per two lines", syncs, writers*each, writers)
	}
	t.Logf("%d lines, %d fsyncs", writers*each, syncs)
}

// Appenders run while the log rotates and is closed under them: every
// append that returned nil is in the files, and nothing else is.
func TestCloseKeepsEveryAcknowledgedLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	l, err := auditlog.Open(path, auditlog.Options{MaxBytes: 16 << 10, Keep: 1000})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked := map[string]bool{}
	var wg sync.WaitGroup
	for i := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; ; j++ {
				s := fmt.Sprintf("w%d-%d", i, j)
				if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: s}); err != nil {
					if !strings.Contains(err.Error(), "closed") {
						t.Error(err)
					}
					return
				}
				mu.Lock()
				acked[s] = true
				mu.Unlock()
			}
		}()
	}
	for {
		time.Sleep(20 * time.Millisecond)
		mu.Lock()
		n := len(acked)
		mu.Unlock()
		if n >= 2000 {
			break
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: "late"}); err == nil {
		t.Fatal("an append after Close succeeded")
	}
	seen := shells(t, path)
	if len(logFiles(t, path)) < 3 {
		t.Fatalf("the log did not rotate")
	}
	for s := range acked {
		if seen[s] != 1 {
			t.Fatalf("acknowledged line %s is in the log %d times", s, seen[s])
		}
	}
	if len(seen) != len(acked) {
		t.Fatalf("%d lines in the log, %d acknowledged", len(seen), len(acked))
	}
}

// A process appending from many goroutines (rotating every 32 KB) is
// SIGKILLed: every line it acknowledged is in the log, whose files verify.
func TestACrashKeepsEveryAcknowledgedLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "AUDITLOG_CRASH_CHILD="+path)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	acked := map[string]bool{}
	br := bufio.NewReader(out)
	for len(acked) < 3000 {
		line, err := br.ReadString('\n')
		if err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			t.Fatalf("the child stopped after %d acknowledged lines: %v", len(acked), err)
		}
		acked[strings.TrimSuffix(line, "\n")] = true
	}
	cmd.Process.Signal(syscall.SIGKILL)
	for { // what it acknowledged before it died
		line, err := br.ReadString('\n')
		if err != nil {
			if err != io.EOF {
				t.Fatal(err)
			}
			break
		}
		acked[strings.TrimSuffix(line, "\n")] = true
	}
	cmd.Wait()
	seen := shells(t, path)
	if len(logFiles(t, path)) < 3 {
		t.Fatalf("the log did not rotate")
	}
	for s := range acked {
		if seen[s] != 1 {
			t.Fatalf("acknowledged line %s is in the log %d times (%d acknowledged, %d in the log)", s, seen[s], len(acked), len(seen))
		}
	}
	t.Logf("%d acknowledged, %d in the log", len(acked), len(seen))
	// The log is appended to again after the crash.
	l := open(t, path)
	if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: "after"}); err != nil {
		t.Fatal(err)
	}
}

// TestCrashChild is TestACrashKeepsEveryAcknowledgedLine's process to
// kill: it appends until killed and prints each acknowledged line.
func TestCrashChild(t *testing.T) {
	path := os.Getenv("AUDITLOG_CRASH_CHILD")
	if path == "" {
		return // run only as the child
	}
	l, err := auditlog.Open(path, auditlog.Options{MaxBytes: 32 << 10, Keep: 200})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	for i := range 32 {
		go func() {
			for j := 0; ; j++ {
				s := fmt.Sprintf("w%d-%d", i, j)
				if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: s}); err != nil {
					fmt.Fprintln(os.Stderr, err)
					os.Exit(1)
				}
				mu.Lock()
				os.Stdout.WriteString(s + "\n")
				mu.Unlock()
			}
		}()
	}
	select {}
}

// A process killed in a rotation between linking the full log to PATH.1
// and renaming the new one over PATH leaves PATH.1 and PATH one file: the
// next rotation does not keep it twice.
func TestARotationInterruptedAfterItsLinkIsCompleted(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.jsonl")
	write(t, path, 20)
	if err := os.Link(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	l, err := auditlog.Open(path, auditlog.Options{MaxBytes: 1 << 10, Keep: 10})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if err := l.Append(auditlog.Record{Op: auditlog.OpExec, Shell: "after"}); err != nil {
		t.Fatal(err)
	}
	files := logFiles(t, path)
	if len(files) != 2 {
		t.Fatalf("files %v, want PATH.1 and PATH", files)
	}
	if _, err := auditlog.VerifyFiles(files); err != nil {
		t.Fatal(err)
	}
}
