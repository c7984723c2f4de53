package testreport

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func statusOf(t *testing.T, r *Report, name string) Status {
	t.Helper()
	cs := r.Lookup(name)
	if len(cs) != 1 {
		t.Fatalf("%q matches %d cases in %+v", name, len(cs), r.Cases)
	}
	return cs[0].Status
}

func TestPytestJUnitNamesTestsByNodeID(t *testing.T) {
	// pytest 7.2 with -o junit_family=xunit1, as the verifier asks for it.
	xml := `<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="0" failures="1" skipped="1" tests="4">
<testcase classname="tests.test_calc" name="test_add" file="tests/test_calc.py" line="3" time="0.001" />
<testcase classname="tests.test_calc.TestNeg" name="test_neg[1-2]" file="tests/test_calc.py" line="9" time="0.001"><failure message="assert 1 == 2">x</failure></testcase>
<testcase classname="tests.test_calc" name="test_skip" file="tests/test_calc.py" line="12"><skipped type="pytest.skip" message="no">s</skipped></testcase>
<testcase classname="" name="tests.test_broken" file="tests/test_broken.py"><error message="collection failure">E</error></testcase>
</testsuite></testsuites>`
	r, err := Parse(Pytest, []byte(xml))
	if err != nil {
		t.Fatal(err)
	}
	if !r.Complete || len(r.Cases) != 4 {
		t.Fatalf("report %+v", r)
	}
	for name, want := range map[string]Status{
		"tests/test_calc.py::test_add":               Passed,
		"tests.test_calc::test_add":                  Passed,
		"tests/test_calc.py::TestNeg::test_neg[1-2]": Failed,
		"tests/test_calc.py::test_skip":              Skipped,
	} {
		if got := statusOf(t, r, name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	if c := r.Counts(); c != (Counts{Total: 4, Passed: 1, Failed: 2, Skipped: 1}) {
		t.Errorf("counts %+v", c)
	}
}

func TestMalformedReportsAreRefusedNotTrusted(t *testing.T) {
	for _, tt := range []struct{ format, data string }{
		{JUnit, ""},
		{JUnit, "<testsuites><testcase name='a'>"},
		{JUnit, "<html><testcase name='a'/></html>"},
		{GoTestJSON, "ok  \texample.com/x\t0.01s\n"},
		{"xml", "<testsuites/>"},
	} {
		if r, err := Parse(tt.format, []byte(tt.data)); err == nil {
			t.Errorf("%s %q parsed: %+v", tt.format, tt.data, r)
		}
	}
}

func TestTAPPlansMakeAnEarlyExitVisible(t *testing.T) {
	tests := []struct {
		name, data string
		complete   bool
		cases      int
	}{
		{"a full run", "1..3\nok 1 - add\nnot ok 2 - sub\nok 3 - mul # SKIP no mul\n", true, 3},
		{"the plan at the end", "ok 1 - add\nok 2\n1..2\n", true, 2},
		{"fewer results than planned", "1..3\nok 1 - add\n", false, 1},
		{"no plan", "ok 1 - add\n", false, 1},
		{"a bail-out", "1..2\nok 1 - add\nBail out! disk full\n", false, 1},
		{"output around the results", "building...\n1..1\n# diagnostic\nok 1 - add\nokay then\n", true, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := Parse(TAP, []byte(tt.data))
			if err != nil {
				t.Fatal(err)
			}
			if r.Complete != tt.complete || len(r.Cases) != tt.cases {
				t.Errorf("complete %v (%s), %d cases; want %v, %d", r.Complete, r.Problem, len(r.Cases), tt.complete, tt.cases)
			}
		})
	}
	r, _ := Parse(TAP, []byte("1..3\nok 1 - add\nnot ok 2 - sub\nok 3 - mul # SKIP\n"))
	if statusOf(t, r, "add") != Passed || statusOf(t, r, "sub") != Failed || statusOf(t, r, "mul") != Skipped || statusOf(t, r, "2") != Failed {
		t.Errorf("cases %+v", r.Cases)
	}
}

// TestGoTestJSONFromARealRun runs `go test -json` on a small module with a
// passing, a failing, a skipped and a sub-test, then one whose test binary
// exits in the middle.
func TestGoTestJSONFromARealRun(t *testing.T) {
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command")
	}
	dir := t.TempDir()
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("go.mod", "module example.com/calc\n\ngo 1.21\n")
	write("calc.go", "package calc\n\nfunc Add(a, b int) int { return a - b }\n")
	write("calc_test.go", `package calc

import (
	"os"
	"testing"
)

func TestZero(t *testing.T) { if Add(0, 0) != 0 { t.Fatal("zero") } }
func TestAdd(t *testing.T) { if Add(2, 3) != 5 { t.Fatal("add") } }
func TestSkip(t *testing.T) { t.Skip("later") }
func TestTable(t *testing.T) {
	t.Run("neg", func(t *testing.T) { if Add(-1, 1) != 0 { t.Fatal("neg") } })
}
func TestExit(t *testing.T) { if os.Getenv("EXIT") != "" { os.Exit(0) } }
`)
	run := func(env ...string) []byte {
		cmd := exec.Command(goBin, "test", "-json", "-count=1", ".")
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		out, _ := cmd.Output()
		return out
	}
	r, err := Parse(GoTestJSON, run())
	if err != nil {
		t.Fatal(err)
	}
	if !r.Complete {
		t.Fatalf("a finished run is incomplete: %s", r.Problem)
	}
	for name, want := range map[string]Status{
		"TestZero": Passed, "example.com/calc.TestAdd": Failed, "TestSkip": Skipped,
		"TestTable/neg": Failed, "example.com/calc.TestExit": Passed,
	} {
		if got := statusOf(t, r, name); got != want {
			t.Errorf("%s: %s, want %s", name, got, want)
		}
	}
	// os.Exit(0) inside a test: the binary stops, go test reports the
	// package failed, and the tests after it never ran.
	r, err = Parse(GoTestJSON, run("EXIT=1"))
	if err != nil {
		t.Fatal(err)
	}
	if st := statusOf(t, r, "TestExit"); st == Passed {
		t.Errorf("a test that exited the binary passed")
	}
	if len(r.Lookup("TestAdd")) != 1 || !strings.Contains(strings.Join(r.NotPassed(), " "), "TestExit") {
		t.Errorf("cases %+v", r.Cases)
	}
}

