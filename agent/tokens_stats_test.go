package agent_test

import (
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// The episode's token totals are what its steps show, estimated, reported
// or a mix, and say which.
func TestTheEpisodesTokenTotalsAreTheSumsItsStepsShow(t *testing.T) {
	bash := calls("bash", `{"command": "echo hi"}`)
	finish := calls("finish", `{"answer": "x"}`)
	reported := func(turn agent.Turn, p, c int64) agent.Turn {
		turn.Usage = &agent.Usage{PromptTokens: p, CompletionTokens: c, TotalTokens: p + c}
		return turn
	}
	for _, tt := range []struct {
		name  string
		turns []agent.Turn
		want  string
	}{
		{"a policy that reports no usage (scripted): estimated", []agent.Turn{bash, bash, finish}, trajectory.TokensEstimated},
		{"a server that reports usage: reported", []agent.Turn{reported(bash, 120, 7), reported(bash, 150, 9), reported(finish, 170, 4)}, trajectory.TokensReported},
		{"a server that reports it for some turns: mixed", []agent.Turn{reported(bash, 120, 7), bash, finish}, trajectory.TokensMixed},
	} {
		t.Run(tt.name, func(t *testing.T) {
			task := loadTask(t, `{"id": "t", "prompt": "say x", "sandbox": {"backend": "wasm"}, "tools": ["bash", "finish"], "reward": {"type": "exact", "answer": "x"}}`)
			tr := runEpisode(t, task, &turnsPolicy{turns: tt.turns})
			var prompt, completion int64
			for _, s := range tr.Steps {
				if s.Type == trajectory.StepModel {
					if s.Usage == nil {
						t.Fatalf("model step %d has no usage", s.Index)
					}
					prompt += s.Usage.PromptTokens
					completion += s.Usage.CompletionTokens
				}
			}
			if prompt == 0 || tr.Stats.PromptTokens != prompt || tr.Stats.CompletionTokens != completion || tr.Stats.Tokens != tt.want {
				t.Errorf("stats prompt %d completion %d tokens %q; the steps show prompt %d completion %d, want %q",
					tr.Stats.PromptTokens, tr.Stats.CompletionTokens, tr.Stats.Tokens, prompt, completion, tt.want)
			}
		})
	}
}
