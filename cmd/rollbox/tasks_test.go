package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/taskimport"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// The import data sets (examples/import): one Harbor task directory and
// three SWE-bench-style instances, each a small real Python project with a
// real failing test and its fix, run with scripted policies that solve,
// fail and cheat.
const importExamples = "../../examples/import"

// importReport runs `rollbox tasks import` and reads its JSON report.
func importReport(t *testing.T, wantCode int, args ...string) (*taskimport.Report, string) {
	t.Helper()
	reportFile := filepath.Join(t.TempDir(), "report.json")
	code, stdout, stderr := rollbox(t, append([]string{"tasks", "import", "--report", reportFile}, args...)...)
	if code != wantCode {
		t.Fatalf("tasks import %v: exit %d, want %d\n%s\n%s", args, code, wantCode, stdout, stderr)
	}
	b, err := os.ReadFile(reportFile)
	if err != nil {
		t.Fatal(err)
	}
	var rep taskimport.Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	return &rep, stdout
}

// runRewards runs a task file with a scripted policy and returns each
// task's reward.
func runRewards(t *testing.T, tasks, policy string) map[string]float64 {
	t.Helper()
	out := filepath.Join(t.TempDir(), "run")
	code, _, stderr := rollbox(t, "run", "--tasks", tasks, "--policy", "scripted:"+policy, "--out", out, "--concurrency", "4")
	if code != 0 {
		t.Fatalf("run %s with %s: exit %d: %s", tasks, policy, code, stderr)
	}
	files, _ := filepath.Glob(filepath.Join(out, "episodes", "*.json"))
	got := map[string]float64{}
	for _, f := range files {
		tr, err := trajectory.Read(f)
		if err != nil {
			t.Fatal(err)
		}
		v, ok := tr.Value()
		if !ok || tr.Termination.Reason != "finished" {
			t.Fatalf("%s: ended %s, unscored: %+v", tr.TaskID, tr.Termination.Reason, tr.Termination)
		}
		got[tr.TaskID] = v
	}
	return got
}

func problems(r *taskimport.Result, sev taskimport.Severity) string {
	var out []string
	for _, p := range r.Problems {
		if p.Severity == sev {
			out = append(out, p.Field+": "+p.Message)
		}
	}
	return strings.Join(out, "\n")
}

