package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakepolicy"
	"github.com/rollbox/rollbox/runtime"
	"github.com/rollbox/rollbox/sandbox"
)

func readSummary(t *testing.T, dir string) *runtime.Summary {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	var s runtime.Summary
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatal(err)
	}
	return &s
}

func TestRunTheExamplesOnTheEmbeddedDefault(t *testing.T) {
	out := t.TempDir()
	code, _, stderr := rollbox(t, "run", "--tasks", "../../examples/coding/tasks.jsonl",
		"--policy", "scripted:../../examples/coding/policy.jsonl", "--group", "2", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	s := readSummary(t, out)
	if s.Episodes != 12 || s.Ends["finished"] != 12 {
		t.Fatalf("summary %+v", s)
	}
	want := map[string]float64{"fix-add": 1, "fix-count-words": 1, "sum-of-squares": 1, "rig-the-tests": 0, "fix-fizzbuzz": 0, "find-the-port": 0}
	for task, r := range want {
		if got := s.Tasks[task]; got == nil || got.RewardMean == nil || *got.RewardMean != r {
			t.Errorf("task %s: %+v, want reward %v", task, got, r)
		}
	}
	files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
	if len(files) != 12 {
		t.Fatalf("%d trajectories", len(files))
	}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if err := trajectory.Validate(b); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
	for _, g := range s.Groups {
		if !g.ZeroVariance || len(g.Advantages) != 2 {
			t.Errorf("a deterministic script gives equal rewards in a group: %+v", g)
		}
	}
	if !strings.Contains(stderr, "[12/12]") {
		t.Errorf("no per-episode progress lines: %s", stderr)
	}
}

func TestRunRefusesBadInputBeforeStartingAnything(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	os.WriteFile(bad, []byte(`{"id": "a", "prompt": "p", "reward": {"type": "exact", "answer": "1"}}`+"\n"+`{"id": "b", "prompt": "p", "reward": {"type": "tets"}}`+"\n"), 0o644)
	good := "../../examples/coding/tasks.jsonl"
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"a task file with a bad line", []string{"--tasks", bad, "--policy", "scripted:../../examples/coding/policy.jsonl"}, `line 2: task "b": reward.type "tets"`},
		{"no policy", []string{"--tasks", good}, "--policy is required"},
		{"an unknown policy kind", []string{"--tasks", good, "--policy", "magic:x"}, `policy kind "magic"`},
		{"a script missing a task", []string{"--tasks", good, "--policy", "scripted:" + writeFile(t, dir, "p.jsonl", `{"task_id": "fix-add", "turns": [{"content": "x"}]}`)}, `no script for task "rig-the-tests"`},
		{"a bad backend", []string{"--tasks", good, "--policy", "scripted:x", "--backend", "vm"}, `--backend "vm"`},
		{"a bad group size", []string{"--tasks", good, "--policy", "scripted:x", "--group", "0"}, "--group 0"},
		{"negative fork spares", []string{"--tasks", good, "--policy", "scripted:x", "--fork-spares", "-1"}, "--fork-spares -1 is outside 0..256"},
		{"an openai URL that is not one", []string{"--tasks", good, "--policy", "openai:localhost:8000"}, "not an http(s) URL"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "out")
			code, _, stderr := rollbox(t, append([]string{"run", "--out", out}, tt.args...)...)
			if code != exitBadInput || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, stderr %q; want 2 and %q", code, stderr, tt.want)
			}
			if _, err := os.Stat(out); !os.IsNotExist(err) {
				t.Errorf("output written despite bad input")
			}
		})
	}
}

