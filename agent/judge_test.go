package agent_test

import (
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/judge"
	"github.com/rollbox/rollbox/agent/trajectory"
	"github.com/rollbox/rollbox/internal/fakejudge"
)

func fakeJudge(t *testing.T, model string, b fakejudge.Behavior) *fakejudge.Server {
	t.Helper()
	s, err := fakejudge.Start(fakejudge.Config{Model: model, Behavior: b})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// judgedCalcTask is calcTask with a composite of its tests (weight 2) and
// a judge reward of three rubrics (correctness sees the diff, weight 2;
// communication the answer; process the transcript) by two judges.
func judgedCalcTask(a, b string, extra string) string {
	return fmt.Sprintf(`{"id": "fix-add", "prompt": "The tests in /work fail. Fix the code.",
 "sandbox": {"backend": "wasm"},
 "files": {"/work/calc.py": "def add(a, b):\n    return a - b\n",
           "/work/test_calc.py": "from calc import add\nassert add(2, 3) == 5, 'add(2, 3) != 5'\nprint('ok')\n"},
 "reward": {"type": "composite", "parts": [
   {"name": "tests", "weight": 2, "reward": {"type": "tests", "command": "cd /work && python test_calc.py", "timeout_s": 60}},
   {"name": "judge", "weight": 1, "reward": {"type": "judge",
     "rubrics": [
       {"name": "correctness", "instructions": "Is the fix right and minimal?", "scale": [0, 10], "weight": 2, "sees": ["diff"]},
       {"name": "communication", "instructions": "Does the answer say what was done?", "scale": [{"label": "poor", "value": 0}, {"label": "ok", "value": 1}, {"label": "good", "value": 2}], "sees": ["answer"]},
       {"name": "process", "instructions": "Did the agent test before finishing?", "scale": [1, 5], "sees": ["transcript", "tool_outputs"], "tools": ["run_tests"]}],
     "judges": [{"name": "a", "base_url": %q, "model": "judge-a"}, {"name": "b", "base_url": %q, "model": "judge-b", "retries": 1}],
     "aggregate": {"judges": "mean"}}}]}%s,
 "limits": {"max_turns": 8}}`, a, b, extra)
}

var honestFix = []agent.Turn{
	calls("run_tests", `{}`),
	calls("edit", `{"path": "calc.py", "old_string": "a - b", "new_string": "a + b"}`),
	calls("run_tests", `{}`),
	calls("finish", `{"answer": "add subtracted; it adds now and the tests pass"}`),
}

// labelJudge answers JSON: a number on a numeric scale (from score, as a
// fraction of the scale), the best label on a labelled one.
func labelJudge(frac float64) fakejudge.Behavior {
	return func(r fakejudge.Request) fakejudge.Reply {
		if len(r.Labels) > 0 {
			return fakejudge.Reply{Text: fmt.Sprintf(`{"score": %q, "reason": "fine"}`, r.Labels[len(r.Labels)-1])}
		}
		return fakejudge.Reply{Text: fmt.Sprintf(`{"score": %v, "reason": "fine"}`, r.Min+frac*(r.Max-r.Min))}
	}
}

// textJudge answers prose with "Score: N/MAX" (labels: "Verdict: L").
func textJudge(frac float64) fakejudge.Behavior {
	return func(r fakejudge.Request) fakejudge.Reply {
		if len(r.Labels) > 0 {
			return fakejudge.Reply{Text: "The answer is clear.\nVerdict: " + r.Labels[len(r.Labels)-1]}
		}
		return fakejudge.Reply{Text: fmt.Sprintf("Looks reasonable.\nScore: %v/%v", r.Min+frac*(r.Max-r.Min), r.Max)}
	}
}

func TestAJudgeRewardScoresTheEpisodeOnEveryRubricByEveryJudge(t *testing.T) {
	a := fakeJudge(t, "judge-a", labelJudge(1))
	b := fakeJudge(t, "judge-b", textJudge(0.8))
	pool := judge.NewPool(judge.Options{})
	tr := runEpisode(t, loadTask(t, judgedCalcTask(a.URL(), b.URL(), "")), &turnsPolicy{turns: honestFix},
		func(c *agent.Config) { c.Judges = pool })
	r := tr.Reward
	if r == nil || r.Total == nil {
		t.Fatalf("unscored: %+v", r)
	}
	// correctness: a 1, b 0.8 → 0.9 (weight 2); communication: both
	// "good" → 1; process: a 1, b 0.8 → 0.9. Judge: (2·0.9+1+0.9)/4.
	wantJudge := (2*0.9 + 1 + 0.9) / 4
	if j := r.Components["judge"]; math.Abs(j-wantJudge) > 1e-9 || r.Components["tests"] != 1 {
		t.Errorf("components %v, want judge %v and tests 1", r.Components, wantJudge)
	}
	if math.Abs(*r.Total-(2*1+wantJudge)/3) > 1e-9 {
		t.Errorf("total %v, want %v", *r.Total, (2*1+wantJudge)/3)
	}
	for _, k := range []string{"judge.correctness", "judge.communication", "judge.process"} {
		if _, ok := r.Components[k]; !ok {
			t.Errorf("no component %s in %v", k, r.Components)
		}
	}
	j := r.Judge
	if j == nil || len(j.Judges) != 2 || len(j.Rubrics) != 3 || j.Calls != 6 {
		t.Fatalf("judge record %+v", j)
	}
	for _, js := range j.Judges {
		for _, rs := range js.Rubrics {
			s := rs.Samples[0]
			if s.Text == "" || s.Score == nil || s.Reason == "" || s.Usage == nil || s.Key == "" || s.Model != js.Model {
				t.Errorf("judge %s rubric %s sample %+v", js.Name, rs.Rubric, s)
			}
		}
	}
	// What the judges were shown: the diff of the fix, the answer, the
	// transcript with the run_tests outputs.
	asked := map[string]string{}
	for _, q := range a.Asked() {
		asked[q.Rubric] = q.Prompt
	}
	if p := asked["correctness"]; !strings.Contains(p, "+ return a + b") || !strings.Contains(p, "- return a - b") || strings.Contains(p, "run_tests") {
		t.Errorf("correctness prompt:\n%s", p)
	}
	if p := asked["communication"]; !strings.Contains(p, "it adds now") {
		t.Errorf("communication prompt:\n%s", p)
	}
	if p := asked["process"]; !strings.Contains(p, "[tool run_tests, exit 1") || !strings.Contains(p, "→ edit") {
		t.Errorf("process prompt:\n%s", p)
	}
	if w := r.Workspace; w == nil || len(w.Files) != 1 || w.Files[0] != (trajectory.WorkspaceFile{Path: "/work/calc.py", Status: "modified"}) {
		t.Errorf("workspace %+v", r.Workspace)
	}
	if m := tr.Monitors; m == nil || m.JudgeDisagreement == nil || *m.JudgeDisagreement != 0 || *m.TestTampering != 0 || *m.RepeatedCalls != 0 {
		t.Errorf("monitors of an honest episode %v", tr.Monitors.Values())
	}

	// The same episode again (replay) asks the judges nothing.
	before := a.Requests() + b.Requests()
	tr2 := runEpisode(t, loadTask(t, judgedCalcTask(a.URL(), b.URL(), "")), &turnsPolicy{turns: honestFix},
		func(c *agent.Config) { c.Judges = pool })
	if n := a.Requests() + b.Requests() - before; n != 0 || tr2.Reward.Judge.CacheHits != 6 || *tr2.Reward.Total != *r.Total {
		t.Errorf("a replay made %d judge requests (%d cache hits), total %v vs %v", n, tr2.Reward.Judge.CacheHits, *tr2.Reward.Total, *r.Total)
	}
}

func TestAJudgeThatFailsLeavesTheEpisodeUnscoredNotZero(t *testing.T) {
	for _, tt := range []struct {
		name string
		b    fakejudge.Behavior
	}{
		{"500s", fakejudge.Status(500)},
		{"garbage", fakejudge.Garbage()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			a := fakeJudge(t, "judge-a", labelJudge(1))
			b := fakeJudge(t, "judge-b", tt.b)
			tr := runEpisode(t, loadTask(t, judgedCalcTask(a.URL(), b.URL(), "")), &turnsPolicy{turns: honestFix})
			r := tr.Reward
			if tr.Termination.Reason != trajectory.EndFinished || r == nil || r.Total != nil || r.ErrorKind != trajectory.RewardJudgeError {
				t.Fatalf("end %s reward %+v", tr.Termination.Reason, r)
			}
			if _, ok := tr.Value(); ok {
				t.Error("Value says scored")
			}
			if r.Components["tests"] != 1 || r.Judge == nil || !strings.Contains(r.Judge.Error, "judge b") {
				t.Errorf("components %v judge error %q", r.Components, r.Judge.Error)
			}
			if b.Requests() != 3*2 { // three rubrics, two attempts each (retries 1)
				t.Errorf("judge b was asked %d times", b.Requests())
			}
			doc, _ := json.Marshal(tr)
			if !strings.Contains(string(doc), `"total":null`) || !strings.Contains(string(doc), `"error_kind":"judge_error"`) {
				t.Errorf("record: %.300s", doc[strings.Index(string(doc), `"reward"`):])
			}
		})
	}
}

func TestAJudgeCannotBeThePolicysOwnEndpoint(t *testing.T) {
	task := loadTask(t, judgedCalcTask("http://127.0.0.1:8000/v1/", "http://127.0.0.1:8001/v1", ""))
	err := agent.CheckJudges(task, trajectory.Policy{Kind: "openai", Endpoint: "http://127.0.0.1:8000/v1", Model: "judge-a"})
	if err == nil || !strings.Contains(err.Error(), "reward.parts[1].reward.judges[0]") {
		t.Errorf("err %v", err)
	}
	if err := agent.CheckJudges(task, trajectory.Policy{Kind: "openai", Endpoint: "http://127.0.0.1:8000/v1", Model: "policy"}); err != nil {
		t.Errorf("another model on the same server: %v", err)
	}
}