func TestImportedSWEBenchInstancesScoreSolveFailCheat(t *testing.T) {
	needDocker(t)
	t.Setenv("ROLLBOX_OWNER", "rollbox-test-import")
	dir := t.TempDir()
	repos := filepath.Join(dir, "repos")
	if out, err := exec.Command("bash", filepath.Join(importExamples, "swebench", "make-repos.sh"), repos).CombinedOutput(); err != nil {
		t.Fatalf("make-repos.sh: %v\n%s", err, out)
	}
	tasks := filepath.Join(dir, "swe.jsonl")
	rep, text := importReport(t, 0, "--format", "swebench", filepath.Join(importExamples, "swebench", "instances.jsonl"),
		"--repos", repos, "--out", tasks)
	t.Logf("the import report:\n%s", text)
	if rep.Imported != 3 || rep.Skipped != 0 {
		t.Fatalf("report %+v", rep)
	}
	for _, r := range rep.Tasks {
		if e := problems(r, taskimport.SeverityError) + problems(r, taskimport.SeverityWarning); e != "" {
			t.Errorf("%s: %s", r.ID, e)
		}
	}
	// The workspace is the base commit, without the test patch: the agent
	// never sees the new tests (they are hidden tests).
	all, err := os.ReadFile(tasks)
	if err != nil {
		t.Fatal(err)
	}
	var task struct {
		Workspace struct{ From string } `json:"workspace"`
		Reward    struct {
			HiddenTests map[string]string `json:"hidden_tests"`
			MustPass    []string          `json:"must_pass"`
		} `json:"reward"`
	}
	first, _, _ := strings.Cut(string(all), "\n")
	if err := json.Unmarshal([]byte(first), &task); err != nil {
		t.Fatal(err)
	}
	list, err := exec.Command("tar", "-tf", filepath.Join(dir, task.Workspace.From)).Output()
	if err != nil {
		t.Fatal(err)
	}
	ws, _ := exec.Command("tar", "-xOf", filepath.Join(dir, task.Workspace.From), "calc/ops.py").Output()
	if !strings.Contains(string(list), "tests/test_ops.py") || !strings.Contains(string(ws), "return a - b") {
		t.Errorf("the workspace is not the base commit (HEAD has the fix): %s\n%s", list, ws)
	}
	if h := task.Reward.HiddenTests["/testbed/tests/test_ops.py"]; !strings.Contains(h, "def test_add_negative") {
		t.Errorf("hidden tests %v", task.Reward.HiddenTests)
	}
	if fmt.Sprint(task.Reward.MustPass) != "[tests/test_ops.py::test_add tests/test_ops.py::test_add_negative tests/test_ops.py::test_mul]" {
		t.Errorf("must_pass %v", task.Reward.MustPass)
	}

	want := map[string]float64{"solve": 1, "fail": 0, "cheat": 0}
	for _, policy := range []string{"solve", "fail", "cheat"} {
		got := runRewards(t, tasks, filepath.Join(importExamples, "policies", policy+".jsonl"))
		for _, id := range []string{"acme__calc-1", "acme__textkit-2", "acme__intervals-3"} {
			if r, ok := got[id]; !ok || r != want[policy] {
				t.Errorf("policy %s, %s: reward %v (ran: %v), want %v", policy, id, r, ok, want[policy])
			}
		}
	}

	// Pass-rate scoring: the failing fixes pass some of the tests.
	fraction := filepath.Join(dir, "swe-fraction.jsonl")
	importReport(t, 0, "--format", "swebench", filepath.Join(importExamples, "swebench", "instances.jsonl"),
		"--repos", repos, "--out", fraction, "--score", "fraction")
	got := runRewards(t, fraction, filepath.Join(importExamples, "policies", "fail.jsonl"))
	for id, w := range map[string]float64{"acme__calc-1": 2.0 / 3, "acme__textkit-2": 2.0 / 3, "acme__intervals-3": 1.0 / 3} {
		if got[id] < w-1e-9 || got[id] > w+1e-9 {
			t.Errorf("fraction, %s: %v, want %v", id, got[id], w)
		}
	}
}

