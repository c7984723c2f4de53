package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// snapshot reads every file under dir, by path.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			files[p] = string(b)
		}
		return nil
	})
	return files
}

func TestASecondRunIntoTheSameOutDirIsRefusedAndTheFirstIsUntouched(t *testing.T) {
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "t", "prompt": "p", "tools": ["finish"], "reward": {"type": "exact", "answer": "x"}}`)
	policy := writeFile(t, dir, "policy.jsonl", `{"task_id": "t", "turns": [{"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
	out := filepath.Join(dir, "out")
	args := []string{"run", "--tasks", tasks, "--policy", "scripted:" + policy, "--group", "2", "--out", out}
	if code, _, stderr := rollbox(t, args...); code != exitOK {
		t.Fatalf("first run: exit %d: %s", code, stderr)
	}
	first := readSummary(t, out)
	before := snapshot(t, out)
	if len(before) != 4 { // run.json, summary.json, two episodes
		t.Fatalf("the run wrote %d files: %v", len(before), before)
	}
	code, stdout, stderr := rollbox(t, args...)
	want := "--out " + out + ": it holds the run " + first.RolloutID + " (2 episode(s)); each run needs a directory of its own"
	if code != exitBadInput || stdout != "" || !strings.Contains(stderr, want) {
		t.Fatalf("second run: exit %d, stderr %q; want 2 and %q", code, stderr, want)
	}
	after := snapshot(t, out)
	if len(after) != len(before) {
		t.Fatalf("the refused run changed the files: %d, then %d", len(before), len(after))
	}
	for p, b := range before {
		if after[p] != b {
			t.Errorf("%s changed", p)
		}
	}

	// A directory holding anything else is refused too, and left alone.
	other := filepath.Join(dir, "other")
	os.MkdirAll(other, 0o755)
	os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o644)
	code, _, stderr = rollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--out", other)
	if code != exitBadInput || !strings.Contains(stderr, "it is not empty (notes.txt)") {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if ents, _ := os.ReadDir(other); len(ents) != 1 {
		t.Errorf("the refused run wrote into %s: %v", other, ents)
	}

	// Without --out, every run gets out/<its rollout id>/.
	dir = filepath.Join(dir, "cwd")
	os.Mkdir(dir, 0o755)
	t.Chdir(dir)
	for range 2 {
		if code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy); code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr)
		}
	}
	runs, _ := filepath.Glob(filepath.Join(dir, "out", "r*", "summary.json"))
	if len(runs) != 2 {
		t.Fatalf("two runs without --out wrote %v", runs)
	}
	ids := map[string]bool{}
	for _, r := range runs {
		s := readSummary(t, filepath.Dir(r))
		if filepath.Base(filepath.Dir(r)) != s.RolloutID || s.Episodes != 1 {
			t.Errorf("%s: %+v", r, s)
		}
		ids[s.RolloutID] = true
	}
	// export of out/ takes both runs, each episode with its own run.
	code, stdout, stderr = rollbox(t, "export", "--from", "out")
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != exitOK || len(lines) != 2 || !strings.Contains(stderr, "2 episode(s) of 2 run(s)") {
		t.Fatalf("export: exit %d, %d lines, stderr %q", code, len(lines), stderr)
	}
	for _, l := range lines {
		var tr struct {
			RolloutID string `json:"rollout_id"`
		}
		json.Unmarshal([]byte(l), &tr)
		if !ids[tr.RolloutID] {
			t.Errorf("exported an episode of run %q", tr.RolloutID)
		}
		delete(ids, tr.RolloutID)
	}
}

func TestOfTwoRunsClaimingOneEmptyDirOneWins(t *testing.T) {
	for range 20 {
		dir := filepath.Join(t.TempDir(), "out")
		var wg sync.WaitGroup
		var mu sync.Mutex
		won := 0
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := claimOutDir(dir, runMarker{RolloutID: "r" + string(rune('a'+i))}); err == nil {
					mu.Lock()
					won++
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if won != 1 {
			t.Fatalf("%d runs claimed %s", won, dir)
		}
	}
}

// startRollbox starts rollbox in a child process (TestMain), with its
// signal handling.
func startRollbox(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	js, _ := json.Marshal(args)
	cmd.Env = append(os.Environ(), "ROLLBOX_TEST_MAIN="+string(js))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, &out
}

// waitForCommands waits until n episodes of the run in out have recorded
// a model turn (their command then runs), or fails after a minute.
func waitForCommands(t *testing.T, out string, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		journals, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json.partial"))
		ready := 0
		for _, j := range journals {
			if b, _ := os.ReadFile(j); bytes.Contains(b, []byte(`"type":"model"`)) {
				ready++
			}
		}
		if ready >= n {
			time.Sleep(500 * time.Millisecond) // the commands start
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no %d episodes running in %s after a minute", n, out)
}

func TestAnInterruptedRunRecordsWhatRanAndExitsAsShellsExpect(t *testing.T) {
	for _, tt := range []struct {
		name    string
		backend string
		sig     syscall.Signal
		code    int
	}{
		{"SIGINT on wasm", "wasm", syscall.SIGINT, 130},
		{"SIGTERM on wasm", "wasm", syscall.SIGTERM, 143},
		{"SIGINT on docker", "docker", syscall.SIGINT, 130},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.backend == "docker" {
				needDocker(t)
			}
			dir := t.TempDir()
			tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "slow", "prompt": "p", "sandbox": {"backend": "`+tt.backend+`", "limits": {"exec_timeout_s": 120}}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}}`)
			policy := writeFile(t, dir, "policy.jsonl", `{"task_id": "slow", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60"}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
			out := filepath.Join(dir, "out")
			cmd, output := startRollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--group", "3", "--concurrency", "2", "--out", out)
			waitForCommands(t, out, 2)
			start := time.Now()
			cmd.Process.Signal(tt.sig)
			cmd.Wait()
			if code := cmd.ProcessState.ExitCode(); code != tt.code {
				t.Fatalf("exit %d, want %d\n%s", code, tt.code, output)
			}
			if took := time.Since(start); took > 30*time.Second {
				t.Errorf("the run took %v to stop", took)
			}
			s := readSummary(t, out)
			if !s.Interrupted || s.Planned != 3 || s.Started != 2 || s.Episodes != 2 || s.Ends["interrupted"] != 2 || s.ToolErrors["cancelled"] != 2 ||
				s.ToolErrors["timeout"] != 0 || s.RewardMean != nil || !strings.Contains(s.Message, "interrupted by SIG") {
				t.Fatalf("summary %+v", s)
			}
			files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
			if len(files) != 2 {
				t.Fatalf("%d trajectories: %v", len(files), files)
			}
			for _, f := range files {
				tr, err := trajectory.Read(f)
				if err != nil {
					t.Fatal(err)
				}
				last := tr.Steps[len(tr.Steps)-1]
				if tr.Termination.Reason != "interrupted" || last.Type != trajectory.StepTool || last.ErrorKind == nil || *last.ErrorKind != "cancelled" {
					t.Errorf("%s: ended %+v, last step %s %v %q", f, tr.Termination, last.Type, last.ErrorKind, last.Error)
				}
			}
		})
	}
}
