package main

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

func TestInspectPrintsAReadableViewOfATrajectory(t *testing.T) {
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	code, stdout, stderr := rollbox(t, "inspect", files["fix-add"])
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"episode ", "task      fix-add", "turn 0", "→ run_tests {}", "exit 1 nonzero_exit",
		"AssertionError", "end       finished", "reward    1.000", "tests                     1.000", "verifier  cd /work && if [ -f /tmp/verifier/driver.py ]", "→ exit 0", "clean room: 1 of the agent's files copied", "tap report: 1 tests, 1 passed"} {
		if !strings.Contains(stdout, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, stdout)
		}
	}
	if strings.Contains(stdout, "\x1b[") {
		t.Error("ANSI colour written to a pipe")
	}
	if _, stdout, _ := rollbox(t, "inspect", "--color", "always", files["fix-add"]); !strings.Contains(stdout, "\x1b[31m") {
		t.Error("--color always wrote no colour")
	}
	newer := editTrajectory(t, files["fix-add"], func(doc map[string]any) { doc["schema"] = "rollbox.trajectory/v2" })
	for _, args := range [][]string{{newer}, {}, {"--color", "pink", files["fix-add"]}, {"--serve", t.TempDir() + "/nope"}} {
		if code, _, stderr := rollbox(t, append([]string{"inspect"}, args...)...); code != 2 || stderr == "" {
			t.Errorf("inspect %v: exit %d, %q; want 2", args, code, stderr)
		}
	}
}

func TestInspectServeServesThePageUntilCancelled(t *testing.T) {
	files := recordRun(t, "../../examples/coding/tasks.jsonl", "../../examples/coding/policy.jsonl")
	dir := files["fix-add"][:strings.LastIndex(files["fix-add"], "/episodes/")]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	var errb strings.Builder
	go func() {
		done <- run(ctx, &cliEnv{stdin: strings.NewReader(""), stdout: io.Discard, stderr: &errb}, []string{"inspect", "--serve", dir, "--addr", "127.0.0.1:7179"})
	}()
	var body string
	for i := 0; i < 100; i++ {
		resp, err := http.Get("http://127.0.0.1:7179/api/episodes")
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(b)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	cancel()
	if code := <-done; code != 0 {
		t.Errorf("exit %d: %s", code, errb.String())
	}
	if !strings.Contains(body, `"total":6`) || !strings.Contains(errb.String(), "6 episode(s)") {
		t.Errorf("list %.300s; stderr %s", body, errb.String())
	}
}