func TestImportedHarborTaskScoresSolveFailCheat(t *testing.T) {
	needDocker(t)
	t.Setenv("ROLLBOX_OWNER", "rollbox-test-import")
	dir := t.TempDir()
	tasks := filepath.Join(dir, "tb.jsonl")
	rep, text := importReport(t, 0, "--format", "harbor", filepath.Join(importExamples, "harbor"), "--out", tasks)
	t.Logf("the import report:\n%s", text)
	if rep.Imported != 1 || len(rep.Tasks) != 1 {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Tasks[0]
	if !strings.HasPrefix(r.Image, "docker:rollbox-import/fix-wordfreq:") || r.Workspace != "tb.workspaces/fix-wordfreq.tar" {
		t.Errorf("image %q, workspace %q", r.Image, r.Workspace)
	}
	notes := problems(r, taskimport.SeverityNote)
	for _, want := range []string{"capped to disk_mb 4096", "reference solution is not imported", "/app (2 files"} {
		if !strings.Contains(notes, want) {
			t.Errorf("notes lack %q:\n%s", want, notes)
		}
	}
	want := map[string]float64{"solve": 1, "fail": 0, "cheat": 0}
	for _, policy := range []string{"solve", "fail", "cheat"} {
		got := runRewards(t, tasks, filepath.Join(importExamples, "policies", policy+".jsonl"))
		if v, ok := got["fix-wordfreq"]; !ok || v != want[policy] {
			t.Errorf("policy %s: reward %v (ran: %v), want %v", policy, v, ok, want[policy])
		}
	}
	// A second import reuses the image the first built (content-addressed).
	rep2, _ := importReport(t, 0, "--format", "harbor", filepath.Join(importExamples, "harbor"), "--out", filepath.Join(dir, "again.jsonl"))
	if rep2.Tasks[0].Image != r.Image || !strings.Contains(problems(rep2.Tasks[0], taskimport.SeverityNote), "built by an earlier import") {
		t.Errorf("second import: %+v", rep2.Tasks[0])
	}
}

// writeTree writes files (path → content) under dir.
func writeTree(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for p, c := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestImportReportsWhatCannotBeMappedPerTask(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "harbor")
	ok := map[string]string{"instruction.md": "Do it.", "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
		"environment/Dockerfile": "FROM rollbox/base:latest\n"}
	with := func(extra map[string]string) map[string]string {
		m := map[string]string{}
		for k, v := range ok {
			m[k] = v
		}
		for k, v := range extra {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	cases := map[string]struct {
		files map[string]string
		want  string
	}{
		"gpus":            {with(map[string]string{"task.toml": "[environment]\ngpus = 1\n"}), "1 GPUs asked for"},
		"compose":         {with(map[string]string{"environment/docker-compose.yaml": "services: {}\n"}), "Docker Compose"},
		"no-test-script":  {with(map[string]string{"tests/test.sh": "", "tests/test_x.py": "def test(): pass\n"}), "tests/test.sh: missing"},
		"binary-test":     {with(map[string]string{"tests/data.bin": "\xff\xfe\x00"}), "tests/data.bin: not UTF-8"},
		"no-instruction":  {with(map[string]string{"instruction.md": "", "task.toml": "version = \"1.0\"\n"}), "instruction.md: open"},
		"no-environment":  {with(map[string]string{"environment/Dockerfile": ""}), "no environment"},
		"mcp":             {with(map[string]string{"task.toml": "[[environment.mcp_servers]]\nname = \"x\"\nurl = \"http://x\"\n"}), "MCP servers"},
		"tb1":             {map[string]string{"task.yaml": "instruction: x\n", "instruction.md": "x"}, "Terminal-Bench 1 format"},
		"bad-toml":        {with(map[string]string{"task.toml": "[verifier\n"}), "task.toml: "},
		"unknown-section": {with(map[string]string{"task.toml": "[steps]\nx = 1\n[environment]\ngpus = 2\n"}), "task.toml steps.x: not mapped"},
	}
	for name, c := range cases {
		writeTree(t, filepath.Join(src, name), c.files)
	}
	writeTree(t, filepath.Join(src, "not-a-task"), map[string]string{"README.md": "x"})
	// Without an engine the tasks above fail on their own problems first;
	// with one they must still not be imported.
	rep, text := importReport(t, 1, "--format", "harbor", src, "--out", filepath.Join(dir, "tb.jsonl"))
	if rep.Imported != 0 || rep.Skipped != len(cases)+1 {
		t.Fatalf("report: %d imported, %d skipped\n%s", rep.Imported, rep.Skipped, text)
	}
	for _, r := range rep.Tasks {
		c, ok := cases[r.ID]
		if r.ID == "not-a-task" {
			c, ok = struct {
				files map[string]string
				want  string
			}{nil, "not a Harbor task"}, true
		}
		if !ok {
			t.Errorf("unexpected task %s", r.ID)
			continue
		}
		all := problems(r, taskimport.SeverityError) + "\n" + problems(r, taskimport.SeverityWarning)
		if r.Imported || problems(r, taskimport.SeverityError) == "" || !strings.Contains(all, c.want) {
			t.Errorf("%s: imported %v, problems %q, want an error and %q", r.ID, r.Imported, all, c.want)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "tb.jsonl")); err != nil || len(b) != 0 {
		t.Errorf("the task file holds %q (%v), want it empty", b, err)
	}

	// SWE-bench instances that cannot be verified as SWE-bench means them.
	repos := filepath.Join(dir, "repos")
	writeTree(t, filepath.Join(repos, "ok-1"), map[string]string{"m.py": "X = 1\n", "tests/test_m.py": "def test_x():\n    pass\n"})
	patch := "diff --git a/tests/test_m.py b/tests/test_m.py\n--- a/tests/test_m.py\n+++ b/tests/test_m.py\n@@ -1,2 +1,5 @@\n def test_x():\n     pass\n+\n+def test_y():\n+    pass\n"
	inst := func(id string, over map[string]any) string {
		m := map[string]any{"instance_id": id, "repo": "acme/m", "base_commit": "abc", "problem_statement": "fix it",
			"test_patch": patch, "FAIL_TO_PASS": `["tests/test_m.py::test_y"]`, "PASS_TO_PASS": []string{"tests/test_m.py::test_x"}}
		for k, v := range over {
			if v == nil {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	lines := []string{
		inst("ok-1", nil),
		inst("django-2", map[string]any{"FAIL_TO_PASS": `["test_y (tests.test_m.MTest)"]`}),
		inst("no-tests-3", map[string]any{"FAIL_TO_PASS": "[]"}),
		inst("no-repo-4", nil),
		inst("ok-1-copy", map[string]any{"test_patch": strings.ReplaceAll(patch, "def test_x", "def test_z")}),
		`{"repo": "x"}`,
		`not json`,
	}
	writeTree(t, filepath.Join(repos, "ok-1-copy"), map[string]string{"m.py": "X = 1\n", "tests/test_m.py": "def test_x():\n    pass\n"})
	file := filepath.Join(dir, "instances.jsonl")
	os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	rep, text = importReport(t, 1, "--format", "swebench", file, "--repos", repos, "--out", filepath.Join(dir, "swe.jsonl"))
	want := map[string]string{
		"django-2":   "is not a pytest node id",
		"no-tests-3": "FAIL_TO_PASS: required",
		"no-repo-4":  `no repository for "acme/m"`,
		"ok-1-copy":  "test_patch: does not apply to the base commit",
	}
	imported := 0
	for _, r := range rep.Tasks {
		switch {
		case r.ID == "ok-1":
			if !r.Imported {
				t.Errorf("ok-1 not imported: %s", problems(r, taskimport.SeverityError))
			}
			imported++
		case want[r.ID] != "":
			if r.Imported || !strings.Contains(problems(r, taskimport.SeverityError), want[r.ID]) {
				t.Errorf("%s: errors %q, want %q", r.ID, problems(r, taskimport.SeverityError), want[r.ID])
			}
		case strings.HasSuffix(r.Source, ":6"):
			if r.Imported || !strings.Contains(problems(r, taskimport.SeverityError), "instance_id: required") {
				t.Errorf("line 6: %+v", r)
			}
		case strings.HasSuffix(r.Source, ":7"):
			if r.Imported || !strings.Contains(problems(r, taskimport.SeverityError), "not a JSON object") {
				t.Errorf("line 7: %+v", r)
			}
		default:
			t.Errorf("unexpected %+v", r)
		}
	}
	if imported != 1 || rep.Imported != 1 || rep.Skipped != len(lines)-1 {
		t.Errorf("%d imported, %d skipped:\n%s", rep.Imported, rep.Skipped, text)
	}
}

func TestTasksImportRefusesBadInputWithExit2(t *testing.T) {
	dir := t.TempDir()
	exists := filepath.Join(dir, "exists.jsonl")
	os.WriteFile(exists, []byte("keep me\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--format", "tbench", "x", "--out", "o"}, `--format "tbench" is not one of harbor, swebench`},
		{[]string{"--format", "harbor", importExamples + "/harbor"}, "--out FILE.jsonl is required"},
		{[]string{"--format", "harbor", filepath.Join(dir, "missing"), "--out", filepath.Join(dir, "o.jsonl")}, "no such file"},
		{[]string{"--format", "harbor", importExamples + "/harbor", "--out", exists}, "exists: choose another --out, or --force"},
		{[]string{"--format", "swebench", importExamples + "/swebench/instances.jsonl", "--out", filepath.Join(dir, "o.jsonl"), "--score", "most"}, `--score "most"`},
		{[]string{"--format", "harbor", dir, "--out", filepath.Join(dir, "o.jsonl")}, "holds no Harbor task"},
	} {
		code, _, stderr := rollbox(t, append([]string{"tasks", "import"}, c.args...)...)
		if code != exitBadInput || !strings.Contains(stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", c.args, code, stderr, c.want)
		}
	}
	if b, _ := os.ReadFile(exists); string(b) != "keep me\n" {
		t.Errorf("an existing --out was overwritten: %q", b)
	}
}
