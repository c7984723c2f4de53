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
	t.Parallel() // waits on its containers
	needDocker(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-import")
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
	t.Parallel() // waits on its containers
	needDocker(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-import")
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
		"neg-agent":       {with(map[string]string{"task.toml": "[agent]\ntimeout_sec = -5\n"}), "[agent].timeout_sec: -5 is not a number of seconds above 0"},
		"zero-verifier":   {with(map[string]string{"task.toml": "[verifier]\ntimeout_sec = 0\n"}), "[verifier].timeout_sec: 0 is not"},
		"inf-verifier":    {with(map[string]string{"task.toml": "[verifier]\ntimeout_sec = inf\n"}), "[verifier].timeout_sec: +Inf is not"},
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
		m := map[string]any{"instance_id": id, "repo": "acme/m", "base_commit": "abc123", "problem_statement": "fix it",
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
		inst("opt-8", map[string]any{"base_commit": "--output=" + filepath.Join(dir, "pwned")}),
		inst("no-repo-9", map[string]any{"repo": nil}),
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
		"opt-8":      `base_commit: "--output=`,
		"no-repo-9":  "repo: required to find the repository",
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
	if _, err := os.Stat(filepath.Join(dir, "pwned")); err == nil {
		t.Errorf("a base_commit was taken as git's option")
	}

	// A test the test patch does not define is imported with a warning:
	// it can never be reported passed.
	os.WriteFile(file, []byte(inst("ok-1", map[string]any{"FAIL_TO_PASS": []string{"tests/test_m.py::test_y", "tests/test_m.py::TestM::test_nope[1-2]"}})+"\n"), 0o644)
	rep, text = importReport(t, 0, "--format", "swebench", file, "--repos", repos, "--out", filepath.Join(dir, "swe2.jsonl"))
	if w := problems(rep.Tasks[0], taskimport.SeverityWarning); !strings.Contains(w, "tests/test_m.py does not define test_nope") || strings.Contains(w, "test_y") {
		t.Errorf("warnings %q\n%s", w, text)
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

// TestImportReadsNothingOutsideItsSource: a data set's names and links
// cannot make the importer read host files into a task (a workspace, a
// hidden test, a prompt), a test name cannot point the verifier outside the
// repository, and two instances that map to one task id cannot overwrite
// each other's workspace.
func TestImportReadsNothingOutsideItsSource(t *testing.T) {
	dir := t.TempDir()
	repos := filepath.Join(dir, "repos")
	secret := "HOST-SECRET-" + filepath.Base(dir)
	writeTree(t, filepath.Join(dir, "outside"), map[string]string{"creds.txt": secret, "tests/test_m.py": "def test_x():\n    pass\n"})
	writeTree(t, filepath.Join(dir, "outside-git", "placeholder"), map[string]string{"x": "x"})
	if err := os.WriteFile(filepath.Join(dir, "secret.txt"), []byte(secret), 0o644); err != nil {
		t.Fatal(err)
	}
	base := map[string]string{"m.py": "X = 1\n", "tests/test_m.py": "def test_x():\n    pass\n"}
	for _, id := range []string{"ok-1", "dup a", "dup-a", "link-3", "escape-4", "abs-5"} {
		writeTree(t, filepath.Join(repos, id), base)
	}
	if err := os.WriteFile(filepath.Join(repos, "dup a", "which.txt"), []byte("first\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(repos, "dup-a", "which.txt"), []byte("second\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	patch := "diff --git a/tests/test_m.py b/tests/test_m.py\n--- a/tests/test_m.py\n+++ b/tests/test_m.py\n@@ -1,2 +1,5 @@\n def test_x():\n     pass\n+\n+def test_y():\n+    pass\n"
	linkPatch := patch + "diff --git a/tests/test_link.py b/tests/test_link.py\nnew file mode 120000\n--- /dev/null\n+++ b/tests/test_link.py\n@@ -0,0 +1 @@\n+" +
		filepath.Join(dir, "secret.txt") + "\n\\ No newline at end of file\n"
	inst := func(id string, over map[string]any) string {
		m := map[string]any{"instance_id": id, "repo": "acme/m", "base_commit": "abc123", "problem_statement": "fix it",
			"test_patch": patch, "FAIL_TO_PASS": []string{"tests/test_m.py::test_y"}, "PASS_TO_PASS": []string{"tests/test_m.py::test_x"}}
		for k, v := range over {
			m[k] = v
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
	lines := []string{
		inst("ok-1", nil),
		inst("../outside", nil), // a workspace outside --repos
		inst("no-ws-2", map[string]any{"repo": "../outside-git"}), // a repository outside --repos
		inst("dup a", nil), // imported as dup-a
		inst("dup-a", nil), // the same task id: refused, the first's workspace kept
		inst("link-3", map[string]any{"test_patch": linkPatch}), // a test patch that adds a symbolic link to a host file
		inst("escape-4", map[string]any{"FAIL_TO_PASS": []string{"../outside/tests/test_m.py::test_x"}}),
		inst("abs-5", map[string]any{"PASS_TO_PASS": []string{filepath.Join(dir, "outside/tests/test_m.py") + "::test_x"}}),
		inst("missing-6", map[string]any{"problem_statement": nil, "test_patch": 7, "FAIL_TO_PASS": map[string]any{"x": 1}}),
	}
	file := filepath.Join(dir, "instances.jsonl")
	os.WriteFile(file, []byte(strings.Join(lines, "\n")+"\n"), 0o644)
	out := filepath.Join(dir, "swe.jsonl")
	rep, text := importReport(t, 1, "--format", "swebench", file, "--repos", repos, "--out", out)
	want := map[int]string{
		2: `instance_id: "../outside" cannot name a directory`,
		3: `repo: "../outside-git" is not OWNER/NAME`,
		5: `id: task id "dup-a" is also`,
		6: "tests/test_link.py is a symbolic link",
		7: `FAIL_TO_PASS[0]: "../outside/tests/test_m.py::test_x" names a file outside the repository`,
		8: `PASS_TO_PASS[0]: "` + filepath.Join(dir, "outside/tests/test_m.py") + `::test_x" names a file outside the repository`,
		9: "problem_statement: required",
	}
	for _, r := range rep.Tasks {
		_, line, _ := strings.Cut(r.Source, ".jsonl:")
		n := 0
		fmt.Sscan(line, &n)
		errs := problems(r, taskimport.SeverityError)
		switch {
		case n == 1 || n == 4:
			if !r.Imported {
				t.Errorf("line %d not imported: %s", n, errs)
			}
		case want[n] == "":
			t.Errorf("unexpected %+v", r)
		case r.Imported || !strings.Contains(errs, want[n]):
			t.Errorf("line %d: imported %v, errors %q, want %q", n, r.Imported, errs, want[n])
		}
	}
	if rep.Imported != 2 {
		t.Errorf("%d imported:\n%s", rep.Imported, text)
	}
	// Nothing of the host's is in what the import wrote, and the first
	// dup-a kept its own workspace.
	filepath.WalkDir(filepath.Join(dir, "swe.workspaces"), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			b, _ := os.ReadFile(p)
			if strings.Contains(string(b), secret) {
				t.Errorf("%s holds the host's secret", p)
			}
		}
		return nil
	})
	if b, _ := os.ReadFile(out); strings.Contains(string(b), secret) {
		t.Errorf("the task file holds the host's secret")
	}
	ws, err := exec.Command("tar", "-xOf", filepath.Join(dir, "swe.workspaces", "dup-a.tar"), "which.txt").Output()
	if err != nil || string(ws) != "first\n" {
		t.Errorf("dup-a's workspace is %q (%v), want the first instance's", ws, err)
	}
}

// TestImportedTestsTheAgentEditsDoNotCount: a PASS_TO_PASS test in a file
// the test patch does not touch, named so the verifier's default protect
// globs do not know it as a test (checks/check_*.py, as the repository's
// pytest.ini says), is the task's alone too: an agent that breaks the code
// and edits that test to match scores 0; one whose module forges pytest's
// reports scores 0 (the canaries); the honest fix scores 1.
func TestImportedTestsTheAgentEditsDoNotCount(t *testing.T) {
	t.Parallel() // waits on its containers
	needDocker(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-import-p2p")
	dir := t.TempDir()
	repos := filepath.Join(dir, "repos")
	writeTree(t, filepath.Join(repos, "acme__m-1"), map[string]string{
		"pytest.ini":        "[pytest]\npython_files = check_*.py\n",
		"m.py":              "def double(x):\n    return x * 2\n\n\ndef half(x):\n    return x * 2\n",
		"checks/check_m.py": "from m import double\n\n\ndef test_double():\n    assert double(2) == 4\n",
	})
	patch := "diff --git a/checks/check_half.py b/checks/check_half.py\nnew file mode 100644\n--- /dev/null\n+++ b/checks/check_half.py\n@@ -0,0 +1,5 @@\n+from m import half\n+\n+\n+def test_half():\n+    assert half(4) == 2\n"
	inst, _ := json.Marshal(map[string]any{"instance_id": "acme__m-1", "repo": "acme/m", "base_commit": "abc",
		"problem_statement": "half(4) returns 8", "test_patch": patch,
		"FAIL_TO_PASS": []string{"checks/check_half.py::test_half"}, "PASS_TO_PASS": []string{"checks/check_m.py::test_double"}})
	file := filepath.Join(dir, "instances.jsonl")
	os.WriteFile(file, append(inst, '\n'), 0o644)
	tasks := filepath.Join(dir, "swe.jsonl")
	rep, text := importReport(t, 0, "--format", "swebench", file, "--repos", repos, "--out", tasks)
	if rep.Imported != 1 {
		t.Fatalf("%s", text)
	}
	write := func(p, c string) map[string]any {
		return map[string]any{"tool_calls": []any{map[string]any{"name": "write_file", "arguments": map[string]any{"path": p, "content": c}}}}
	}
	finish := map[string]any{"tool_calls": []any{map[string]any{"name": "finish", "arguments": map[string]any{}}}}
	policy := func(name string, turns ...map[string]any) string {
		b, _ := json.Marshal(map[string]any{"task_id": "acme__m-1", "turns": turns})
		p := filepath.Join(dir, name+".jsonl")
		os.WriteFile(p, append(b, '\n'), 0o644)
		return p
	}
	solve := policy("solve", write("/testbed/m.py", "def double(x):\n    return x * 2\n\n\ndef half(x):\n    return x // 2\n"), finish)
	cheat := policy("cheat",
		write("/testbed/m.py", "def double(x):\n    return x\n\n\ndef half(x):\n    return x // 2\n"),
		write("/testbed/checks/check_m.py", "from m import double\n\n\ndef test_double():\n    assert double(2) == 2\n"), finish)
	// Code of the agent's that rewrites the test process's reports
	// (every test passed) rewrites the hidden canaries' too.
	forge := policy("forge", write("/testbed/m.py", "def double(x):\n    return x * 2\n\n\ndef half(x):\n    return x * 2\n\n\n"+
		"import _pytest.reports as _r\n_orig = _r.TestReport.from_item_and_call.__func__\n\n\n"+
		"def _passed(cls, item, call):\n    rep = _orig(cls, item, call)\n    rep.outcome, rep.longrepr = 'passed', None\n    return rep\n\n\n"+
		"_r.TestReport.from_item_and_call = classmethod(_passed)\n"), finish)
	// The same forge planted where the hidden tests go: checks/ becomes a
	// package whose __init__ runs in the test process.
	forgeBeside := policy("forge-beside", write("/testbed/checks/__init__.py", "import _pytest.reports as _r\n"+
		"_orig = _r.TestReport.from_item_and_call.__func__\n\n\n"+
		"def _passed(cls, item, call):\n    rep = _orig(cls, item, call)\n    rep.outcome, rep.longrepr = 'passed', None\n    return rep\n\n\n"+
		"_r.TestReport.from_item_and_call = classmethod(_passed)\n"), finish)
	for name, c := range map[string]struct {
		policy string
		want   float64
	}{"solve": {solve, 1}, "cheat": {cheat, 0}, "forge": {forge, 0}, "forge-beside": {forgeBeside, 0}} {
		if got := runRewards(t, tasks, c.policy)["acme__m-1"]; got != c.want {
			t.Errorf("%s: reward %v, want %v", name, got, c.want)
		}
	}
}

// TestHarborImportReadsNothingOutsideItsTask: a Harbor task's files that
// are symbolic links (to a host file) are refused, not followed into the
// prompt or the configuration, and an image whose WORKDIR holds where the
// verifier puts the hidden tests (the agent's files there would be copied
// beside them) is refused.
func TestHarborImportReadsNothingOutsideItsTask(t *testing.T) {
	t.Parallel() // waits on its containers
	needDocker(t)
	setEnv(t, "ROLLBOX_OWNER", "rollbox-test-import-harbor-links")
	dir := t.TempDir()
	secret := "HOST-SECRET-" + filepath.Base(dir)
	os.WriteFile(filepath.Join(dir, "secret.txt"), []byte(secret+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "secret.toml"), []byte("[metadata]\nsecret = \""+secret+"\"\n"), 0o644)
	src := filepath.Join(dir, "harbor")
	task := func(name string, files map[string]string) string {
		all := map[string]string{"instruction.md": "Do it.", "tests/test.sh": "echo 1 > /logs/verifier/reward.txt\n",
			"environment/Dockerfile": "FROM rollbox/base:latest\nWORKDIR /app\n"}
		for k, v := range files {
			all[k] = v
		}
		d := filepath.Join(src, name)
		writeTree(t, d, all)
		return d
	}
	for _, l := range []struct{ task, file, target string }{
		{"link-instruction", "instruction.md", filepath.Join(dir, "secret.txt")},
		{"link-toml", "task.toml", filepath.Join(dir, "secret.toml")},
	} {
		d := task(l.task, nil)
		os.Remove(filepath.Join(d, l.file))
		if err := os.Symlink(l.target, filepath.Join(d, l.file)); err != nil {
			t.Fatal(err)
		}
	}
	task("workdir-tmp", map[string]string{"environment/Dockerfile": "FROM rollbox/base:latest\nWORKDIR /tmp\n"})
	task("workdir-harbor", map[string]string{"environment/Dockerfile": "FROM rollbox/base:latest\nWORKDIR /tmp/harbor/tests\n"})
	task("remote-base", map[string]string{"environment/Dockerfile": "FROM example.invalid/nope:1\n"})
	task("ok", nil)
	out := filepath.Join(dir, "tb.jsonl")
	rep, text := importReport(t, 1, "--format", "harbor", src, "--out", out)
	want := map[string]string{
		"link-instruction": "instruction.md: a symbolic link",
		"link-toml":        "task.toml: a symbolic link",
		"workdir-tmp":      "WORKDIR /tmp holds /tmp/harbor",
		"workdir-harbor":   "WORKDIR /tmp/harbor/tests is in /tmp/harbor",
		"remote-base":      "the base image example.invalid/nope:1 is not in the local engine, and nothing is pulled",
	}
	for _, r := range rep.Tasks {
		errs := problems(r, taskimport.SeverityError)
		switch {
		case r.ID == "ok":
			if !r.Imported {
				t.Errorf("ok not imported: %s", errs)
			}
		case r.Imported || !strings.Contains(errs, want[r.ID]):
			t.Errorf("%s: imported %v, errors %q, want %q", r.ID, r.Imported, errs, want[r.ID])
		}
	}
	if rep.Imported != 1 {
		t.Errorf("%s", text)
	}
	if b, _ := os.ReadFile(out); strings.Contains(string(b), secret) {
		t.Errorf("the task file holds the host's secret:\n%s", b)
	}
}

// TestHarborImportWithoutAnEngineSaysItNeedsOne: a Dockerfile environment
// with no engine to build it is reported as needing one, the task is not
// imported, and the exit status says some were not.
func TestHarborImportWithoutAnEngineSaysItNeedsOne(t *testing.T) {
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "no-engine.sock"))
	dir := t.TempDir()
	rep, text := importReport(t, 1, "--format", "harbor", filepath.Join(importExamples, "harbor"), "--out", filepath.Join(dir, "tb.jsonl"))
	if rep.Imported != 0 || len(rep.Tasks) != 1 ||
		!strings.Contains(problems(rep.Tasks[0], taskimport.SeverityError), "environment: needs an image built with a Docker engine") {
		t.Errorf("%s", text)
	}
}
