package inspect_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/inspect"
)

func episodeOf(t *testing.T, task string) *trajectory.Trajectory {
	t.Helper()
	for id, tr := range readRun(t, testRun(t)) {
		if tr.TaskID == task && strings.HasSuffix(id, ".0") {
			return tr
		}
	}
	t.Fatalf("no episode of %s", task)
	return nil
}

func TestTheTerminalViewShowsTurnsCallsTroubleAndTheReward(t *testing.T) {
	tests := []struct {
		task string
		want []string
	}{
		{"fix-add", []string{
			"episode r20260101T000000-viewer.fix-add.0", "task      fix-add", "sandbox   wasm",
			"turn 0", "Let me run the tests first.", "→ run_tests {}",
			"#1 run_tests {}  exit 1 nonzero_exit", "AssertionError", "#5 edit", "wrote /work/calc.py sha256:",
			"end       finished at step 9", `answer "fixed add"`,
			"reward    1.000  ████████████████████", "tests                     1.000",
			"verifier  cd /work && if [ -f /tmp/verifier/driver.py ]", "→ exit 0", "ok 1 - add and mul", "tap report: 1 tests, 1 passed",
		}},
		{"noisy-logs", []string{
			"output_truncated", "truncated", "bytes dropped", "[... output truncated:", "… ", "more lines …",
			"◆ tool_output_truncated", "timeout", "timed out", "bad_arguments", "unknown_tool", `unknown tool "grep"`,
			"reward    1.000",
		}},
		{"gives-up", []string{"end       policy_error at step 1", "the model server went away", "reward    none (not scored)"}},
		{"judged", []string{"reward    0.733", "judge.correct", "judges    0.733  mean over judges, 4 answer(s)", "spread 0.80",
			"correct                   0.600  ×2  a 1.00 · b 0.20", "b/correct#1  2/10 → 0.20  The answer hedges.", "a/tone#1  polite → 1.00",
			"monitors  judge_disagreement 1"}},
		{"judge-down", []string{"reward    none (unscored: judge_error)", "judges    unscored", "judge down, rubric correct, sample 1: HTTP 500",
			"down/correct#1  failed: HTTP 500"}},
		{"rig-the-tests", []string{"monitors  test_tampering 1 · repeated_calls 0"}},
	}
	for _, tt := range tests {
		t.Run(tt.task, func(t *testing.T) {
			var out bytes.Buffer
			inspect.Render(&out, episodeOf(t, tt.task), inspect.Options{Lines: 6})
			got := out.String()
			for _, w := range tt.want {
				if !strings.Contains(got, w) {
					t.Errorf("view lacks %q:\n%s", w, got)
				}
			}
			if strings.Contains(got, "\x1b[") {
				t.Error("colour without Options.Color")
			}
		})
	}
}

func TestColourMarksErrorsRedAndTruncationsYellow(t *testing.T) {
	var out bytes.Buffer
	inspect.Render(&out, episodeOf(t, "noisy-logs"), inspect.Options{Color: true, Lines: 6})
	got := out.String()
	for _, w := range []string{"\x1b[31m\x1b[1mtimeout", "\x1b[33m\x1b[1moutput_truncated", "\x1b[31m\x1b[1mbad_arguments"} {
		if !strings.Contains(got, w) {
			t.Errorf("no %q in\n%q", w, got)
		}
	}
}
