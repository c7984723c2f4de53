package agent_test

import (
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
)

// A Harbor-style verifier: the test script and its tests are hidden tests
// (copied into the verifier's fresh sandbox only), and the score is the
// reward file the script writes. Real WASM sandboxes.
func TestTheHarborReportScoresWhatTheTestScriptWrites(t *testing.T) {
	task := `{"id": "harbor-style", "prompt": "Write 42 into /work/answer.txt.", "sandbox": {"backend": "wasm"},
	 "reward": {"type": "tests", "command": "mkdir -p /tmp/harbor/logs/verifier && sh /tmp/harbor/tests/test.sh",
	   "report": {"format": "harbor", "path": "/tmp/harbor/logs/verifier"},
	   "hidden_tests": {"/tmp/harbor/tests/test.sh": "cd /tmp/harbor/logs/verifier\ncase \"$(cat /work/answer.txt)\" in\n42) echo 1 > reward.txt ;;\nhalf) echo '{\"reward\": 0.5, \"checks\": 2}' > reward.json ;;\n*) echo 0 > reward.txt ;;\nesac\n"}},
	 "limits": {"max_turns": 4}}`
	for _, tc := range []struct {
		name  string
		turns []agent.Turn
		want  float64
	}{
		{"a solution scores the reward file's 1", []agent.Turn{bash("echo 42 > /work/answer.txt"), finish}, 1},
		{"a wrong answer scores its 0", []agent.Turn{bash("echo 41 > /work/answer.txt"), finish}, 0},
		{"reward.json's reward is the score", []agent.Turn{bash("echo half > /work/answer.txt"), finish}, 0.5},
		{"a reward file planted by the agent is not the verifier's", []agent.Turn{
			bash("mkdir -p /tmp/harbor/logs/verifier /work/logs && echo 1 > /tmp/harbor/logs/verifier/reward.txt && echo 41 > /work/answer.txt"), finish}, 0},
		{"a test script the agent wrote is not run", []agent.Turn{
			bash("mkdir -p /tmp/harbor/tests && echo 'echo 1 > /tmp/harbor/logs/verifier/reward.txt' > /tmp/harbor/tests/test.sh && echo 7 > /work/answer.txt"), finish}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := runEpisode(t, loadTask(t, task), &turnsPolicy{turns: tc.turns})
			v, ok := tr.Value()
			if !ok || v != tc.want {
				t.Fatalf("reward %v (scored %v), want %v: %+v", v, ok, tc.want, tr.Reward)
			}
			if got := tr.Reward.Verifier.Report; got != "harbor" || tr.Reward.Verifier.Blame != "" {
				t.Errorf("verifier.report %q, blame %q: want harbor, no blame", got, tr.Reward.Verifier.Blame)
			}
			if tc.want == 0.5 && tr.Reward.Components["harbor.checks"] != 2 {
				t.Errorf("components %v: want reward.json's other numbers as harbor.*", tr.Reward.Components)
			}
		})
	}

	// No reward file at all: scored 0, with the reason.
	broken := `{"id": "harbor-broken", "prompt": "p", "sandbox": {"backend": "wasm"},
	 "reward": {"type": "tests", "command": "true", "report": {"format": "harbor", "path": "/tmp/harbor/logs/verifier"}}}`
	tr := runEpisode(t, loadTask(t, broken), &turnsPolicy{turns: []agent.Turn{finish}})
	if v, ok := tr.Value(); !ok || v != 0 || tr.Reward.Verifier.Blame == "" {
		t.Fatalf("reward %v %v, blame %q", v, ok, tr.Reward.Verifier.Blame)
	}
}

func TestTheHarborReportIsValidated(t *testing.T) {
	for _, tc := range []struct{ reward, want string }{
		{`{"type": "tests", "command": "x", "report": {"format": "harbor"}}`, "reward.report.path: required for format harbor"},
		{`{"type": "tests", "command": "x", "report": {"format": "harbor", "path": "/tmp/v"}, "must_pass": ["a"]}`, "reward.must_pass: format harbor names no test"},
		{`{"type": "tests", "command": "x", "report": {"format": "harbor", "path": "/tmp/v"}, "score": "fraction"}`, "reward.score: format harbor"},
		{`{"type": "tests", "command": "x", "report": {"format": "harbor", "path": "/etc/v"}}`, "not under the workdir"},
	} {
		_, err := agent.ParseTask([]byte(`{"id": "t", "prompt": "p", "reward": `+tc.reward+`}`), "", nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.reward, err, tc.want)
		}
	}
}