func writeFile(t *testing.T, dir, name, content string) string {
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// dockerAnswered: needDocker found the engine and the python image.
var dockerAnswered atomic.Bool

// needDocker skips without an engine and the python image, except under
// CI=true, where .ci/run has started the engine and built the images.
// Once a sandbox of the python image started, later tests do not start
// another to find out.
func needDocker(t *testing.T) {
	t.Helper()
	if dockerAnswered.Load() {
		return
	}
	ctx := context.Background()
	be, err := openDocker(ctx, os.Stderr, readConfig(os.Getenv))
	if err == nil {
		defer be.Close()
		var sb interface{ Close() error }
		sb, err = be.Create(ctx, sandbox.Spec{Image: "python"})
		if err == nil {
			sb.Close()
			dockerAnswered.Store(true)
			return
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("the docker engine and the python image are required under CI=true: %v", err)
	}
	t.Skipf("no docker engine or python image (run .ci/engine.sh and rollbox images build python): %v", err)
}

func TestRunTheDockerExamplesWithPytest(t *testing.T) {
	t.Parallel() // waits on its containers
	needDocker(t)
	out := t.TempDir()
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-cmd")
	code, _, stderr := rollbox(t, "run", "--tasks", "../../examples/coding/docker-tasks.jsonl",
		"--policy", "scripted:../../examples/coding/policy.jsonl", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	s := readSummary(t, out)
	if m := s.Tasks["fix-add-pytest"].RewardMean; m == nil || *m != 1 {
		t.Errorf("the real fix did not pass pytest: %+v", s.Tasks["fix-add-pytest"])
	}
	if m := s.Tasks["conftest-cheat"].RewardMean; m == nil || *m != 0 {
		t.Errorf("a planted conftest.py passed the verifier: %+v", s.Tasks["conftest-cheat"])
	}
	files, _ := filepath.Glob(filepath.Join(out, "episodes", "*conftest-cheat*.json"))
	tr, err := trajectory.Read(files[0])
	if err != nil {
		t.Fatal(err)
	}
	if tr.Sandbox.Backend != "docker" || !strings.HasPrefix(tr.Sandbox.ImageDigest, "sha256:") {
		t.Errorf("sandbox = %+v", tr.Sandbox)
	}
	v := tr.Reward.Verifier
	if v == nil || !v.CleanRoom || !slices.ContainsFunc(v.Skipped, func(s trajectory.Skip) bool { return s.Path == "/work/conftest.py" }) {
		t.Errorf("verifier = %+v, want the planted conftest.py left out of the clean room", tr.Reward.Verifier)
	}
	if v != nil && (v.Tests == nil || v.Tests.Total != 4 || len(v.Failing) == 0) {
		t.Errorf("verifier = %+v, want pytest's report of the 4 tests with the failing ones named", v)
	}
}

func TestRunAgainstAnOpenAICompatibleServer(t *testing.T) {
	srv, err := fakepolicy.Start(fakepolicy.Config{Responder: fakepolicy.BashThenFinish(2), ToolCallsAsText: true})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "echo", "prompt": "run true twice", "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "done"}}`)
	out := filepath.Join(dir, "out")
	code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "openai:"+srv.URL(), "--group", "3", "--out", out, "--temperature", "0.7")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	s := readSummary(t, out)
	if s.Episodes != 3 || s.RewardMean == nil || *s.RewardMean != 1 || s.Ends["finished"] != 3 {
		t.Fatalf("summary %+v", s)
	}
	files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
	tr, err := trajectory.Read(files[0])
	if err != nil {
		t.Fatal(err)
	}
	var sampling struct{ Temperature float64 }
	json.Unmarshal(tr.Policy.Sampling, &sampling)
	if tr.Policy.Kind != "openai" || tr.Policy.Model != "fake-model" || sampling.Temperature != 0.7 {
		t.Errorf("policy = %+v", tr.Policy)
	}
	m := tr.Steps[0]
	if !m.ToolCallsFromText || len(m.ToolCalls) != 1 || m.ToolCalls[0].Name != "bash" || m.Usage == nil || m.Usage.Estimated {
		t.Errorf("first model step = %+v", m)
	}
}

func TestARunWhosePolicyIsUnreachableEndsPolicyErrorUnscoredAndExits1(t *testing.T) {
	srv, err := fakepolicy.Start(fakepolicy.Config{Fault: fakepolicy.FailFirst(1000, fakepolicy.Fault{Status: 503, Message: "overloaded"})})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "t", "prompt": "p", "tools": ["finish"], "reward": {"type": "exact", "answer": "x"}}`)
	out := filepath.Join(dir, "out")
	code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "openai:"+srv.URL()+"#model=m", "--policy-retries", "2", "--out", out)
	// Every episode was recorded, but none could be scored: the run says
	// so with its status, and its summary has no mean to mistake for 0.
	if code != exitFailure || !strings.Contains(stderr, "no episode could be scored (ends policy_error=1)") {
		t.Fatalf("exit %d, want 1: %s", code, stderr)
	}
	s := readSummary(t, out)
	if s.Ends["policy_error"] != 1 || s.Scored != 0 || s.RewardMean != nil || s.PassRate != nil || s.Tasks["t"].RewardMean != nil {
		t.Fatalf("summary %+v", s)
	}
	b, _ := os.ReadFile(filepath.Join(out, "summary.json"))
	if !strings.Contains(string(b), `"reward_mean": null`) {
		t.Errorf("summary.json does not say reward_mean: null:\n%s", b)
	}
	if srv.Calls() != 3 {
		t.Errorf("%d calls, want 1 + 2 retries", srv.Calls())
	}
	if !strings.Contains(stderr, "overloaded") {
		t.Errorf("the server's message is not shown: %s", stderr)
	}
}

func TestTheRunSummaryCountsTruncatedStepsBesideErrorKinds(t *testing.T) {
	dir := t.TempDir()
	tasks := writeFile(t, dir, "tasks.jsonl", `{"id": "cut", "prompt": "p", "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "done"}, "limits": {"max_tool_output_bytes": 500}}`)
	policy := writeFile(t, dir, "p.jsonl", `{"task_id": "cut", "turns": [`+
		`{"tool_calls": [{"name": "bash", "arguments": {"command": "seq 1 3000; exit 2"}}]}, `+
		`{"tool_calls": [{"name": "bash", "arguments": {"command": "seq 1 3000"}}]}, `+
		`{"tool_calls": [{"name": "bash", "arguments": {"command": "exit 1"}}]}, `+
		`{"tool_calls": [{"name": "finish", "arguments": {"answer": "done"}}]}]}`)
	out := filepath.Join(dir, "out")
	code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--group", "2", "--out", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	s := readSummary(t, out)
	// Per episode: a nonzero_exit step that was cut, an output_truncated
	// step, a nonzero_exit step that was not.
	want := trajectory.Truncations{Total: 4, Tools: map[string]int{"bash": 4}}
	if s.Truncated.Total != want.Total || s.Truncated.Tools["bash"] != 4 || len(s.Truncated.Tools) != 1 ||
		s.ToolErrors["nonzero_exit"] != 4 || s.ToolErrors["output_truncated"] != 2 {
		t.Errorf("summary: truncated %+v, tool errors %v; want %+v beside nonzero_exit=4, output_truncated=2", s.Truncated, s.ToolErrors, want)
	}
	if !strings.Contains(stderr, "truncated 4 (bash=4)") {
		t.Errorf("the summary line does not count them: %s", stderr)
	}
}
