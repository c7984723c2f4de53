package trajectory

import (
	"encoding/json"
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
		Reward: &Reward{Total: 1, Components: map[string]float64{"tests": 1},
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
