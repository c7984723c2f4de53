package trajectory

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

func validate(t *testing.T, doc []byte) {
	t.Helper()
	if err := Validate(doc); err != nil {
		t.Errorf("%v\n%s", err, doc)
	}
}

func TestAFullTrajectoryMatchesTheJSONSchema(t *testing.T) {
	code, kind := 1, "nonzero_exit"
	id := int64(7)
	ans := "4"
	now := time.Now().UTC()
	tr := Trajectory{
		Schema: Schema, EpisodeID: "e", RolloutID: "r", GroupID: "g", TaskID: "t", TaskHash: "h",
		Task: json.RawMessage(`{"id":"t"}`), StartedAt: now, EndedAt: &now,
		Sandbox: Sandbox{Backend: "docker", ImageDigest: "sha256:x", Limits: json.RawMessage(`{"cpus":1}`)},
		Policy:  Policy{Kind: "openai", Endpoint: "http://x", Model: "m", Sampling: json.RawMessage(`{}`)},
		Steps: []Step{
			{Type: StepModel, Content: "c", ToolCalls: []ToolCall{{ID: "1", Name: "bash", Arguments: `{"command":"x"}`, Parsed: json.RawMessage(`{"command":"x"}`)}},
				Usage: &Usage{PromptTokens: 1}, Logprobs: json.RawMessage(`[{"token":"a","token_id":7,"logprob":-0.1}]`), CompletionTokenIDs: []int64{id}},
			{Index: 1, Type: StepTool, Name: "bash", CallID: "1", Arguments: json.RawMessage(`"not json"`), ErrorKind: &kind, ExitCode: &code,
				Output: "o", Stdout: NewBytes([]byte{0xff}), Stderr: NewBytes([]byte("e"))},
		},
		ContextEvents: []ContextEvent{{Step: 1, Kind: "tool_output_truncated", Detail: "d"}},
		Termination:   &Termination{Reason: EndFinished, Answer: &ans},
		Reward: &Reward{Total: Score(1), Components: map[string]float64{"tests": 1},
			Verifier: &Verifier{Command: "pytest", Stdout: NewBytes([]byte("ok"))}},
		Stats: Stats{ToolErrors: map[string]int{"nonzero_exit": 1}},
		Group: &GroupStats{Size: 2, RewardMean: 0.5, Advantage: 0.5},
	}
	b, err := json.Marshal(tr)
	if err != nil {
		t.Fatal(err)
	}
	validate(t, b)
}

func TestTheSchemaRefusesAnIncompleteDocument(t *testing.T) {
	if Validate([]byte(`{"schema":"rollbox.trajectory/v1"}`)) == nil {
		t.Fatal("an incomplete document passed")
	}
}

func TestTheSchemaTakesJudgeRecordsMonitorsAndUnscoredRewards(t *testing.T) {
	zero, one, flag := 0, 2, true
	now := time.Now().UTC()
	base := func() Trajectory {
		return Trajectory{Schema: Schema, EpisodeID: "e", TaskID: "t", Task: json.RawMessage(`{}`), StartedAt: now,
			Steps: []Step{}, ContextEvents: []ContextEvent{}, Termination: &Termination{Reason: EndFinished},
			Stats: Stats{ToolErrors: map[string]int{}}}
	}
	judge := &Judge{Aggregate: "median", Rubrics: []JudgeRubric{{Name: "style", Weight: 1, Score: Score(0.5), ByJudge: map[string]float64{"a": 0.5},
		Views: []JudgeView{{Kind: "diff", Bytes: 100, Shown: 50, Dropped: 50}}}},
		Judges: []JudgeScores{{Name: "a", BaseURL: "http://j", Model: "m", Score: Score(0.5), Rubrics: []JudgeRubricScores{{Rubric: "style", Score: Score(0.5),
			Samples: []JudgeSample{{Key: "k", Raw: "5", Score: Score(0.5), Reason: "ok", Text: "Score: 5/10", Parse: "text", Usage: &Usage{TotalTokens: 3}, Attempts: 1}}}}}}}
	scored := base()
	scored.Reward = &Reward{Total: Score(0.5), Components: map[string]float64{"judge": 0.5}, Judge: judge,
		Workspace: &WorkspaceDiff{Files: []WorkspaceFile{{Path: "/work/a.py", Status: "modified"}}, Diff: "--- a\n+++ b\n", Bytes: 12}}
	scored.Monitors = &Monitors{TestTampering: &one, SingleSearchExit: &flag, RepeatedCalls: &zero}
	scored.Rescore = &Rescore{ID: "s1", Source: "episodes/e.json", SpecHash: "h", At: now}
	scored.Group = &GroupStats{Monitors: map[string]int{"test_tampering": 1}}
	unscored := base()
	unscored.Reward = Unscored(RewardJudgeError, nil, "the judge answered garbage")
	unscored.Reward.Judge = &Judge{Aggregate: "mean", Error: "garbage", Rubrics: []JudgeRubric{}, Judges: []JudgeScores{}}
	for name, tr := range map[string]Trajectory{"scored": scored, "unscored": unscored} {
		b, err := json.Marshal(tr)
		if err != nil {
			t.Fatal(err)
		}
		if name == "unscored" && !strings.Contains(string(b), `"total":null`) {
			t.Errorf("an unscored reward is written without a null total: %s", b)
		}
		validate(t, b)
	}
	for name, doc := range map[string]string{
		"a null total without an error kind": `{"total": null, "components": {}}`,
		"an error kind beside a total":       `{"total": 0, "error_kind": "judge_error", "components": {}}`,
		"an unknown error kind":              `{"total": null, "error_kind": "oops", "components": {}}`,
	} {
		tr := base()
		b, _ := json.Marshal(tr)
		b = []byte(strings.Replace(string(b), `"reward":null`, `"reward":`+doc, 1))
		if Validate(b) == nil {
			t.Errorf("%s passed", name)
		}
	}
}
