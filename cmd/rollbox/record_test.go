package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
)

// TestMain lets a test run `rollbox` in a child process (the test binary
// itself, with ROLLBOX_TEST_MAIN set), to see what the process does as a
// whole: its exit status, a crash.
func TestMain(m *testing.M) {
	if args := os.Getenv("ROLLBOX_TEST_MAIN"); args != "" {
		var notice atomic.Pointer[string]
		ctx, sig, stop := withSignals(context.Background(), os.Stderr, &notice)
		env := &cliEnv{stdin: os.Stdin, stdout: os.Stdout, stderr: os.Stderr, signal: sig, stopNotice: &notice, self: testSelf, ownProcess: true}
		var argv []string
		if err := json.Unmarshal([]byte(args), &argv); err != nil {
			panic(err)
		}
		code := run(ctx, env, argv)
		stop()
		os.Exit(code)
	}
	code := m.Run()
	if exampleRunsDir != "" {
		os.RemoveAll(exampleRunsDir)
	}
	os.Exit(code)
}

// testSelf is cliEnv.self for tests: this test binary, which runs rollbox
// with args (TestMain).
func testSelf(args ...string) (*exec.Cmd, error) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	js, _ := json.Marshal(args)
	cmd.Env = append(os.Environ(), "ROLLBOX_TEST_MAIN="+string(js))
	return cmd, nil
}

// rollboxProcess runs rollbox with args in a child process.
func rollboxProcess(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	js, _ := json.Marshal(args)
	cmd.Env = append(os.Environ(), "ROLLBOX_TEST_MAIN="+string(js))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	var ee *exec.ExitError
	if err != nil && !errors.As(err, &ee) {
		t.Fatal(err)
	}
	return cmd.ProcessState.ExitCode(), out.String()
}

// smallDisk mounts a tmpfs of size bytes at dir (a disk that fills up), or
// skips when this process may not mount (fails instead under CI=true).
func smallDisk(t *testing.T, dir string, size int) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("mounting a small tmpfs (needs root) is required under CI=true: %v", err)
		}
		t.Skipf("cannot mount a small tmpfs to fill (needs root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
}

func TestARunWhoseRecordCannotBeWrittenExits1WithASummary(t *testing.T) {
	dir := t.TempDir()
	out := filepath.Join(dir, "out")
	// The episodes go to a disk of 64 KiB: the small episode fits, the big
	// one's first step (a 256 KiB write_file) does not.
	smallDisk(t, filepath.Join(out, "episodes"), 64<<10)
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "small", "prompt": "p", "tools": ["finish"], "reward": {"type": "exact", "answer": "x"}}
{"id": "big", "prompt": "p", "tools": ["write_file", "finish"], "reward": {"type": "exact", "answer": "x"}}`)
	big := strings.Repeat("a", 256<<10)
	policy := writeFile(t, dir, "policy.jsonl", `{"task_id": "small", "turns": [{"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}
{"task_id": "big", "turns": [{"tool_calls": [{"name": "write_file", "arguments": {"path": "/work/big", "content": "`+big+`"}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
	code, stderr := rollboxProcess(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--concurrency", "1", "--out", out)
	if code != exitFailure {
		t.Fatalf("exit %d, want %d (a runtime failure, not bad input): %s", code, exitFailure, stderr)
	}
	s := readSummary(t, out)
	if s.Episodes != 2 || s.Ends["finished"] != 1 || s.Ends["record_error"] != 1 || s.Scored != 1 {
		t.Fatalf("summary %+v, want the finished episode and the record_error one, unscored", s)
	}
	if !strings.Contains(stderr, "no space left on device") {
		t.Errorf("the write failure is not named: %s", stderr)
	}
}
