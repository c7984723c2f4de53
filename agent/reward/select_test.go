package reward

import "testing"

func TestWhatTheVerifierTakesFromTheAgent(t *testing.T) {
	def := newSelection(Spec{Type: "tests", Command: "x"}, "/work")
	ed := newSelection(Spec{Type: "tests", Command: "x", Editable: []string{"src/**/*.py", "pyproject.toml"},
		HiddenTests: map[string]string{"/work/src/hidden_test.py": ""}}, "/work")
	tests := []struct {
		sel  selection
		path string
		take bool
	}{
		{def, "/work/calc.py", true},
		{def, "/work/pkg/util/helpers.py", true},
		{def, "/work/test_calc.py", false},
		{def, "/work/tests/helpers.py", false},
		{def, "/work/pkg/tests/deep/helpers.py", false},
		{def, "/work/calc_test.go", false},
		{def, "/work/conftest.py", false},
		{def, "/work/sub/conftest.py", false},
		{def, "/work/.pytest.ini", false},
		{def, "/work/pyproject.toml", false},
		{def, "/work/pkg/__pycache__/calc.cpython-311.pyc", false},
		{def, "/work/go.mod", false},
		{def, "/work/.local/lib/python3.11/site-packages/usercustomize.py", false},
		{def, "/work/Makefile", false},
		{ed, "/work/src/calc.py", true},
		{ed, "/work/src/a/b/calc.py", true},
		{ed, "/work/src/data.json", false},
		{ed, "/work/calc.py", false},
		{ed, "/work/pyproject.toml", true},
		{ed, "/work/src/hidden_test.py", false},
	}
	for _, tt := range tests {
		if got := tt.sel.why(tt.path) == ""; got != tt.take {
			t.Errorf("%s (editable %v): taken %v, want %v (%s)", tt.path, tt.sel.editable.globs, got, tt.take, tt.sel.why(tt.path))
		}
	}
	if !ed.want("/work/src", true) || !ed.want("/work/src/a", true) || ed.want("/work/docs", true) {
		t.Errorf("the walk under editable globs is not pruned to where they can match")
	}
	if def.want("/work/tests", true) || !def.want("/work/pkg", true) {
		t.Errorf("the walk does not skip protected directories")
	}
}

func TestPytestReadsTheTasksOwnConfiguration(t *testing.T) {
	tests := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"none", map[string]string{"/work/calc.py": ""}, ""},
		{"pyproject without a pytest section", map[string]string{"/work/pyproject.toml": "[project]\n"}, ""},
		{"pyproject with one", map[string]string{"/work/pyproject.toml": "[tool.pytest.ini_options]\n", "/work/setup.cfg": "[tool:pytest]\n"}, "/work/pyproject.toml"},
		{"pytest.ini first, even empty", map[string]string{"/work/pyproject.toml": "[tool.pytest.ini_options]\n", "/work/pytest.ini": ""}, "/work/pytest.ini"},
		{"the shallowest directory", map[string]string{"/work/repo/pytest.ini": "", "/work/repo/sub/pytest.ini": ""}, "/work/repo/pytest.ini"},
	}
	for _, tt := range tests {
		task := map[string][]byte{}
		for p, c := range tt.files {
			task[p] = []byte(c)
		}
		got, ok := pytestConfig(task, "/work")
		if (tt.want == "") == ok || got != tt.want {
			t.Errorf("%s: %q %v, want %q", tt.name, got, ok, tt.want)
		}
	}
}
