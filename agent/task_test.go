package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func known(name string) bool {
	switch name {
	case "bash", "python", "read_file", "write_file", "edit", "run_tests", "finish":
		return true
	}
	return false
}

func TestReadTasksRefusesBadInputNamingLineAndField(t *testing.T) {
	good := `{"id": "ok", "prompt": "p", "reward": {"type": "exact", "answer": "4"}}`
	tests := []struct {
		name string
		file string
		want string
	}{
		{"a line that is not JSON", good + "\n{not json", "line 2: not valid JSON"},
		{"a missing id", `{"prompt": "p", "reward": {"type": "exact", "answer": "4"}}`, "line 1: id: required"},
		{"a misspelled reward type", `{"id": "fix-add", "prompt": "p", "reward": {"type": "tets"}}`, `line 1: task "fix-add": reward.type "tets" is not one of tests, exact, regex, fbeta, judge, composite`},
		{"an unknown field", `{"id": "a", "prompt": "p", "reward": {"type": "exact", "answer": "x"}, "limts": {}}`, `unknown field "limts"`},
		{"a wrongly typed field", `{"id": "a", "prompt": "p", "reward": {"type": "exact", "answer": "x"}, "limits": {"max_turns": "ten"}}`, "limits.max_turns: want an integer, got a string"},
		{"a workspace given as a path", `{"id": "a", "prompt": "p", "workspace": "ws", "reward": {"type": "exact", "answer": "x"}}`, `workspace: want an object, got a string`},
		{"tools given as one name", `{"id": "a", "prompt": "p", "tools": "bash", "reward": {"type": "exact", "answer": "x"}}`, `tools: want an array of strings, got a string`},
		{"a fractional count", `{"id": "a", "prompt": "p", "reward": {"type": "exact", "answer": "x"}, "limits": {"max_turns": 2.5}}`, `limits.max_turns: want an integer, got a number (2.5)`},
		{"a duplicate id", good + "\n" + good, `line 2: task id "ok" already used on line 1`},
		{"an unknown tool", `{"id": "a", "prompt": "p", "tools": ["bash", "rm_rf"], "reward": {"type": "exact", "answer": "x"}}`, `tools[1]: unknown tool "rm_rf"`},
		{"an invalid runtime", `{"id": "a", "prompt": "p", "sandbox": {"runtime": "kata"}, "reward": {"type": "exact", "answer": "x"}}`, `sandbox.runtime: "kata" is not one of runc, runsc`},
		{"tests without a command", `{"id": "a", "prompt": "p", "reward": {"type": "tests"}}`, "reward.command: required for type tests"},
		{"a relative file path", `{"id": "a", "prompt": "p", "files": {"x.py": ""}, "reward": {"type": "exact", "answer": "x"}}`, `files: "x.py" is not a clean absolute path`},
		{"a bad regex", `{"id": "a", "prompt": "p", "reward": {"type": "regex", "pattern": "("}}`, "reward.pattern: error parsing regexp"},
		{"an empty file", "\n\n", "no tasks"},
		{"a composite with a bad part", `{"id": "a", "prompt": "p", "reward": {"type": "composite", "parts": [{"weight": 1, "reward": {"type": "exact"}}]}}`, "reward.parts[0].reward.answer: required"},
		{"run_tests without a test command", `{"id": "a", "prompt": "p", "tools": ["run_tests"], "reward": {"type": "exact", "answer": "x"}}`, "run_tests needs a reward of type tests"},
		{"a must_pass without a report", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "pytest", "must_pass": ["t"]}}`, "reward.must_pass: needs reward.report"},
		{"must_fail without must_pass", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "pytest", "report": {"format": "pytest"}, "must_fail": ["c"]}}`, `reward.must_fail: needs must_pass`},
		{"a must_fail name that must pass", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "pytest", "report": {"format": "pytest"}, "must_pass": ["t", "c"], "must_fail": ["c"]}}`, `reward.must_fail[0]: "c" is also must_pass[1]`},
		{"a must_pass name given twice", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "pytest", "report": {"format": "pytest"}, "must_pass": ["t", "u", "t"]}}`, `reward.must_pass[2]: "t" already named at must_pass[0]`},
		{"an unknown report format", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "x", "report": {"format": "xunit"}}}`, `reward.report.format "xunit" is not one of junit, pytest, go-test-json, tap`},
		{"a junit report without a path", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "x", "report": {"format": "junit"}}}`, "reward.report.path: required for format junit"},
		{"a report path that is a task file", `{"id": "a", "prompt": "p", "files": {"/work/r.xml": "<testsuites/>"}, "reward": {"type": "tests", "command": "x", "report": {"format": "junit", "path": "/work/r.xml"}}}`, `reward.report.path: "/work/r.xml" is one of the task's files`},
		{"a bad editable glob", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "x", "editable": ["src/**", "*.py", "[x"]}}`, `reward.editable[2]: "[x" is not a glob`},
		{"a hidden test outside the writable directories", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "x", "hidden_tests": {"/etc/t.py": ""}}}`, `reward.hidden_tests["/etc/t.py"]: not under the workdir /work or /tmp`},
		{"a fraction score without a report", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "x", "score": "fraction"}}`, `reward.score: "fraction" needs reward.report`},
		{"an unknown score", `{"id": "a", "prompt": "p", "reward": {"type": "tests", "command": "x", "score": "most"}}`, `reward.score "most" is not one of all, fraction`},
		{"a bad must_pass in a composite part", `{"id": "a", "prompt": "p", "reward": {"type": "composite", "parts": [{"weight": 1, "reward": {"type": "tests", "command": "x", "report": {"format": "tap"}, "must_pass": [""]}}]}}`, "reward.parts[0].reward.must_pass[0]: empty test name"},
		{"a missing workspace", `{"id": "a", "prompt": "p", "workspace": {"from": "no/such/dir"}, "reward": {"type": "exact", "answer": "x"}}`, "workspace.from:"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ReadTasks(strings.NewReader(tt.file), "tasks.jsonl", known)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestReadTasksAppliesDefaultsAndResolvesWorkspaces(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "ws"), 0o755)
	os.WriteFile(filepath.Join(dir, "ws", "a.txt"), []byte("A"), 0o644)
	file := filepath.Join(dir, "tasks.jsonl")
	os.WriteFile(file, []byte(`{"id": "t1", "prompt": "p", "workspace": {"from": "ws"}, "reward": {"type": "tests", "command": "true"}}`+"\n"), 0o644)
	tasks, err := LoadTasks(file, known)
	if err != nil {
		t.Fatal(err)
	}
	tk := tasks[0]
	if tk.Limits.MaxTurns != DefaultMaxTurns || tk.Limits.MaxToolOutputBytes != DefaultMaxToolOutputBytes {
		t.Errorf("defaults not applied: %+v", tk.Limits)
	}
	if strings.Join(tk.Tools, ",") != "bash,read_file,write_file,edit,run_tests,finish" {
		t.Errorf("tools = %v", tk.Tools)
	}
	files, err := tk.SeedFiles("/work")
	if err != nil || len(files) != 1 || files[0].Path != "/work/a.txt" || string(files[0].Data) != "A" {
		t.Errorf("SeedFiles = %+v, %v", files, err)
	}
}

func TestTruncateKeepsHeadAndTailWithAMarker(t *testing.T) {
	tests := []struct {
		name  string
		text  string
		limit int
	}{
		{"short text is untouched", "hello", 100},
		{"long text is cut", strings.Repeat("a", 500) + "MIDDLE" + strings.Repeat("z", 500), 200},
		{"multi-byte runes are not split", strings.Repeat("é", 400), 101},
		{"invalid UTF-8 is made valid", "ok\xff\xfe" + strings.Repeat("x", 300), 120},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, dropped := Truncate(tt.text, tt.limit)
			if !strings.Contains(got, "truncated") && len(tt.text) > tt.limit {
				t.Errorf("no marker in %q", got)
			}
			if len(tt.text) <= tt.limit && dropped != 0 {
				t.Errorf("dropped %d of a short text", dropped)
			}
			if len(tt.text) > tt.limit {
				if len(got) > tt.limit+8 {
					t.Errorf("len %d exceeds the limit %d", len(got), tt.limit)
				}
				if got[:1] != strings.ToValidUTF8(tt.text, "\uFFFD")[:1] || got[len(got)-1] != tt.text[len(tt.text)-1] {
					t.Errorf("head or tail lost: %q", got)
				}
				if dropped <= 0 {
					t.Errorf("dropped = %d", dropped)
				}
			}
			if !strings.Contains(got, "\uFFFD") && strings.Contains(tt.text, "\xff") {
				t.Errorf("invalid UTF-8 survived: %q", got)
			}
		})
	}
}

func TestEveryExampleTaskFileIsValid(t *testing.T) {
	files, _ := filepath.Glob("../examples/*/*tasks.jsonl")
	if len(files) < 4 {
		t.Fatalf("example task files: %v", files)
	}
	for _, f := range files {
		if _, err := LoadTasks(f, nil); err != nil {
			t.Errorf("%v", err)
		}
	}
}
