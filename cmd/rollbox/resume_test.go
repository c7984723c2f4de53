package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
)

// A `rollbox run` killed (SIGKILL: no summary, journals left) in the middle
// of its batch is continued by `rollbox run --resume`: what had ended is
// kept as it was, the running episodes' journals become interrupted records
// (their policy calls were spent), the never-started episodes run, nothing
// runs twice, and summary.json covers the whole batch. A second resume of
// the ended run, a resume with another task file or another group, and a
// resume of a directory a live run holds are refused, naming why.
func TestARunKilledMidwayIsResumedWithNothingLostOrRunTwice(t *testing.T) {
	t.Parallel() // its own directories and child processes
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl",
		`{"id": "quick", "prompt": "p", "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}}`+"\n"+
			`{"id": "slow", "prompt": "p", "sandbox": {"limits": {"exec_timeout_s": 120}}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}}`)
	script := func(name, slowCommand string) string {
		return writeFile(t, dir, name,
			`{"task_id": "quick", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`+"\n"+
				`{"task_id": "slow", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "`+slowCommand+`"}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
	}
	out := filepath.Join(dir, "out")
	// Concurrency 2: the three quick episodes end, two slow ones run (and
	// are killed), the third never starts.
	cmd, output := startRollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+script("slow.jsonl", "sleep 60"),
		"--group", "3", "--concurrency", "2", "--out", out)
	waitForCommands(t, out, 2)
	// The directory is the live run's: a resume is refused.
	if code, _, stderr := rollbox(t, "run", "--resume", out, "--tasks", tasks, "--policy", "scripted:"+script("quick.jsonl", "true")); code != 2 ||
		!strings.Contains(stderr, "still writing to it") {
		t.Errorf("resume of a live run: exit %d %s", code, stderr)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if _, err := os.Stat(filepath.Join(out, "summary.json")); err == nil {
		t.Fatalf("a killed run wrote its summary\n%s", output)
	}
	recorded := func() map[string]*trajectory.Trajectory {
		files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
		m := map[string]*trajectory.Trajectory{}
		for _, f := range files {
			tr, err := trajectory.Read(f)
			if err != nil {
				t.Fatal(err)
			}
			m[tr.TaskID+"."+string(rune('0'+tr.GroupIndex))] = tr
		}
		return m
	}
	if code, _, stderr := rollbox(t, "export", "--from", out, "--format", "jsonl", "--out", filepath.Join(dir, "x.jsonl")); code != 0 ||
		!strings.Contains(stderr, "3 episode(s) of") || !strings.Contains(stderr, "; 2 episode(s) not ended, not exported") {
		t.Errorf("export of the killed run: exit %d %s", code, stderr)
	}
	before := recorded()
	if len(before) != 3 || before["quick.0"] == nil || before["quick.2"] == nil {
		t.Fatalf("before the resume: %d records", len(before))
	}

	// Refused: another task file, another group.
	changed := writeFile(t, dir, "changed.jsonl", strings.Replace(mustRead(t, tasks), `"prompt": "p", "sandbox"`, `"prompt": "q", "sandbox"`, 1))
	if code, _, stderr := rollbox(t, "run", "--resume", out, "--tasks", changed, "--policy", "scripted:"+script("quick.jsonl", "true")); code != 2 ||
		!strings.Contains(stderr, "not the tasks the run") {
		t.Errorf("resume with a changed task: exit %d %s", code, stderr)
	}
	if code, _, stderr := rollbox(t, "run", "--resume", out, "--tasks", tasks, "--group", "4", "--policy", "scripted:"+script("quick.jsonl", "true")); code != 2 ||
		!strings.Contains(stderr, "--group 4: the run in") {
		t.Errorf("resume with another group: exit %d %s", code, stderr)
	}

	code, _, stderr := rollbox(t, "run", "--resume", out, "--tasks", tasks, "--policy", "scripted:"+script("quick.jsonl", "true"))
	if code != 0 || !strings.Contains(stderr, "concurrency 2,") || !strings.Contains(stderr, "5 of 6 episode(s) recorded (2 journal(s) of running episodes kept as interrupted records), 1 to run") {
		t.Fatalf("resume: exit %d\n%s", code, stderr)
	}
	after := recorded()
	if len(after) != 6 {
		t.Fatalf("after the resume: %d records", len(after))
	}
	for k, tr := range after {
		switch {
		case before[k] != nil && before[k].Termination.Reason == "finished":
			if tr.StartedAt != before[k].StartedAt || tr.Termination.Reason != "finished" {
				t.Errorf("%s ran again", k)
			}
		case k == "slow.0" || k == "slow.1":
			if tr.Termination.Reason != "interrupted" || tr.Reward != nil && tr.Reward.Total != nil {
				t.Errorf("%s: %+v reward %+v", k, tr.Termination, tr.Reward)
			}
		default:
			if k != "slow.2" || tr.Termination.Reason != "finished" || tr.Reward == nil || tr.Reward.Total == nil || *tr.Reward.Total != 1 {
				t.Errorf("%s: %+v", k, tr.Termination)
			}
		}
	}
	s := readSummary(t, out)
	if s.Interrupted || s.Planned != 6 || s.Episodes != 6 || s.Scored != 4 || s.Ends["finished"] != 4 || s.Ends["interrupted"] != 2 {
		t.Errorf("summary %+v", s)
	}
	var m runMarker
	if err := json.Unmarshal([]byte(mustRead(t, filepath.Join(out, "run.json"))), &m); err != nil || len(m.Resumed) != 1 {
		t.Errorf("run.json: %+v %v", m, err)
	}
	if code, _, stderr := rollbox(t, "run", "--resume", out, "--tasks", tasks, "--policy", "scripted:"+script("quick.jsonl", "true")); code != 2 ||
		!strings.Contains(stderr, "nothing to resume") {
		t.Errorf("resume of an ended run: exit %d %s", code, stderr)
	}
}

// A run stopped by SIGTERM (its summary says interrupted) is resumed too:
// the episode it interrupted stays interrupted, the one it never started
// runs, and the new summary is not interrupted.
func TestARunStoppedBySIGTERMIsResumed(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "slow", "prompt": "p", "sandbox": {"limits": {"exec_timeout_s": 120}}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}}`)
	script := func(name, command string) string {
		return writeFile(t, dir, name, `{"task_id": "slow", "turns": [{"tool_calls": [{"name": "bash", "arguments": {"command": "`+command+`"}}]}, {"tool_calls": [{"name": "finish", "arguments": {"answer": "x"}}]}]}`)
	}
	out := filepath.Join(dir, "out")
	cmd, output := startRollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+script("slow.jsonl", "sleep 60"), "--group", "2", "--concurrency", "1", "--out", out)
	waitForCommands(t, out, 1)
	cmd.Process.Signal(syscall.SIGTERM)
	cmd.Wait()
	if s := readSummary(t, out); cmd.ProcessState.ExitCode() != 143 || !s.Interrupted || s.Episodes != 1 {
		t.Fatalf("exit %d, summary %+v\n%s", cmd.ProcessState.ExitCode(), s, output)
	}
	if code, _, stderr := rollbox(t, "run", "--resume", out, "--tasks", tasks, "--policy", "scripted:"+script("quick.jsonl", "true")); code != 0 {
		t.Fatalf("resume: exit %d %s", code, stderr)
	}
	if s := readSummary(t, out); s.Interrupted || s.Episodes != 2 || s.Ends["interrupted"] != 1 || s.Ends["finished"] != 1 || s.Scored != 1 {
		t.Errorf("summary after the resume %+v", s)
	}
}

func mustRead(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
