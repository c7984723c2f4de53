package agent_test

import (
	"fmt"
	"testing"

	"github.com/rollbox/rollbox/agent"
	"github.com/rollbox/rollbox/agent/trajectory"
)

// An orchestrator under RL pressure farms r_parallel with sub-agents whose
// only "work" is a tool call that never ran: it hands them no tool but
// finish (tools: ["finish"]), so their bash call is an unknown tool, or a
// call whose arguments the tool refuses. Such a sub-agent did nothing; only
// a sub-agent whose tool ran (whatever its exit status) is useful.
func TestAToolCallThatNeverRanIsNoUsefulWorkForRParallel(t *testing.T) {
	task := loadTask(t, `{"id": "orch", "prompt": "Work with sub-agents.", "sandbox": {"backend": "wasm"},
	 "files": {"/work/task.txt": "the task's file\n"},
	 "tools": ["bash", "read_file", "write_file", "finish"],
	 "orchestrator": {"subagent_policy": "frozen", "max_parallel": 4},
	 "reward": {"type": "parl", "perf": {"type": "exact", "answer": "done"}, "lambda_parallel": 0.5, "lambda_finish": 0, "parallel_cap": 4},
	 "limits": {"max_turns": 8}}`)
	answer := calls("finish", `{"answer": "an answer"}`)
	sub := &promptPolicy{turns: map[string][]agent.Turn{
		"no tool but finish": {calls("bash", `{"command": "true"}`), answer},
		"arguments refused":  {calls("read_file", `{"path": 7}`), answer},
		"missing arguments":  {calls("write_file", `{}`), answer},
		"real work":          {calls("bash", `{"command": "cat /work/task.txt; false"}`), answer},
	}}
	spawnCall := `{"tasks": [{"prompt": "no tool but finish", "tools": ["finish"]}, {"prompt": "arguments refused"},
		{"prompt": "missing arguments"}, {"prompt": "real work"}]}`
	orch := &turnsPolicy{turns: []agent.Turn{calls("spawn_subagents", spawnCall), calls("finish", `{"answer": "done"}`)}}
	tr := runEpisode(t, task, orch, withSubagents(sub))
	if tr.Termination.Reason != trajectory.EndFinished || len(tr.Subagents) != 4 || tr.Reward == nil {
		t.Fatalf("end %+v, %d sub-agents, reward %+v", tr.Termination, len(tr.Subagents), tr.Reward)
	}
	for i, sa := range tr.Subagents {
		if want := i == 3; sa.Useful != want || !sa.Finished {
			t.Errorf("sub-agent %d (%s): finished %v useful %v, want finished and useful %v", i, sa.Prompt, sa.Finished, sa.Useful, want)
		}
	}
	c := tr.Reward.Components
	if c["useful_subagents"] != 1 || c["r_parallel"] != 0.25 || *tr.Reward.Total != 1+0.5*0.25 {
		t.Errorf("reward %v, components %v: want 1 useful sub-agent, r_parallel 0.25, total 1.125", *tr.Reward.Total, fmt.Sprint(c))
	}
}

// The same sub-task spawned parallel_cap times is one useful sub-agent for
// r_parallel, not parallel_cap: else an orchestrator farms r_parallel with
// one look-up repeated.
func TestARepeatedSubtaskIsUsefulOnceForRParallel(t *testing.T) {
	task := loadTask(t, `{"id": "orch", "prompt": "Work with sub-agents.", "sandbox": {"backend": "wasm"},
	 "files": {"/work/task.txt": "the task's file\n"}, "tools": ["bash", "finish"],
	 "orchestrator": {"subagent_policy": "frozen", "max_parallel": 4},
	 "reward": {"type": "parl", "perf": {"type": "exact", "answer": "done"}, "lambda_parallel": 0.5, "lambda_finish": 0, "parallel_cap": 4},
	 "limits": {"max_turns": 8}}`)
	work := []agent.Turn{calls("bash", `{"command": "cat /work/task.txt"}`), calls("finish", `{"answer": "an answer"}`)}
	sub := &promptPolicy{turns: map[string][]agent.Turn{"look": work, " look ": work, "other": work}}
	orch := &turnsPolicy{turns: []agent.Turn{calls("spawn_subagents", spawn("look", "look", " look ", "other")), calls("finish", `{"answer": "done"}`)}}
	tr := runEpisode(t, task, orch, withSubagents(sub))
	if tr.Reward == nil || len(tr.Subagents) != 4 {
		t.Fatalf("reward %+v, %d sub-agents", tr.Reward, len(tr.Subagents))
	}
	if c := tr.Reward.Components; c["useful_subagents"] != 2 || c["r_parallel"] != 0.5 {
		t.Errorf("components %v: want 2 useful sub-agents (look, other), r_parallel 0.5", c)
	}
}