func TestGoTestJSONWithoutTheFinalEventIsIncomplete(t *testing.T) {
	data := `{"Action":"run","Package":"p","Test":"TestA"}
{"Action":"pass","Package":"p","Test":"TestA"}
{"Action":"run","Package":"p","Test":"TestB"}
`
	r, err := Parse(GoTestJSON, []byte(data))
	if err != nil {
		t.Fatal(err)
	}
	if r.Complete || statusOf(t, r, "TestB") != Unfinished {
		t.Errorf("report %+v", r)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(JUnit, `<testsuites><testsuite><testcase classname="a" name="b" file="a.py"/></testsuite></testsuites>`)
	f.Add(GoTestJSON, `{"Action":"pass","Package":"p","Test":"T"}`+"\n"+`{"Action":"pass","Package":"p"}`)
	f.Add(TAP, "1..2\nok 1 - a\nnot ok 2 b # TODO\n")
	f.Fuzz(func(t *testing.T, format, data string) {
		r, err := Parse(format, []byte(data))
		if err != nil {
			return
		}
		c := r.Counts()
		if c.Total != len(r.Cases) || c.Passed+c.Failed+c.Skipped != c.Total {
			t.Fatalf("counts %+v for %d cases", c, len(r.Cases))
		}
		for _, k := range r.Cases {
			if k.Name == "" && format != TAP {
				continue
			}
			if len(r.Lookup(k.Name)) == 0 {
				t.Fatalf("case %q cannot be looked up", k.Name)
			}
		}
	})
}
